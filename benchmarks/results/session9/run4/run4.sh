#!/usr/bin/env bash
# Session 9 run 4: kernel v18 (warpgroup order, FP8_LINEAR_SM90_WG_LAG, default 2): kernel tests (a
# deadlock would hang them: timeout), racecheck + synccheck on 7 and 10 (the sweep now has a 9-k-block
# multi-tile shape where the order is in force), the depth sweep 0..3 in steady state with per-channel,
# ncu of config 10 at 6144^2 x 1280, depth 0 / 2, per-tensor / per-channel.
source benchmarks/device_prelude.sh
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
echo "=== steady depth sweep at $(el) s"
timeout 200 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280,2048x6144x4096,8192x4096x4096,4096x28672x4096,8192x8192x8192,8192x8192x28672 \
  --env FP8_LINEAR_SM90_WG_LAG=0,1,2,3 --per-channel --warm 3 --burn 0.3 --rep 200 --rounds 2 --json $OUT/steady-lag.json 2>&1 \
  | tee $OUT/steady-lag.txt | tail -20
echo "=== ncu at $(el) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for d in 0 2; do for v in "" "--channel"; do
  FP8_LINEAR_SM90_WG_LAG=$d timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second python3 -P benchmarks/profile_one.py --config 10 --shape 6144 6144 1280 $v > $OUT/n.txt 2>&1
  echo "ncu c10 lag $d ${v:-tensor}: $(grep -E 'gpu__time|per_second' $OUT/n.txt | tr -s ' ' | cut -d' ' -f2,4 | tr '\n' ';')" | tee -a $OUT/ncu-lag.txt
done; done; rm -f $OUT/n.txt
s0=$(el)
SANITIZE_CONFIGS=7,10 SANITIZE_TOOLS="racecheck synccheck" timeout 230 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san 7,10 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=|plain|wrong" $OUT/san.txt
echo "=== end $(el) s"
