#!/usr/bin/env bash
# ncu profile of sm90 kernel configs on one shape (default 8192^3): speed of light, memory, warp
# stalls, scheduler (PROFILE_ARGS="--block" PROFILE_TAG=-block: extra profile_one flags, log name suffix). Usage: benchmarks/tools/profile.sh "0 5" 8192 8192 8192   (logs to $OUT/ncu-cfg*.txt)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
CFGS=${1:-"0 5"}; shift || true
SHAPE=${*:-"8192 8192 8192"}
NCU=${NCU:-ncu}; command -v "$NCU" >/dev/null 2>&1 || NCU=/usr/local/cuda/bin/ncu
for c in $CFGS; do
  timeout 180 "$NCU" --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis \
    python3 -m benchmarks.tools.profile_one --config "$c" --shape $SHAPE ${PROFILE_ARGS:-} > "$OUT/ncu-cfg$c${PROFILE_TAG:-}.txt" 2>&1
  echo "ncu config $c: rc=$? $(grep -E 'Duration|Compute \(SM\) Throughput' "$OUT/ncu-cfg$c${PROFILE_TAG:-}.txt" | tr -s ' ' | tr '\n' ';')"
done
