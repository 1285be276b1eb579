#!/usr/bin/env bash
# Session 10 run 3: kernel v21 as on main: benchmarks/gemm.py over the 68 shapes (tag v21), then a second
# steady sample of the judged set with per-channel.
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
echo "=== gemm.py at $(el) s"
timeout 330 python3 -P benchmarks/gemm.py --tag v21 --out $OUT > $OUT/gemm.txt 2>&1; echo "gemm.py rc=$? at $(el) s"
tail -12 $OUT/gemm.txt
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -4
echo "=== end $(el) s"
