set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
du -sh .fp8_cache; ls -la .fp8_cache/*/ | head -20
mkdir -p $OUT/cache && cp -r .fp8_cache/. $OUT/cache/ && du -sh $OUT/cache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="--metrics breakdown:gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,breakdown:sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_requests_op_read.sum,sm__cycles_elapsed.avg.per_second"
for c in -1 10 11 7 8; do
  timeout 90 $NCU --clock-control none --kernel-name regex:'sm90|nvjet' --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight $M python3 -P benchmarks/profile_one.py --config $c --shape 8192 6144 4096 > $OUT/ncu-$c.txt 2>&1
  echo "ncu $c rc=$? at $(el) s: $(grep -E 'Duration|L2 Cache Throughput|lts__t_sectors_op_read.sum' $OUT/ncu-$c.txt | tr -s ' ' | tr '\n' ';')"
done
echo "=== end $(el) s"
