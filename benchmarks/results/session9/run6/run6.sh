#!/usr/bin/env bash
# Session 9 run 6: kernel v20 (each tile's epilogue operands loaded under the previous tile's last
# k-block, the two-accumulator configs): kernel tests, ncu of configs 7 / 10 at 6144^2 x 1280 per-tensor
# and per-channel, memcheck on 7, 10, steady configs 7 / 10 per-channel at that shape.
source benchmarks/device_prelude.sh
timeout 100 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 10; do for v in "" "--channel"; do
  timeout 30 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/n.txt 2>&1
  echo "ncu c$c ${v:-tensor}: $(grep -E 'gpu__time|per_second' $OUT/n.txt | tr -s ' ' | rev | cut -d' ' -f1 | rev | tr '\n' ';')" | tee -a $OUT/ncu.txt
done; done; rm -f $OUT/n.txt
s0=$(el)
SANITIZE_CONFIGS=7,10 SANITIZE_TOOLS="memcheck" timeout 40 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "memcheck 7,10 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=" $OUT/san.txt | tail -2
echo "=== steady 7/10 at $(el) s"
timeout $(( 250 - $(el) )) python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280 --configs 7,10 --per-channel --warm 2 --burn 0.3 \
  --rep 200 --rounds 4 2>&1 | tee $OUT/steady-pc.txt | tail -8
echo "=== end $(el) s"
