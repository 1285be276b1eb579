#!/usr/bin/env bash
# Session 11 run 1: is the main loop bound by shared-memory bandwidth? ncu sections at 8192^3 for
# configs 7 (128x128), 10 (128x144), 6 (128x192, one accumulator) and cuBLASLt; energy util of 6/10/15.
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
$NCU --query-metrics --chip gh100 2>/dev/null | grep -iE "data_bank|mem_shared|l1tex__throughput|tensor_op_gmma" | head -40 > $OUT/metrics-list.txt
M="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_elapsed.max,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum"
for c in 7 10 6 -1; do
  timeout 90 $NCU --clock-control none --kernel-name regex:'sm90|nvjet' --launch-skip 2 --launch-count 1 --metrics $M \
    python3 -P benchmarks/profile_one.py --config $c --shape 8192 8192 8192 > $OUT/n.txt 2>&1
  echo "ncu c$c: $(grep -E '__' $OUT/n.txt | tr -s ' ' | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a $OUT/ncu.txt
  grep -iE "error|ERR" $OUT/n.txt | head -3 >> $OUT/ncu.txt
done
for c in 10 -1; do
  timeout 120 $NCU --clock-control none --kernel-name regex:'sm90|nvjet' --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
    python3 -P benchmarks/profile_one.py --config $c --shape 8192 8192 8192 > $OUT/sec$c.txt 2>&1
done
rm -f $OUT/n.txt
echo "=== energy at $(el) s"
timeout 150 python3 -P benchmarks/energy_bench.py --shapes 8192x8192x8192,8192x6144x4096 --configs 6,7,10,15 --json $OUT/energy.json 2>&1 \
  | tee $OUT/energy.txt | tail -14
echo "=== end $(el) s"
