#!/usr/bin/env bash
# Session 11 run 5: main as committed (v21; session 10's review commit was not run on a device): every gpu
# test; then small M (32-128) with the narrow swapped configs forced (more column tiles -> more CTAs).
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
timeout 120 python3 -P -m pytest tests/kernels -q -p no:cacheprovider -x > $OUT/ktests.txt 2>&1
echo "kernel tests rc=$? at $(el) s"; tail -1 $OUT/ktests.txt
timeout 120 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
echo "=== splitk_bench at $(el) s"
timeout $(( 570 - $(el) )) python3 -P benchmarks/splitk_bench.py --ms 32,64,96,128 --splits 2,4 --configs 1,2,3,7 \
  --json $OUT/smallm.json 2>&1 | tee $OUT/smallm.txt
echo "=== end $(el) s"
