#!/usr/bin/env bash
# Session 10 run 4: forced 7 / 14 / 10 / 15 per-tensor (steady, 3 rounds) where gemm.py showed the swapped
# twins slower (M = 512: per-channel +3-4%) or faster (M = 8192, N <= 6144) than the non-swapped choice.
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
timeout 400 python3 -P benchmarks/steady_bench.py --shapes 512x10240x8192,512x4096x4096,512x57344x8192,512x8192x8192,1024x4096x2048,2048x57344x8192,4096x4096x14336,8192x4096x4096,8192x6144x4096,8192x57344x8192 \
  --configs 7,14,10,15 --warm 3 --burn 0.3 --rep 200 --rounds 3 --json $OUT/steady-twins.json 2>&1 | tee $OUT/steady-twins.txt | tail -20
echo "=== end $(el) s"
