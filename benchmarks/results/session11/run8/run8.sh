#!/usr/bin/env bash
# Session 11 run 8: v22 = the decode configs 1-3 with up to 16 stages (9-12 fit; 8 was a cap).
# Kernel tests, then small-M timing (auto = the new configs at M <= 32 / 64), then sanitizers on 1, 3.
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt
FP8_LINEAR_SM90_VERBOSE=1 python3 -P benchmarks/profile_one.py --config 1 --shape 1 4096 4096 --launches 1 2>&1 | grep stages
FP8_LINEAR_SM90_VERBOSE=1 python3 -P benchmarks/profile_one.py --config 3 --shape 64 4096 4096 --launches 1 2>&1 | grep stages
timeout 100 python3 -P -m pytest tests/kernels -q -p no:cacheprovider -x > $OUT/ktests.txt 2>&1
echo "kernel tests rc=$? at $(el) s"; tail -1 $OUT/ktests.txt
timeout 130 python3 -P benchmarks/splitk_bench.py --ms 1,16,32,64 --splits "" --configs 1,2,3 \
  --json $OUT/smallm.json 2>&1 | tee $OUT/smallm.txt
echo "=== sanitizers at $(el) s"
SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_CONFIGS="1,3" timeout $(( 330 - $(el) )) bash benchmarks/sanitize.sh > $OUT/san.txt 2>&1
grep -E "rc=|sanitize.sh" $OUT/san.txt
echo "=== end $(el) s"
