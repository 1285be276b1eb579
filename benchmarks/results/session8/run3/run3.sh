#!/usr/bin/env bash
# Session 8 run 3 (~500 s): kernel v17 (tile_end_early: the tile end's publication + barrier under the
# last k-block, one barrier less per tile): build, smoke, pytest tests/kernels, racecheck + synccheck on
# config 10, ncu 6144^2 x 1280 (configs 7, 10; per-tensor, per-channel), A/B against v16 (out/s8/old),
# steady judged --per-channel.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 60 python3 -P benchmarks/sanitize_driver.py > $OUT/smoke.txt 2>&1; rc=$?; echo "smoke rc=$rc"; tail -1 $OUT/smoke.txt
[ $rc -ne 0 ] && { tail -20 $OUT/smoke.txt; exit 1; }
timeout 120 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
SANITIZE_CONFIGS=10 SANITIZE_TOOLS="racecheck synccheck" timeout 60 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san 10 rc=$? at $(el) s"; grep -E "rc=" $OUT/san.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 10; do for v in "" "--channel"; do
  tag=$c${v:+ch}
  timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $tag: $(grep -E 'Duration|SM Frequency' $OUT/ncu-$tag.txt | tr -s ' ' | tr '\n' ';')"
done; done
cat $OUT/ncu-*.txt > $OUT/ncu-sol.txt; rm -f $OUT/ncu-7*.txt $OUT/ncu-10*.txt
echo "(run 2, v16: 7 t 83.71 ch 86.53; 10 t 84.90 ch 88.58)"
AB_OLD=out/s8/old/kernels OUT=$OUT benchmarks/device_run.sh ab 2>&1 | grep -E "^ +[0-9]|geomean|^===" | grep -vE "^=====" | tail -40
echo "=== steady judged new at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
