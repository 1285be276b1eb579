#!/usr/bin/env bash
# One device call that produces every GPU result the issues ask for, full logs in $OUT:
#   kernel tests (tests/kernels), every other gpu-marked test, the compute-sanitizer sweep,
#   and the end-to-end Llama-3-8B-shaped benchmark. Run the GEMM benchmark separately:
#   python3 -P benchmarks/gemm.py --rep 25 --rounds 3 --out "$OUT"
#   bash scripts/gpu_check.sh                 (all stages)
#   GPU_CHECK_STAGES="tests sanitize" bash scripts/gpu_check.sh   (a subset: tests, sanitize, e2e)
#   GPU_TEST_ARGS="--ignore=tests/kernels"   (extra pytest arguments)
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# Installed (editable if the image's setuptools allows, else a plain install); python -P keeps the
# source folder off sys.path so that fp8_linear.calibration / fp8_linear.kernels resolve as installed.
{ python3 -m pip install --no-deps --no-build-isolation -e . || python3 -m pip install --no-deps --no-build-isolation . ; } > "$OUT/pip.txt" 2>&1
tail -n 2 "$OUT/pip.txt"
python3 -P -c "import fp8_linear.calibration, fp8_linear.kernels, fp8_linear.checkpoint; print('imports ok')" || exit 1
export FP8_LINEAR_CACHE=${FP8_LINEAR_CACHE:-$PWD/.fp8_cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
STAGES=${GPU_CHECK_STAGES:-tests sanitize e2e}
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
if has tests; then
  # -rA: one PASSED/FAILED line per test in the log, so every result is on record.
  timeout 420 python3 -P -m pytest -m gpu tests -p no:cacheprovider -rA --durations=8 ${GPU_TEST_ARGS:-} > "$OUT/gpu-tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.txt" | tail -n 40
fi
if has sanitize; then
  timeout 480 bash benchmarks/sanitize.sh > "$OUT/sanitize.txt" 2>&1; grep -E "rc=|all clean|ERRORS" "$OUT/sanitize.txt"
fi
if has e2e; then
  timeout 240 python3 -P benchmarks/e2e_llama.py --layers 4 --seq 2048 --reps 10 \
    --json "$OUT/e2e-llama8b-$(date +%Y%m%d).json" > "$OUT/e2e.txt" 2>&1; tail -n 8 "$OUT/e2e.txt"
fi
