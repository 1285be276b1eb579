#!/usr/bin/env bash
# One device call: build, SASS check, tests, sanitizers, benchmark. Stages chosen by args:
#   benchmarks/device_run.sh build tests quickbench bench steady energy raster host sanitize ab
# Logs go to $OUT (or ./out).
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FP8_LINEAR_CACHE=${FP8_LINEAR_CACHE:-$PWD/.fp8_cache}
for stage in "$@"; do
  echo "===== $stage $(date +%T)"
  case $stage in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
      t0=$(date +%s.%N)
      python3 -c "
import time,importlib; from fp8_linear.backends.sm90 import kernels_module
jit=importlib.import_module(kernels_module().__name__+'.jit'); t=time.perf_counter(); jit.load(); print('load s', time.perf_counter()-t)" 2>&1 | tee "$OUT/build.txt" || exit 1
      so=$(ls $FP8_LINEAR_CACHE/sm90-*/*.so | head -1)
      cuobjdump --dump-sass "$so" > /tmp/sass.txt
      echo "QGMMA count: $(grep -c QGMMA /tmp/sass.txt), LDL/STL: $(grep -cE '\b(LDL|STL)\b' /tmp/sass.txt)" | tee -a "$OUT/build.txt"
      grep -o "QGMMA[.A-Za-z0-9]*" /tmp/sass.txt | sort | uniq -c | tee -a "$OUT/build.txt"
      ;;
    smoke)
      # each config alone on small awkward shapes (a hang shows up as its timeout); configs that fail
      # are left out of benchbig and the tests stage is skipped (a hanging config would eat the call)
      SMOKE_BAD=""
      FP8_LINEAR_SM90_VERBOSE=1 timeout 60 python3 benchmarks/sanitize_driver.py > "$OUT/smoke.txt" 2>&1 \
        && { tail -n 1 "$OUT/smoke.txt"; continue; }
      echo "smoke over all configs failed: one at a time" | tee -a "$OUT/smoke.txt"
      ncfg=$(python3 -c "from fp8_linear.backends.sm90 import kernels_module; print(len(kernels_module().CONFIGS))")
      for c in $(seq 0 $((ncfg - 1))); do
        FP8_LINEAR_SM90_VERBOSE=1 timeout 40 python3 benchmarks/sanitize_driver.py --configs $c >> "$OUT/smoke.txt" 2>&1 \
          || SMOKE_BAD="$SMOKE_BAD $c"
      done
      echo "smoke: failed configs:${SMOKE_BAD:- none}" | tee -a "$OUT/smoke.txt"
      ;;
    tests)
      [ -n "${SMOKE_BAD:-}" ] && { echo "tests skipped: smoke failed for configs$SMOKE_BAD"; continue; }
      timeout 420 python3 -m pytest tests/kernels -q --maxfail=10 --timeout=120 -p no:cacheprovider --tb=short --durations=8 2>&1 | tail -n 150 | tee "$OUT/tests.txt"
      ;;
    testsfull)
      timeout 540 python3 -m pytest tests/kernels -q -p no:cacheprovider -rs --durations=8 2>&1 | tail -n 80 | tee "$OUT/tests.txt"
      ;;
    quickbench)
      timeout 300 python3 benchmarks/gemm.py --quick --configs 0,5 --rep 30 --out "$OUT" --tag quick 2>&1 | tee "$OUT/quickbench.txt"
      ;;
    benchbig)
      # the judged set (M >= 2048) with every large-M config forced as well: BENCH_CONFIGS, BENCH_TAG
      cfgs=${BENCH_CONFIGS:-0,6}
      for c in ${SMOKE_BAD:-}; do cfgs=$(echo ",$cfgs," | sed "s/,$c,/,/g; s/^,//; s/,$//"); done
      timeout 400 python3 benchmarks/gemm.py --min-m 2048 --configs "$cfgs" --rep 20 --rounds 2 \
        --out "$OUT" --tag "${BENCH_TAG:-big}" 2>&1 | tee "$OUT/benchbig.txt"
      ;;
    ncu)
      # ncu at 8192^3 on NCU_CONFIGS, the card's own clocks (--clock-control none)
      NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
      for c in ${NCU_CONFIGS:-0}; do
        timeout 120 "$NCU" --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
          python3 -P benchmarks/profile_one.py --config "$c" > "$OUT/ncu-cfg$c.txt" 2>&1
        echo "ncu config $c: rc=$? $(grep -E 'Duration|SM Frequency|Compute \(SM\) Throughput' "$OUT/ncu-cfg$c.txt" | tr -s ' ' | tr '\n' ';')"
      done
      ;;
    ncusrc)
      # per-SASS-instruction stall samples of NCU_CONFIGS at 8192^3 (where the warps wait)
      NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
      for c in ${NCU_CONFIGS:-0}; do
        timeout 150 "$NCU" --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
          --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
          python3 -P benchmarks/profile_one.py --config "$c" > "$OUT/ncusrc-cfg$c.csv" 2>&1
        echo "ncu source config $c: rc=$? lines $(wc -l < "$OUT/ncusrc-cfg$c.csv")"
      done
      ;;
    steady)
      # steady-state A/B (each candidate alone 0.4 s, then timed): STEADY_SET (five|judged), STEADY_CONFIGS
      timeout 420 python3 -P benchmarks/steady_bench.py --set "${STEADY_SET:-judged}" --configs "${STEADY_CONFIGS:-}" \
        --burn 0.4 --rep 300 --rounds 2 --json "$OUT/steady-${BENCH_TAG:-run}.json" 2>&1 | tee "$OUT/steady.txt"
      ;;
    energy)
      # SM clock, watts and tensor-core use per clock of cuBLASLt, auto and ENERGY_CONFIGS (NVML)
      timeout 200 python3 -P benchmarks/energy_bench.py --configs "${ENERGY_CONFIGS:-7,10}" \
        --json "$OUT/energy.json" 2>&1 | tee "$OUT/energy.txt"
      ;;
    raster)
      # tile raster group heights (FP8_LINEAR_SM90_GROUP_M) for RASTER_CONFIGS
      timeout 200 python3 -P benchmarks/raster_bench.py --configs "${RASTER_CONFIGS:-7,10}" \
        --json "$OUT/raster.json" 2>&1 | tee "$OUT/raster.txt"
      ;;
    host)
      # host-side microseconds per decode-size call, piece by piece (+ a profiler table)
      timeout 120 python3 -P benchmarks/host_overhead.py --profile 2>&1 | tee "$OUT/host.txt"
      ;;
    bench)
      timeout 540 python3 benchmarks/gemm.py --rep "${BENCH_REP:-25}" --rounds "${BENCH_ROUNDS:-3}" --configs "${BENCH_CONFIGS:-}" --out "$OUT" \
        --tag "${BENCH_TAG:-}" 2>&1 | tee "$OUT/bench.txt"
      ;;
    sanitize)
      timeout 400 benchmarks/sanitize.sh 2>&1 | tee "$OUT/sanitize.txt"
      ;;
    ab)
      # two kernel sources in one session: the working tree's kernels/ ("new") against AB_OLD (a copy of
      # another kernels/ folder, e.g. `git archive HEAD kernels`), steady_bench --set five in the order
      # new/old/new/old (AB_ORDER), tables appended to $OUT/ab.txt (text only: the device returns at most
      # 8 files); kernels/ is the new one again afterwards
      [ -d "${AB_OLD:-}" ] || { echo "ab: AB_OLD=$AB_OLD is not a folder"; exit 1; }
      rm -rf /tmp/ab_new_kernels && cp -r kernels /tmp/ab_new_kernels
      for v in ${AB_ORDER:-new old new old}; do
        rm -rf kernels && if [ "$v" = old ]; then cp -r "$AB_OLD" kernels; else cp -r /tmp/ab_new_kernels kernels; fi
        python3 -c "import importlib; from fp8_linear.backends.sm90 import kernels_module; importlib.import_module(kernels_module().__name__ + '.jit').load()" > /dev/null 2>&1 \
          || { echo "ab: the $v kernels did not build"; break; }
        echo "=== $v $(date +%T)" | tee -a "$OUT/ab.txt"
        timeout 60 python3 -P benchmarks/steady_bench.py --set five --warm 2 --burn 0.4 --rep 300 --rounds 2 2>&1 \
          | tail -n 7 | tee -a "$OUT/ab.txt"
      done
      rm -rf kernels && cp -r /tmp/ab_new_kernels kernels
      ;;
  esac
done
echo "===== done $(date +%T)"
