#!/usr/bin/env bash
# One device call for everything outside the kernel's own sweep: every gpu-marked test outside
# tests/kernels (cuBLASLt vs emulated on the Llama shape set, GPU property tests, GPU load paths),
# then the end-to-end Llama-3-8B-shaped benchmark. Logs go to $OUT (or ./out).
#   bash scripts/gpu_check.sh
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
timeout 300 python3 -P -m pytest -q -m gpu tests --ignore=tests/kernels -p no:cacheprovider -rs --durations=8 2>&1 \
  | tail -n 60 | tee "$OUT/gpu-tests.txt"
timeout 240 python3 -P benchmarks/e2e_llama.py --layers 4 --seq 2048 --reps 10 \
  --json "$OUT/e2e-llama8b-$(date +%Y%m%d).json" 2>&1 | tail -n 30 | tee "$OUT/e2e.txt"
