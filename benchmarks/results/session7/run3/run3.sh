#!/usr/bin/env bash
# pack-first epilogue: build, kernel tests, sanitizers on 7,10, ncu per-channel duration, steady judged --per-channel
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 60 python3 -P benchmarks/sanitize_driver.py > $OUT/smoke.txt 2>&1; rc=$?; echo "smoke rc=$rc"; tail -1 $OUT/smoke.txt
[ $rc -ne 0 ] && exit 1
timeout 150 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
SANITIZE_CONFIGS=7,10 SANITIZE_TOOLS="memcheck racecheck synccheck" timeout 100 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san rc=$? at $(el) s"; grep -E "rc=" $OUT/san.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in "" "--channel"; do
  tag=${v:+ch}; tag=${tag:-t}
  timeout 60 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight python3 -P benchmarks/profile_one.py --config 7 --shape 6144 6144 1280 $v > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $tag: $(grep -E 'Duration|SM Frequency' $OUT/ncu-$tag.txt | tr -s ' ' | tr '\n' ';')"
done
echo "=== steady at $(el) s"
timeout $(( 560 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
