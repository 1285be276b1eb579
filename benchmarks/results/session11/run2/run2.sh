#!/usr/bin/env bash
# Session 11 run 2: does the operands' data set the energy per FLOP (and so the capped clock)?
# energy_bench at 8192^3 for cuBLASLt and auto over four value kinds; the power limits and clocks.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE > $OUT/smi.txt 2>&1
timeout 300 python3 -P benchmarks/energy_bench.py --shapes 8192x8192x8192 --configs "" \
  --data randn,scaled,ones,zeros,randn --json $OUT/energy-data.json 2>&1 | tee $OUT/energy-data.txt
nvidia-smi -q -d TEMPERATURE >> $OUT/smi.txt 2>&1
