#!/usr/bin/env bash
# Session 11 run 6: the judged set in steady state with per-channel, main as committed (v21).
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
echo "=== steady judged at $(el) s"
timeout $(( 585 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -34
echo "=== end $(el) s"
