#!/usr/bin/env bash
# Session 10 run 5: main as committed (twins 14 / 15 for N <= M with swap_ok): other gpu tests (fast path vs
# generic path), gemm.py over the 68 shapes (tag v21b), the judged set with per-channel (steady).
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
timeout 100 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
timeout 150 python3 -P benchmarks/gemm.py --tag v21b --out $OUT > $OUT/gemm.txt 2>&1; echo "gemm.py rc=$? at $(el) s"
tail -9 $OUT/gemm.txt
echo "=== steady judged at $(el) s"
timeout $(( 560 - $(el) )) python3 -P benchmarks/steady_bench.py --set judged --per-channel --warm 3 --burn 0.4 --rep 300 --rounds 2 \
  --json $OUT/steady.json 2>&1 | tee $OUT/steady.txt | tail -33
echo "=== end $(el) s"
