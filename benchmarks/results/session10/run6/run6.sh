#!/usr/bin/env bash
# Session 10 run 6 (the budget's last ~200 s): ncu of the swapped twins against their originals where the
# twin is slower (512 x 8192 x 8192: 14 vs 7) and faster (8192 x 4096 x 4096: 15 vs 7).
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
for spec in "512 8192 8192:7,14" "8192 4096 4096:7,15"; do
  shape=${spec%%:*}; cfgs=${spec##*:}
  for c in ${cfgs//,/ }; do
    timeout 40 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 --metrics $M \
      python3 -P benchmarks/profile_one.py --config $c --shape $shape > $OUT/n.txt 2>&1
    echo "ncu [$shape] c$c: $(grep -E '__|pct|ratio' $OUT/n.txt | tr -s ' ' | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a $OUT/ncu.txt
  done
done; rm -f $OUT/n.txt
echo "=== end $(el) s"
