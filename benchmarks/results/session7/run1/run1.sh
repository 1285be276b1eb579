#!/usr/bin/env bash
# First device call of the next session (one `run`, ~500 s): verify and measure the split-K patch.
# Locally first:  git apply benchmarks/prep/s7-splitk.patch   (or: git merge prep/s7-splitk)
# Then:           run(command="bash benchmarks/prep/s7-first-run.sh")   -- logs in $OUT
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 60 python3 -P benchmarks/sanitize_driver.py > $OUT/smoke.txt 2>&1; rc=$?; echo "smoke rc=$rc"; tail -2 $OUT/smoke.txt
[ $rc -ne 0 ] && exit 1
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
SANITIZE_CONFIGS=1,3,7 SANITIZE_TOOLS="memcheck racecheck synccheck" timeout 120 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san rc=$? at $(el) s"; grep -E "rc=|launches" $OUT/san.txt
timeout 120 python3 -P benchmarks/splitk_bench.py --ms 1,16,32,64,128 --splits 4 --configs 3,7 --json $OUT/splitk.json 2>&1 | tee $OUT/splitk.txt | tail -8
echo "=== steady at $(el) s"
timeout $(( 585 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
