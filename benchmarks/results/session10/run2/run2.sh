#!/usr/bin/env bash
# Session 10 run 2: kernel v21 with config 15 (10 swapped) and one BN-row TMA box per warpgroup;
# select_config(per_channel=True). Kernel tests, sanitizers on 14 / 15, other gpu tests, judged set.
source benchmarks/device_prelude.sh
timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && { grep -E "Error|assert" $OUT/ktests.txt | head -30; exit 1; }
s0=$(el)
SANITIZE_CONFIGS=14,15 timeout 150 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "sanitize 14,15 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=|sanitize.sh" $OUT/san.txt | tail -6
timeout 100 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
echo "=== steady judged at $(el) s"
timeout $(( 590 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -34
echo "=== end $(el) s"
