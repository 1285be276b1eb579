#!/usr/bin/env bash
# Device check of the grouped sm90 kernel's block-scale path (about 150 s on an H200, one summary line
# per stage, logs in $OUT): build the extension, the block test whose token tiles start at rows that are
# not 16-byte aligned in the M-major scales (it faulted with an illegal instruction in the scale TMA
# load) under compute-sanitizer memcheck, and meanwhile every gpu-marked MoE test.
#   bash scripts/check_grouped_block.sh [total seconds, default 145]
set -u
cd "$(dirname "$0")/.."
TOTAL=${1:-145}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export FP8_LINEAR_CACHE=${FP8_LINEAR_CACHE:-$PWD/.fp8_cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
command -v "$CS" >/dev/null 2>&1 || CS=/usr/local/cuda/bin/compute-sanitizer
PT="$PY -m pytest -q -p no:cacheprovider -m gpu -rfE"
FAILING="test_m_major_and_row_major_group_scales_give_the_same_bits and counts0-16"
left() { echo $((TOTAL - SECONDS)); }
run() {  # run NAME SECONDS PATTERN CMD...: CMD under a timeout capped by the time left; one summary line
  local name=$1 want=$2 pat=$3; shift 3
  local t=$(( want < $(left) - 2 ? want : $(left) - 2 ))
  if [ "$t" -le 5 ]; then echo "$name: skipped (no time left)" | tee -a "$OUT/summary.txt"; return 1; fi
  local s=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - s))s (limit ${t}s): $(grep -E "$pat" "$OUT/$name.log" | tail -n 1)" \
    | tee -a "$OUT/summary.txt"
  return $rc
}
: > "$OUT/summary.txt"
$PY -m pip install --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
run build 95 'build|Error|error' $PY -c "
import time; t = time.time()
from fp8_linear.kernels import jit; jit.load()
print(f'build ok in {time.time() - t:.1f} s')" || { tail -n 30 "$OUT/build.log"; exit 3; }
# the sanitizer run and the test suite side by side (two processes, two contexts on the one GPU)
run memcheck 50 'ERROR SUMMARY|passed|failed|skipped' "$CS" --tool memcheck --print-limit 3 \
  $PT tests/moe/test_sm90_grouped_block_gpu.py -k "$FAILING" &
MEMCHECK=$!
run moe_gpu_tests 120 'passed|failed|error|skipped' $PT --durations=5 tests/moe
wait $MEMCHECK
grep -E '^=========' "$OUT/memcheck.log" | head -n 12
echo "total ${SECONDS}s" | tee -a "$OUT/summary.txt"
