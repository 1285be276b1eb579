#!/usr/bin/env bash
# First device call of session 8 (one `run`, ~500 s): verify and measure the tile-start patch
# (benchmarks/prep/s8-tile-start.patch = branch prep/s8-fastdiv: FastDiv tile walk + the epilogue
# prefetch after the first k-block's issue). Locally first:
#   rm -rf out/s8 && mkdir -p out/s8/old && git archive HEAD kernels | tar -x -C out/s8/old   # main's kernels, for the A/B
#   git apply benchmarks/prep/s8-tile-start.patch
# Then: run(command="bash benchmarks/prep/s8-first-run.sh", carry=["out/s8"])   -- logs in $OUT
# If the A/B loses, benchmarks/prep/s8-fastdiv-only.patch is the first of the two changes alone (the
# FastDiv tile walk, without moving the prefetch), to tell them apart.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
[ -d out/s8/old/kernels ] || { echo "out/s8/old/kernels missing (see the header)"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/device_run.sh build 2>&1 | grep -E "load s|QGMMA count|rror" | head
timeout 60 python3 -P benchmarks/sanitize_driver.py > $OUT/smoke.txt 2>&1; rc=$?; echo "smoke rc=$rc"; tail -1 $OUT/smoke.txt
[ $rc -ne 0 ] && { tail -20 $OUT/smoke.txt; exit 1; }
timeout 120 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
SANITIZE_CONFIGS=1,7,10,11 SANITIZE_TOOLS="memcheck racecheck synccheck" timeout 130 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san rc=$? at $(el) s"; grep -E "rc=" $OUT/san.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 50 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  python3 -P benchmarks/profile_one.py --config 7 --shape 6144 6144 1280 > $OUT/ncu-t.txt 2>&1
echo "ncu (session 7 run 3: 88.22 us): $(grep -E 'Duration|SM Frequency' $OUT/ncu-t.txt | tr -s ' ' | tr '\n' ';')"
AB_OLD=out/s8/old/kernels OUT=$OUT benchmarks/device_run.sh ab 2>&1 | grep -vE "^=====" | tail -40
echo "=== steady judged new at $(el) s"
timeout $(( 585 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
