#!/usr/bin/env bash
# One device call: build, tests, sanitizers, benchmarks, profiles. Stages chosen by args, run in order:
#   benchmarks/tools/device_run.sh build smoke tests quick bench steady decode splitk block energy raster sanitize ncu ncusrc ab
# Run from anywhere; works in the repository root. Logs go to $OUT (default ./out).
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export FP8_LINEAR_CACHE=${FP8_LINEAR_CACHE:-$PWD/.fp8_cache}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
load_kernel='import time; from fp8_linear.kernels import jit; t = time.perf_counter(); jit.load(); print("load s", time.perf_counter() - t)'
for stage in "$@"; do
  echo "===== $stage $(date +%T)"
  case $stage in
    build)
      # the build and its SASS summary (wgmma count, local-memory spills)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
      python3 -c "$load_kernel" 2>&1 | tee "$OUT/build.txt" || exit 1
      so=$(ls "$FP8_LINEAR_CACHE"/sm90-*/*.so | head -1)
      python3 -m benchmarks.tools.sass_diff --summary "$so" | tee -a "$OUT/build.txt"
      ;;
    smoke)
      # every config on small awkward shapes against an fp64 reference (a hang shows up as the timeout)
      FP8_LINEAR_SM90_VERBOSE=1 timeout 90 python3 -m benchmarks.tools.sanitize_driver > "$OUT/smoke.txt" 2>&1
      echo "smoke rc=$? $(tail -n 1 "$OUT/smoke.txt")"
      ;;
    tests)
      timeout 540 python3 -m pytest tests/kernels -q -p no:cacheprovider -rs --durations=8 2>&1 | tail -n 80 | tee "$OUT/tests.txt"
      ;;
    quick)
      # the three timing methods on small sets (about 2-3 minutes with a built kernel)
      for mode in decode burst steady; do
        timeout 200 python3 -m benchmarks.gemm_bench --mode $mode --quick --out "$OUT" 2>&1 | tee "$OUT/quick-$mode.txt"
      done
      ;;
    bench|steady|decode|splitk|block)
      # BENCH_ARGS: extra arguments, e.g. "--configs 7,10 --per-channel"
      mode=$stage; [ "$stage" = bench ] && mode=burst
      timeout 560 python3 -m benchmarks.gemm_bench --mode $mode ${BENCH_ARGS:-} --out "$OUT" --tag "${BENCH_TAG:-}" 2>&1 \
        | tee "$OUT/$mode.txt"
      ;;
    raster)
      timeout 300 python3 -m benchmarks.gemm_bench --mode raster --configs "${RASTER_CONFIGS:-7,10}" --out "$OUT" 2>&1 \
        | tee "$OUT/raster.txt"
      ;;
    energy)
      # SM clock, watts and tensor-core use per clock of cuBLASLt, auto and ENERGY_CONFIGS (NVML)
      timeout 200 python3 -m benchmarks.energy_bench --configs "${ENERGY_CONFIGS:-7,10}" --json "$OUT/energy.json" 2>&1 \
        | tee "$OUT/energy.txt"
      ;;
    sanitize)
      timeout 480 benchmarks/tools/sanitize.sh 2>&1 | tee "$OUT/sanitize.txt"
      ;;
    ncu)
      # ncu at NCU_SHAPE (default 8192^3) on NCU_CONFIGS, the card's own clocks (--clock-control none)
      for c in ${NCU_CONFIGS:-7}; do
        timeout 120 "$NCU" --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
          python3 -m benchmarks.tools.profile_one --config "$c" --shape ${NCU_SHAPE:-8192 8192 8192} > "$OUT/ncu-cfg$c.txt" 2>&1
        echo "ncu config $c: rc=$? $(grep -E 'Duration|SM Frequency|Compute \(SM\) Throughput' "$OUT/ncu-cfg$c.txt" | tr -s ' ' | tr '\n' ';')"
      done
      ;;
    ncusrc)
      # per-SASS-line stall samples (compare two with benchmarks/tools/ncu_source_diff.py)
      for c in ${NCU_CONFIGS:-7}; do
        timeout 150 "$NCU" --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
          --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
          python3 -m benchmarks.tools.profile_one --config "$c" --shape ${NCU_SHAPE:-8192 8192 8192} > "$OUT/ncusrc-cfg$c.csv" 2>&1
        echo "ncu source config $c: rc=$? lines $(wc -l < "$OUT/ncusrc-cfg$c.csv")"
      done
      ;;
    ab)
      # two kernel sources on one machine: the working tree's fp8_linear/kernels/ ("new") against AB_OLD (another
      # fp8_linear/kernels/ folder, e.g. from `git archive <commit> fp8_linear/kernels | tar x -C /tmp/old`), the steady benchmark
      # on the five-shape set in the order AB_ORDER (default new/old/new/old), and the SASS of both builds
      # compared; fp8_linear/kernels/ is the new one again afterwards
      [ -d "${AB_OLD:-}" ] || { echo "ab: AB_OLD=$AB_OLD is not a folder"; exit 1; }
      rm -rf /tmp/ab_new_kernels && cp -r fp8_linear/kernels /tmp/ab_new_kernels
      for v in ${AB_ORDER:-new old new old}; do
        rm -rf fp8_linear/kernels && if [ "$v" = old ]; then cp -r "$AB_OLD" fp8_linear/kernels; else cp -r /tmp/ab_new_kernels fp8_linear/kernels; fi
        python3 -c "$load_kernel" > /dev/null 2>&1 || { echo "ab: the $v kernels did not build"; break; }
        echo "=== $v $(date +%T)" | tee -a "$OUT/ab.txt"
        timeout 90 python3 -m benchmarks.gemm_bench --mode steady --set five --columns ours,cublas_t --warm 2 \
          --burn 0.4 --rep 300 --no-json 2>&1 | tail -n 8 | tee -a "$OUT/ab.txt"
      done
      rm -rf fp8_linear/kernels && cp -r /tmp/ab_new_kernels fp8_linear/kernels
      python3 -m benchmarks.tools.sass_diff $(ls -t "$FP8_LINEAR_CACHE"/sm90-*/*.so | head -2) | tee "$OUT/sass-diff.txt"
      ;;
    *)
      echo "unknown stage $stage"; exit 2
      ;;
  esac
done
echo "===== done $(date +%T)"
