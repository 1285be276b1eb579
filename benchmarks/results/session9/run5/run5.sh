#!/usr/bin/env bash
# Session 9 run 5: kernel v19 (per-channel column scales of the first pairs in registers from the tile
# start: 6 of 8 pairs at BN 128, 1 of 9 at BN 144): kernel tests, ncu of configs 7 / 10 at 6144^2 x 1280
# (duration, shared-load wavefronts), steady configs 7 / 10 per-channel at that shape, memcheck on 7, 10
# (the new global loads), the judged set with per-channel.
source benchmarks/device_prelude.sh
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 10; do for v in "" "--channel"; do
  timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --metrics gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,sm__cycles_elapsed.avg.per_second \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/n.txt 2>&1
  echo "ncu c$c ${v:-tensor}: $(grep -E 'gpu__time|wavefronts|per_second' $OUT/n.txt | tr -s ' ' | rev | cut -d' ' -f1 | rev | tr '\n' ';')" | tee -a $OUT/ncu.txt
done; done; rm -f $OUT/n.txt
echo "=== steady 7/10 at $(el) s"
timeout 60 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280 --configs 7,10 --per-channel --warm 3 --burn 0.3 \
  --rep 200 --rounds 4 2>&1 | tee $OUT/steady-pc.txt | tail -8
s0=$(el)
SANITIZE_CONFIGS=7,10 SANITIZE_TOOLS="memcheck" timeout 150 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "memcheck 7,10 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=|wrong" $OUT/san.txt | tail -3
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
