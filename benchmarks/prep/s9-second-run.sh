#!/usr/bin/env bash
# Second device call of session 9 (~450 s): why the 2-CTA cluster configs (8, 11: B multicast, like
# cuBLASLt's nvjet ..._1x2 kernels) are slower than their single-CTA twins (7, 10), and whether the
# raster is the reason. The tile walk groups group_m PAIR-rows on clusters (tile_coords), so at the
# default 16 a cluster group covers 32 row-blocks: twice the A panel of the single-CTA group in L2
# (NOTES, session 8). Session 5's ncu: the cluster configs read more L2 sectors, which multicast should
# have halved for B. Measures, per group height 4 / 8 / 16:
#   1. raster_bench, configs 10 and 11 on the M = 8192 shapes where we trail cuBLASLt most;
#   2. ncu memory counters (L2 read sectors and requests, xbar->L1 bytes, L2 hit rate, DRAM bytes) of configs 10 and
#      11 at 8192 x 6144 x 4096 (session 5 run 2's shape: L2 read sectors 66.6 M / 70.7 M at group 16);
#   3. energy_bench (clock, watts, pJ/FLOP) of 10 and 11 at 8192^3 and 8192 x 4096 x 4096;
#   4. the second judged sample of v16 (session 8 run 1: geomean 1.006; paired per-channel worst +3.6%).
# At most 8 files come back from $OUT: build, smoke, raster, ncu-mem, energy, steady (.txt / .json).
# Then: run(command="bash benchmarks/prep/s9-second-run.sh")   -- logs in $OUT
source benchmarks/device_prelude.sh
timeout 150 python3 -P benchmarks/raster_bench.py --configs 10,11 --groups 4,8,16 \
  --shapes 8192x6144x4096,8192x4096x4096,8192x10240x8192,8192x8192x28672,2048x6144x4096 2>&1 | tee $OUT/raster.txt | tail -12
echo "=== ncu memory at $(el) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="lts__t_sectors_op_read.sum,lts__t_requests_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second"
for c in 10 11; do for g in 4 8 16; do
  FP8_LINEAR_SM90_GROUP_M=$g timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 \
    --launch-count 1 --metrics $M python3 -P benchmarks/profile_one.py --config $c --shape 8192 6144 4096 \
    > $OUT/ncu-mem-c$c-g$g.txt 2>&1
  echo "config $c group $g: $(grep -E 'lts__|l1tex__|dram__|gpu__time|sm__cycles' $OUT/ncu-mem-c$c-g$g.txt | tr -s ' ' | tr '\n' ';')"
done; done
cat $OUT/ncu-mem-*.txt > $OUT/ncu-mem.txt; rm -f $OUT/ncu-mem-c*.txt
echo "=== energy at $(el) s"
timeout 90 python3 -P benchmarks/energy_bench.py --shapes 8192x8192x8192,8192x4096x4096 --configs 10,11 2>&1 | tee $OUT/energy.txt | tail -12
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
