#!/usr/bin/env bash
# Session 11 run 7: small M, where the time goes. ncu (cold L2, card's own clock) of ours and cuBLASLt
# at 4096 x 4096 x 4096 with M = 64 (config 7 = auto, config 2) and M = 1 (config 1 = auto), and 8B down M = 64.
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,launch__grid_size,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,sm__throughput.avg.pct_of_peak_sustained_elapsed"
for spec in "7:64 4096 4096" "-1:64 4096 4096" "2:64 4096 4096" "1:1 4096 4096" "-1:1 4096 4096" "-1:64 4096 14336" "3:64 4096 14336"; do
  c=${spec%%:*}; shape=${spec##*:}
  timeout 60 $NCU --clock-control none --kernel-name regex:'sm90|nvjet|gemm|splitk' --launch-skip 2 --launch-count 1 --metrics $M \
    python3 -P benchmarks/profile_one.py --config $c --shape $shape > $OUT/n.txt 2>&1
  echo "ncu [$shape] c$c: $(grep -E 'Context' $OUT/n.txt | head -1 | cut -c1-90)" | tee -a $OUT/ncu.txt
  echo "   $(grep -E '__' $OUT/n.txt | tr -s ' ' | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a $OUT/ncu.txt
done; rm -f $OUT/n.txt
echo "=== end $(el) s"
