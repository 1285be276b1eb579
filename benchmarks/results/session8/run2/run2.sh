#!/usr/bin/env bash
# Session 8 run 2 (~350 s): the tile-start patch's racecheck + synccheck (run 1's 130 s timeout only let
# memcheck finish), then where per-channel still loses at 6144^2 x 1280 (steady: +3.6% paired):
# ncu durations of configs 7 and 10 (auto picks 10 there), per-tensor and per-channel, and config 10's
# per-SASS-line source counters of both.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
python3 -P -c "from kernels.configs import select_config as s; print('auto config at 6144^2x1280:', s(6144,6144,1280).id)"
for cfgs in 1,7 10,11; do
  SANITIZE_CONFIGS=$cfgs SANITIZE_TOOLS="racecheck synccheck" timeout 110 benchmarks/sanitize.sh >> $OUT/san.txt 2>&1
  echo "san $cfgs rc=$? at $(el) s"
done
grep -E "rc=" $OUT/san.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 10; do for v in "" "--channel"; do
  tag=$c${v:+ch}
  timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $tag: $(grep -E 'Duration|SM Frequency' $OUT/ncu-$tag.txt | tr -s ' ' | tr '\n' ';') at $(el) s"
done; done
cat $OUT/ncu-*.txt > $OUT/ncu-sol.txt; rm -f $OUT/ncu-7*.txt $OUT/ncu-10*.txt
for v in "" "--channel"; do
  tag=${v:+ch}; tag=${tag:-t}
  timeout 80 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv \
    python3 -P benchmarks/profile_one.py --config 10 --shape 6144 6144 1280 $v > $OUT/ncusrc10-$tag.csv 2>&1
  echo "ncusrc $tag rc=$? lines $(wc -l < $OUT/ncusrc10-$tag.csv) at $(el) s"
done
echo "=== end $(el) s"
