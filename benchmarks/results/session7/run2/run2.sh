#!/usr/bin/env bash
# Device call (~200 s): where the per-channel launch loses ~3% at 6144 x 6144 x 1280 (NOTES, session 6:
# its epilogue is the per-tensor one + 8 LDS.128 per thread per tile, so not instruction count).
# ncu with the card's own clocks: duration, clock and warp-state stalls of config 7 per-tensor vs
# per-channel, then per-SASS-line source counters of both (compare the epilogue and the tile start).
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in "" "--channel"; do
  tag=${v:+ch}; tag=${tag:-t}
  timeout 90 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    python3 -P benchmarks/profile_one.py --config 7 --shape 6144 6144 1280 $v > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $tag rc=$?: $(grep -E 'Duration|SM Frequency' $OUT/ncu-$tag.txt | tr -s ' ' | tr '\n' ';')"
  timeout 120 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv \
    python3 -P benchmarks/profile_one.py --config 7 --shape 6144 6144 1280 $v > $OUT/ncusrc-$tag.csv 2>&1
  echo "ncusrc $tag rc=$? lines $(wc -l < $OUT/ncusrc-$tag.csv)"
done
