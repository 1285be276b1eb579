#!/usr/bin/env bash
# Session 9 run 2: why per-channel costs 3-4% at 6144^2 x 1280 and whether the CARRY configs hide it.
# ncu (boost clocks, like session 8 run 2): configs 7, 10, 12, 13, per-tensor and per-channel: duration and
# shared-memory load wavefronts; steady 6 rounds at the shape; then the second judged sample of v16.
source benchmarks/device_prelude.sh
tar czf $OUT/fp8cache.tgz .fp8_cache 2>/dev/null; ls -la $OUT/fp8cache.tgz | awk '{print "cache tgz", $5}'
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,sm__cycles_elapsed.avg.per_second
for c in 7 10 12 13; do for v in "" "--channel"; do
  tag=$c${v:+ch}
  timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --metrics $M \
    python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $v > $OUT/ncu-$tag.txt 2>&1
  echo "ncu $tag: $(grep -E 'gpu__time|wavefronts|per_second' $OUT/ncu-$tag.txt | tr -s ' ' | cut -d' ' -f2,4 | tr '\n' ';') at $(el) s"
done; done
cat $OUT/ncu-*.txt > $OUT/ncu-pc.txt; rm -f $OUT/ncu-[0-9]*.txt
echo "=== steady 6 rounds at $(el) s"
timeout 120 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280 --configs 7,10,12,13 --per-channel --warm 3 \
  --burn 0.3 --rep 200 --rounds 6 --json $OUT/steady-pc.json 2>&1 | tee $OUT/steady-pc.txt | tail -12
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
