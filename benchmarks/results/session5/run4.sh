set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels/test_sm90_gpu.py --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?; echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
LEFT=$(( 540 - $(el) ))
echo "=== steady at $(el) s, $LEFT s left"
timeout $LEFT python3 -P benchmarks/steady_bench.py --set judged --per-channel --configs 7,10 --burn 0.4 --rep 300 --rounds 2 --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -40
echo "=== end $(el) s"
