#!/usr/bin/env bash
# First device call of session 11 (~300 s): why the swapped large-M configs (14 = 7 swapped, 15 = 10
# swapped) are 4-8% slower than their originals where N >> M and 2-3% faster where N < M (NOTES, session
# 10, run 4), although the tile walk reads the same panels. ncu of one launch per config and shape, at the
# card's own clock: duration, cycles, DRAM and L2 traffic, L2 hit rate, tensor-pipe activity, and the
# stall reasons that differ (long scoreboard: waiting for TMA data; barrier). Shapes: 512 x 8192 x 8192
# (14 -6%), 2048 x 57344 x 8192 (15 -8% vs 10), 8192 x 4096 x 4096 (15 +3% vs 7).
# Then energy_bench of configs 7 / 14 / 10 / 15 on the two N >> M shapes: is the twins' steady-state loss
# fewer FLOP per clock or a lower clock (more energy per FLOP)?
# Then: run(command="bash benchmarks/prep/s11-first-run.sh")   -- ncu.txt + energy.txt in $OUT
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum,l1tex__m_xbar2l1tex_read_bytes.sum,sm__cycles_elapsed.max"
for spec in "512 8192 8192:7,14" "2048 57344 8192:10,15" "8192 4096 4096:7,15"; do
  shape=${spec%%:*}; cfgs=${spec##*:}
  for c in ${cfgs//,/ }; do
    timeout 60 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --metrics $M \
      python3 -P benchmarks/profile_one.py --config $c --shape $shape > $OUT/n.txt 2>&1
    echo "ncu [$shape] c$c: $(grep -E '__|pct|ratio' $OUT/n.txt | tr -s ' ' | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a $OUT/ncu.txt
  done
done; rm -f $OUT/n.txt
echo "=== energy at $(el) s"
timeout 150 python3 -P benchmarks/energy_bench.py --shapes 512x8192x8192,2048x57344x8192 --configs 7,14,10,15 --json $OUT/energy.json 2>&1 \
  | tee $OUT/energy.txt | tail -12
echo "=== end $(el) s"
