set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels/test_sm90_gpu.py -x > $OUT/ktests.txt 2>&1; rc=$?; echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
LEFT=$(( 330 - $(el) ))
timeout $LEFT python3 -P benchmarks/steady_bench.py --set judged --per-channel --burn 0.4 --rep 300 --rounds 2 --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== gpu tests at $(el) s"
timeout 150 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1; echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
SANITIZE_CONFIGS=7,10,12 SANITIZE_TOOLS="memcheck racecheck synccheck" timeout $(( 575 - $(el) )) benchmarks/sanitize.sh > $OUT/san.txt 2>&1; echo "san rc=$? at $(el) s"; grep -E "rc=|sanitize.sh|launches" $OUT/san.txt
echo "=== end $(el) s"
