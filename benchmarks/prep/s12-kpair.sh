#!/usr/bin/env bash
# First device call of session 12 (~330 s), on branch prep/s12-decode64: configs 16-18 (configs 1-3 on
# 64-row tiles, the two consumer warpgroups on alternate k-blocks; benchmarks/NOTES.md, session 11).
# Correctness first (the smoke sweep of the prelude covers 16-18, then every kernel test, then the
# sanitizers on 16-18), then small-M timing against configs 1-3 and cuBLASLt, then ncu at M = 1.
# Prediction: at M = 1-16 on N = 4096-8192, 64 CTAs instead of 32 (cuBLASLt runs 64 at M = 1):
# 4096 x 4096 from 10.2 us (ncu, config 1) toward cuBLASLt's 8.1; no change where N / 128 already
# fills the SMs (N = 28672, 57344).
# First, here: `git apply benchmarks/prep/s12-kpair.patch` (the configs, kernels and tests; also on branch
# prep/s12-decode64 if it survived), compile locally (all four units: 96 kernels, 0 spills), then
# run(command="bash benchmarks/prep/s12-kpair.sh")
grep -q "kNumConfigs = 19" kernels/include/sm90_api.h || { echo "apply benchmarks/prep/s12-kpair.patch first"; exit 2; }
source benchmarks/device_prelude.sh
timeout 150 python3 -P -m pytest tests/kernels -q -p no:cacheprovider -x > $OUT/ktests.txt 2>&1
echo "kernel tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -5; tail -1 $OUT/ktests.txt
SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_CONFIGS="16,17,18" timeout 120 bash benchmarks/sanitize.sh > $OUT/san.txt 2>&1
grep -E "rc=|sanitize.sh" $OUT/san.txt
echo "=== small M at $(el) s"
timeout 150 python3 -P benchmarks/splitk_bench.py --ms 1,16,32,64 --splits "" --configs 1,16,2,17,3,18 \
  --json $OUT/smallm.json 2>&1 | tee $OUT/smallm.txt | tail -36
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M="gpu__time_duration.sum,launch__grid_size,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second"
for spec in "1:1 4096 4096" "16:1 4096 4096" "-1:1 4096 4096" "2:32 4096 4096" "17:32 4096 4096"; do
  c=${spec%%:*}; shape=${spec##*:}
  timeout 40 $NCU --clock-control none --kernel-name regex:'sm90|nvjet' --launch-skip 2 --launch-count 1 --metrics $M \
    python3 -P benchmarks/profile_one.py --config $c --shape $shape > $OUT/n.txt 2>&1
  echo "ncu [$shape] c$c: $(grep -E '__' $OUT/n.txt | tr -s ' ' | awk '{print $1"="$NF}' | tr '\n' ' ')" | tee -a $OUT/ncu.txt
done; rm -f $OUT/n.txt
echo "=== end $(el) s"
