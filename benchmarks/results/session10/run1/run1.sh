#!/usr/bin/env bash
# Session 10 run 1: kernel v21 = v16 + config 14 (config 7 with A/B swapped, transposed TMA-store epilogue):
# kernel tests, sanitizers on 14, ncu 7 / 14 at 6144^2 x 1280 t / ch, steady 7 / 10 / 14 per-channel.
source benchmarks/device_prelude.sh
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && { grep -E "Error|assert" $OUT/ktests.txt | head -30; exit 1; }
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in 7 14; do for v in "" "--channel"; do
  timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --metrics gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,sm__cycles_elapsed.avg.per_second \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/n.txt 2>&1
  echo "ncu c$c ${v:-tensor}: $(grep -E 'gpu__time|wavefronts|per_second' $OUT/n.txt | tr -s ' ' | rev | cut -d' ' -f1 | rev | tr '\n' ';')" | tee -a $OUT/ncu.txt
done; done; rm -f $OUT/n.txt
echo "=== steady 7/10/14 at $(el) s"
timeout 240 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280,8192x57344x8192,4096x57344x8192,8192x8192x28672,8192x8192x8192,4096x28672x4096,2048x6144x4096 \
  --configs 7,10,14 --per-channel --warm 3 --burn 0.3 --rep 200 --rounds 2 --json $OUT/steady-cfg.json 2>&1 | tee $OUT/steady-cfg.txt | tail -20
s0=$(el)
SANITIZE_CONFIGS=14 timeout 150 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "sanitize 14 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=|wrong|sanitize.sh" $OUT/san.txt | tail -6
echo "=== end $(el) s"
