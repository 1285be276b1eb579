#!/usr/bin/env bash
# Every GPU check of the project in one device call, within a time budget (logs in $OUT):
# install, build the sm90 kernel in the background while the GPU tests that need no kernel run, then the
# kernel tests, the remaining gpu-marked tests, a compute-sanitizer sweep of the block-scale paths, and
# quick benchmarks (block GEMM, end to end, calibration on the GPU, MoE) with the time that is left.
# Each stage has its own timeout and one summary line in $OUT/summary.txt; the build cache goes back as
# $OUT/cache.tgz (unpack it into .fp8_cache and carry it to skip the next build).
#   bash scripts/gpu_check.sh [total seconds, default 500]
#   GPU_CHECK_STAGES="kernels gpu_tests" bash scripts/gpu_check.sh      (a subset, by stage name)
set -u
cd "$(dirname "$0")/.."
TOTAL=${1:-500}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export FP8_LINEAR_CACHE=${FP8_LINEAR_CACHE:-$PWD/.fp8_cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
STAGES=${GPU_CHECK_STAGES:-all}
left() { echo $((TOTAL - SECONDS)); }
stage() {  # stage NAME SECONDS CMD...: CMD under a timeout capped by the time left, log in $OUT/NAME.log
  local name=$1 want=$2; shift 2
  case " $STAGES " in *" all "*|*" $name "*) ;; *) return;; esac
  local t=$(( want < $(left) - 5 ? want : $(left) - 5 ))
  if [ "$t" -le 5 ]; then echo "$name: skipped (no time left)" | tee -a "$OUT/summary.txt"; return; fi
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? at ${SECONDS}s: $(grep -E 'passed|failed|error' "$OUT/$name.log" | tail -n 1)" | tee -a "$OUT/summary.txt"
}
python -m pip install --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
if ! python -c "import fp8_linear.kernels, fp8_linear.calibration" > "$OUT/import.log" 2>&1; then
  echo "install: fp8_linear.kernels not importable" | tee -a "$OUT/summary.txt"; tail -n 30 "$OUT/install.log" "$OUT/import.log"; exit 3
fi
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  git log -1 --format='commit %h %cd' 2>/dev/null; } > "$OUT/gpu.txt" 2>&1
( timeout $((TOTAL - 30)) python -c "from fp8_linear.kernels import jit; jit.load()" > "$OUT/build.log" 2>&1
  echo "build rc=$? at ${SECONDS}s" >> "$OUT/build.log" ) &
BUILD=$!
PT="python -m pytest -q -p no:cacheprovider -m gpu -rfE"
stage cublaslt_tests 100 $PT tests/core/backends/test_cublaslt_gpu.py tests/core/test_fused_quant_gpu.py
wait $BUILD; tail -n 1 "$OUT/build.log" | tee -a "$OUT/summary.txt"
stage kernels 150 $PT tests/kernels
stage gpu_tests 120 $PT tests --ignore=tests/kernels --ignore=tests/core/backends/test_cublaslt_gpu.py \
  --ignore=tests/core/test_fused_quant_gpu.py
stage sanitize_block 45 env SANITIZE_ARGS=--block SANITIZE_TOOLS="racecheck" bash benchmarks/tools/sanitize.sh
stage host_overhead 30 python -m benchmarks.host_overhead --calls 1000 --json "$OUT/host_overhead.json"
stage block_bench 50 python -m benchmarks.gemm_bench --mode block --quick --out "$OUT"
stage chain_bench 60 python -m benchmarks.chain_bench --out "$OUT"
stage e2e 140 python -m benchmarks.e2e --quick --out "$OUT"
stage calibrate_gpu 90 python -m benchmarks.calibrate_gpu --quick --out "$OUT"
stage moe_bench 60 python -m benchmarks.moe_bench --quick --out "$OUT"
stage moe_profile 120 python -u -m benchmarks.moe_bench --quick --skip-gemm --profile-prefill --profile-decode --out "$OUT"
tar czf "$OUT/cache.tgz" .fp8_cache 2>/dev/null
echo "total ${SECONDS}s" | tee -a "$OUT/summary.txt"
