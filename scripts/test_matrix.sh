#!/usr/bin/env bash
# The test suite under each CPU capability x torch thread count, one run after the other (make test-matrix).
#   bash scripts/test_matrix.sh                     # default avx2 native  x  1 2 threads
#   CAPABILITIES="avx2" THREADS="2" bash scripts/test_matrix.sh
#   CAPABILITIES="default" PYTEST_ARGS='-m "not slow"' bash scripts/test_matrix.sh   (a marker expression)
# A capability is what torch computes with:
#   native   nothing set: the kernels torch and MKL pick for this CPU
#   avx2     ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2: what an AVX2-only
#            x86 CPU computes (ATEN_CPU_CAPABILITY alone leaves MKL's fp32 GEMMs on their AVX-512 kernels,
#            docs/accuracy.md, and oneDNN on AMX, where torch 2.13's bf16 CPU attention then fails with
#            "pack_vnni2 is only supported when avx512 is supported", docs/testing.md)
#   default  ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41: ATen's unvectorized kernels
#   aten-avx2  ATEN_CPU_CAPABILITY=avx2 alone
# The thread count is OMP_NUM_THREADS, which torch's intra-op pool follows (the CLI tests restore it after
# each test that changes it). Each setting's full output goes to $MATRIX_LOGS/<capability>-t<threads>.log;
# one summary line per setting is printed as it ends. Exit status 1 when any setting failed.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
CAPABILITIES=${CAPABILITIES:-default avx2 native}
THREADS=${THREADS:-1 2}
MATRIX_LOGS=${MATRIX_LOGS:-test-matrix}
mkdir -p "$MATRIX_LOGS"
# PYTEST_ARGS with shell quoting kept: PYTEST_ARGS='-m "not slow"' is two arguments
eval "extra=(${PYTEST_ARGS:-})"
failed=0
for cap in $CAPABILITIES; do
  case $cap in
    native) capenv=() ;;
    avx2) capenv=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2) ;;
    aten-avx2) capenv=(ATEN_CPU_CAPABILITY=avx2) ;;
    default) capenv=(ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41) ;;
    *) echo "test_matrix: unknown capability $cap (native, avx2, aten-avx2, default)" >&2; exit 2 ;;
  esac
  for t in $THREADS; do
    log="$MATRIX_LOGS/$cap-t$t.log"
    run=(env -u ATEN_CPU_CAPABILITY -u MKL_ENABLE_INSTRUCTIONS -u ONEDNN_MAX_CPU_ISA "${capenv[@]}" OMP_NUM_THREADS="$t" HF_HUB_OFFLINE=1)
    seen=$("${run[@]}" "$VENV/bin/python" -c \
      "import torch; print(f'torch sees {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads')")
    start=$(date +%s)
    "${run[@]}" "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "${extra[@]}" > "$log" 2>&1
    rc=$?
    [ $rc -eq 5 ] && rc=1  # no tests collected is a failure
    [ $rc -ne 0 ] && failed=1
    printf '%-76s %-38s rc=%d %5ds  %s\n' "${capenv[*]:-(native)}" "OMP_NUM_THREADS=$t ($seen)" "$rc" \
      "$(( $(date +%s) - start ))" "$(grep -E '[0-9]+ (passed|failed|error)' "$log" | tail -1)"
  done
done
exit $failed
