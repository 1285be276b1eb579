set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 12; do
  timeout 150 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python3 -P benchmarks/profile_one.py --config $c --shape 8192 6144 4096 > $OUT/ncusrc-$c.csv 2>&1
  echo "ncusrc $c rc=$? at $(el) s lines $(wc -l < $OUT/ncusrc-$c.csv)"
  timeout 90 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats python3 -P benchmarks/profile_one.py --config $c --shape 8192 6144 4096 > $OUT/ncuws-$c.txt 2>&1
  echo "ncuws $c rc=$? at $(el) s"
done
echo "=== end $(el) s"
