#!/usr/bin/env bash
# First device call of session 9 (one `run`, ~300-500 s), on main's kernel v16 as it is:
#   1. `pytest tests/kernels` (session 8 split sm90_gemm.cuh into five headers after its last device run:
#      identical SASS locally, this is the check on the GPU);
#   2. what v16 still lacks in its own build: racecheck + synccheck on configs 1 and 7 (a cold machine's
#      first sanitizer run is slow: up to 250 s), every other gpu-marked test;
#   3. the per-channel cost at small K by config (NOTES, session 8: +3.4-4.3% at 6144^2 x 1280 in ncu,
#      paired +3.6% steady): configs 7, 10 and the CARRY configs 12, 13 (next tile's first k-block under
#      the epilogue), each per-tensor and per-channel, on the shapes where per-channel costs most.
# The second judged sample of v16 is in s9-second-run.sh.
# Locally: nothing to apply. Then: run(command="bash benchmarks/prep/s9-first-run.sh")   -- logs in $OUT
source benchmarks/device_prelude.sh
timeout 120 python3 -P -m pytest -q -p no:cacheprovider tests/kernels --maxfail=20 > $OUT/ktests.txt 2>&1; rc=$?
echo "kernel tests rc=$rc at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/ktests.txt | head -20; tail -1 $OUT/ktests.txt
[ $rc -ne 0 ] && exit 1
s0=$(el)
SANITIZE_CONFIGS=1,7 SANITIZE_TOOLS="racecheck synccheck" timeout 250 benchmarks/sanitize.sh > $OUT/san.txt 2>&1
echo "san 1,7 rc=$? in $(( $(el) - s0 )) s"; grep -E "rc=" $OUT/san.txt
timeout 100 python3 -P -m pytest -m gpu tests -q -p no:cacheprovider -rA --ignore=tests/kernels/test_sm90_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "other gpu tests rc=$? at $(el) s"; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.txt | head; tail -1 $OUT/gpu-tests.txt
echo "=== per-channel by config at $(el) s"
timeout 120 python3 -P benchmarks/steady_bench.py --shapes 6144x6144x1280,8192x4096x4096,2048x6144x4096,8192x8192x4096 \
  --configs 7,10,12,13 --per-channel --warm 3 --burn 0.3 --rep 200 --rounds 2 --json $OUT/steady-cfg.json 2>&1 \
  | tee $OUT/steady-cfg.txt | tail -14
echo "=== end $(el) s"
