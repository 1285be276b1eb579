# Sourced by a one-call device script as its first step, from the repository root: the environment
# (offline, the extension cache inside the tree, $OUT), `el` (seconds since the start), the editable
# install, the kernel build with its SASS summary, then the smoke sweep over every config; exits the
# script if the smoke sweep finds a wrong result.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 FP8_LINEAR_CACHE=$PWD/.fp8_cache
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
OUT=$OUT benchmarks/tools/device_run.sh build 2>&1 | grep -E "load s|wgmma|spill|rror" | head
timeout 90 python3 -m benchmarks.tools.sanitize_driver > "$OUT/smoke.txt" 2>&1; rc=$?; echo "smoke rc=$rc"; tail -1 "$OUT/smoke.txt"
[ $rc -ne 0 ] && { tail -20 "$OUT/smoke.txt"; exit 1; }
