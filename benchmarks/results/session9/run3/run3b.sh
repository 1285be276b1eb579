#!/usr/bin/env bash
# Session 9 run 3b: run 3's raster_bench again after fixing its row label (NameError in session 8's parse_shapes change).
tar xzf out/s9/fp8cache.tgz 2>/dev/null
source benchmarks/device_prelude.sh
timeout 300 python3 -P benchmarks/raster_bench.py --configs 7,10,11 --groups 4,8,16 \
  --shapes 8192x4096x4096,8192x4096x14336,8192x6144x4096,4096x4096x4096,8192x10240x8192 --json $OUT/raster.json 2>&1 | tee $OUT/raster.txt | tail -14
echo "=== end $(el) s"
