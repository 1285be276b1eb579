#!/usr/bin/env bash
# Session 11 run 4: the twins' raster. Forced 7 / 14 / 10 / 15 at group heights 1, 2, 4, 16, steady.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
timeout 450 python3 -P benchmarks/raster_bench.py --configs 7,14,10,15 --groups 1,2,4,16 \
  --shapes 512x8192x8192,512x57344x8192,2048x57344x8192,8192x57344x8192,8192x4096x4096,8192x6144x4096 \
  --json $OUT/raster.json 2>&1 | tee $OUT/raster.txt
