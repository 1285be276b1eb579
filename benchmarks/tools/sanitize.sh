#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over a small awkward-shape sweep of
# every sm90 kernel config (benchmarks/tools/sanitize_driver.py). Prints each tool's error count.
# Usage: benchmarks/tools/sanitize.sh   (needs an sm90 GPU; builds the kernel first, outside the sanitizer)
#        SANITIZE_TOOLS="synccheck" SANITIZE_CONFIGS="1,7" benchmarks/tools/sanitize.sh   (subsets of tools / configs)
#        SANITIZE_ARGS=--block benchmarks/tools/sanitize.sh   (the block-scaled launches instead)
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
command -v "$CS" >/dev/null 2>&1 || CS=/usr/local/cuda/bin/compute-sanitizer
echo "== plain run (builds the kernel if needed)"
$PY -m benchmarks.tools.sanitize_driver --configs "${SANITIZE_CONFIGS:-}" ${SANITIZE_ARGS:-} || { echo "driver failed without sanitizer"; exit 1; }
status=0
for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
  log=$(mktemp)
  extra=""
  [ "$tool" = racecheck ] && extra="--racecheck-report all"
  echo "== $tool"
  $CS --tool $tool $extra --print-limit 20 $PY -m benchmarks.tools.sanitize_driver --configs "${SANITIZE_CONFIGS:-}" ${SANITIZE_ARGS:-} >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
  tail -n 3 "$log" | sed 's/^/   /'
  echo "$tool: rc=$rc ${summary:-no summary line}"
  if [ $rc -ne 0 ] || ! echo "$summary" | grep -qE " 0 (errors|hazards)"; then
    status=1
    grep -E "=========" "$log" | head -40
  fi
  rm -f "$log"
done
echo "sanitize.sh: $([ $status -eq 0 ] && echo 'all clean' || echo 'ERRORS found')"
exit $status
