set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
FP8_LINEAR_SM90_VERBOSE=1 timeout 60 python3 -P benchmarks/sanitize_driver.py --configs 7,10,12,13 > $OUT/smoke.txt 2>&1; rc=$?; echo "smoke rc=$rc at $(el) s"; tail -1 $OUT/smoke.txt
if [ $rc -ne 0 ]; then
  for c in 12 13; do FP8_LINEAR_SM90_VERBOSE=1 timeout 30 python3 -P benchmarks/sanitize_driver.py --configs $c > $OUT/smoke-$c.txt 2>&1; echo "smoke $c rc=$?"; tail -2 $OUT/smoke-$c.txt; done
  exit 1
fi
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels/test_sm90_gpu.py --maxfail=20 -k "12 or 13 or bitwise or many_tiles or every_config" > $OUT/ktests.txt 2>&1; echo "kernel tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head; tail -1 $OUT/ktests.txt
SANITIZE_CONFIGS=12,13 SANITIZE_TOOLS="memcheck racecheck synccheck" timeout 200 benchmarks/sanitize.sh > $OUT/san.txt 2>&1; echo "san rc=$? at $(el) s"; grep -E "rc=|sanitize.sh" $OUT/san.txt
LEFT=$(( 560 - $(el) ))
echo "=== steady at $(el) s, $LEFT s left"
timeout $LEFT python3 -P benchmarks/steady_bench.py --set judged --configs 7,10,12,13 --burn 0.4 --rep 300 --rounds 2 --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -45
echo "=== end $(el) s"
