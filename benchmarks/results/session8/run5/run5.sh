#!/usr/bin/env bash
# Session 8 run 5 (~250 s): kernel v17's memcheck on configs 7, 10, 11 and racecheck + synccheck on 11
# (the 2-CTA cluster instance of the changed tile end).
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
for spec in "7,10,11 memcheck 120" "11 racecheck,synccheck 70"; do
  set -- $spec; s0=$(el)
  SANITIZE_CONFIGS=$1 SANITIZE_TOOLS="${2/,/ }" timeout $3 benchmarks/sanitize.sh >> $OUT/san.txt 2>&1
  echo "san $1 $2 rc=$? in $(( $(el) - s0 )) s"
done
grep -E "rc=|launches" $OUT/san.txt
echo "=== end $(el) s"
