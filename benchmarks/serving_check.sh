#!/usr/bin/env bash
# GPU check of the serving path in one device call (logs in $OUT): install, build the sm90 kernel in the
# background while the tests that need no kernel run (graph breaks and reduce-overhead on cuBLASLt /
# emulated, cuBLASLt block scales), then the sm90 tests, the host-overhead benchmark, compiled generate
# against eager, and `python -m benchmarks.e2e --quick` with what time is left. Each stage has its own
# timeout; the kernel build cache goes back as $OUT/cache.tgz.
#   bash benchmarks/serving_check.sh [total seconds, default 290]
set -u
TOTAL=${1:-290}
OUT=${OUT:-out}
mkdir -p "$OUT"
export FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONUNBUFFERED=1
left() { echo $((TOTAL - SECONDS)); }
stage() {  # stage NAME SECONDS CMD...: run CMD with a timeout capped by the time left, log to $OUT/NAME.log
  local name=$1 want=$2; shift 2
  local t=$(( want < $(left) - 5 ? want : $(left) - 5 ))
  if [ "$t" -le 5 ]; then echo "$name: skipped (no time left)" | tee -a "$OUT/summary.txt"; return; fi
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? after ${SECONDS}s: $(tail -n 1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
}
python -m pip install --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
# An install that did not map fp8_linear.kernels (a half-edited pyproject, say) makes every later stage
# meaningless: stop here with the install log.
if ! python -c "import fp8_linear.kernels" > "$OUT/import.log" 2>&1; then
  echo "install: fp8_linear.kernels not importable; see install.log / import.log" | tee -a "$OUT/summary.txt"
  tail -n 30 "$OUT/install.log" "$OUT/import.log"
  exit 3
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" >> "$OUT/gpu.txt" 2>&1
( timeout $((TOTAL - 20)) python -c "from fp8_linear.kernels import jit; jit.load()" > "$OUT/build.log" 2>&1;
  echo "build rc=$? after ${SECONDS}s" >> "$OUT/build.log" ) &
BUILD=$!
PT="python -m pytest -q --maxfail=5 -p no:cacheprovider -m gpu"
stage compile_other 80 $PT tests/core/test_compile.py -k "cublaslt or emulated"
stage cublaslt_block 40 $PT tests/core/backends/test_cublaslt_gpu.py -k "fp64_reference"
wait $BUILD
stage compile_sm90 60 $PT tests/core/test_compile.py -k "sm90"
stage sm90_linear 45 $PT tests/core/backends/test_sm90_linear_gpu.py -k "4096-4096 or block or batched or forced or graph or compile"
stage host_overhead 30 python -m benchmarks.host_overhead --calls 1000 --json "$OUT/host_overhead.json"
stage generate 90 $PT tests/core/test_generate.py -k "gpu and (fp8-dynamic or fp8-tensor)"
stage e2e_quick 240 python -m benchmarks.e2e --quick --out "$OUT"
tar czf "$OUT/cache.tgz" .fp8_cache 2>/dev/null
echo "total ${SECONDS}s" >> "$OUT/summary.txt"
