#!/usr/bin/env bash
# Second device call of session 10 (~400 s), on main as it is:
#   1. the judged set with per-channel (session 9 moved 6144^2 x 1280 from config 10 to config 7 in
#      select_config, from forced-config data only: this is its first judged timing; predicted per-tensor
#      +1-2% there, per-channel unchanged in time);
#   2. forced configs 7 / 10 at 6144^2 x 1280 with per-channel, four rounds;
#   3. per-channel at long K (steady paired +2-3% at 8192 / 4096 x 57344 x 8192 and 8192^2 x 28672, more
#      than the epilogue's share of those tiles): clock, watts and FLOP per clock of auto per-tensor vs
#      per-channel (energy_bench --per-channel), to see whether it is power (a lower clock) or work.
# Then: run(command="bash benchmarks/prep/s10-second-run.sh")   -- logs in $OUT
source benchmarks/device_prelude.sh
echo "=== energy at $(el) s"
timeout 120 python3 -P benchmarks/energy_bench.py --shapes 8192x57344x8192,8192x8192x28672,6144x6144x1280 --configs "" \
  --per-channel --json $OUT/energy.json 2>&1 | tee $OUT/energy.txt | tail -12
echo "=== steady 7/10 at $(el) s"
timeout 60 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280 --configs 7,10 --per-channel --warm 2 --burn 0.3 \
  --rep 200 --rounds 4 2>&1 | tee $OUT/steady-pc.txt | tail -8
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -32
echo "=== end $(el) s"
