#!/usr/bin/env bash
# Session 8 run 4 (~400 s): kernel v17's remaining checks: racecheck on configs 7 and 1 alone, timed
# (runs 1 and 2 cut racecheck of 1,7 at 110-130 s; session 7 ran 1,3,7 with three tools in < 120 s),
# synccheck on 1,7, then every other gpu-marked test.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
for spec in "7 racecheck 130" "1 racecheck 60" "1,7 synccheck 60"; do
  set -- $spec; s0=$(el)
  SANITIZE_CONFIGS=$1 SANITIZE_TOOLS=$2 timeout $3 benchmarks/sanitize.sh >> $OUT/san.txt 2>&1
  echo "san $1 $2 rc=$? in $(( $(el) - s0 )) s"
done
grep -E "rc=|launches" $OUT/san.txt
timeout 100 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
echo "=== end $(el) s"
