set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 240 python3 -P benchmarks/steady_bench.py --set judged --per-channel --burn 0.4 --rep 300 --rounds 2 --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
