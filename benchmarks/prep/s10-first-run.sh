#!/usr/bin/env bash
# First device call of session 10 (one `run`, ~400 s): where the per-channel launches' time goes, line by
# line, in main's kernel (v16) and in the two session 9 variants that moved the epilogue's global loads
# (NOTES, session 9): v19 (24 more per-thread scale loads after the first k-block's issue: per-channel
# +4-6% slower, shared-memory wavefronts -75%) and v20 (the operands loaded before the last k-block's
# drain: per-tensor up to +3.7% slower, per-channel unchanged). ncu source counters (stall reasons per
# SASS line) of config 7 at 6144^2 x 1280, per-tensor and per-channel, for each of the three builds; the
# patches are applied on the device's copy (git apply, or patch -p1) and reverted after. Compare locally with
#   python benchmarks/ncu_source_diff.py A.csv B.csv --top 25
# Last, v16 with the prefetch before the first issue (prep/s10-prefetch-first.patch): durations only (log).
# Then: run(command="bash benchmarks/prep/s10-first-run.sh")   -- six CSVs + build log in $OUT, ~500 s
source benchmarks/device_prelude.sh
rm -f $OUT/smoke.txt  # at most 8 files come back: build.txt + six CSVs; the smoke line is in the log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
build() {
  python3 -c "import importlib; from fp8_linear.backends.sm90 import kernels_module; importlib.import_module(kernels_module().__name__ + '.jit').load()" > /dev/null 2>&1
}
src() {  # $1: build name; writes src-$1-t.csv and src-$1-ch.csv
  for kind in t ch; do
    flag=""; [ $kind = ch ] && flag="--channel"
    timeout 60 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
      --section SourceCounters --page source --print-source sass --csv \
      python3 -P benchmarks/profile_one.py --config 7 --shape 6144 6144 1280 $flag > $OUT/src-$1-$kind.csv 2>&1
    echo "src $1 $kind rc=$? lines $(wc -l < $OUT/src-$1-$kind.csv) at $(el) s"
  done
}
src v16
for p in run5/v19-col-pre.patch run6/v20-next-tile-prefetch.patch; do
  name=$(basename $p .patch | cut -d- -f1)
  f=benchmarks/results/session9/$p
  git apply $f 2>/dev/null || patch -p1 -s < $f || { echo "applying $p failed"; continue; }
  build && echo "$name built at $(el) s" && src $name
  git apply -R $f 2>/dev/null || patch -p1 -R -s < $f
done
# v16 with the epilogue prefetch back before the first k-block's issue (v15's place; the FastDiv tile walk
# kept): did the placement or the divisions cost per-channel its share of v16's gain (NOTES, session 8)?
# ncu durations of configs 7 / 10, per-tensor and per-channel, main's build first for the same clock.
f=benchmarks/prep/s10-prefetch-first.patch
times() {  # $1: build name
  for c in 7 10; do for kind in t ch; do
    flag=""; [ $kind = ch ] && flag="--channel"
    timeout 30 $NCU --clock-control none --kernel-name regex:fp8_gemm_sm90 --launch-skip 2 --launch-count 1 \
      --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second \
      python3 -P benchmarks/profile_one.py --config $c --shape 6144 6144 1280 $flag > /tmp/n.txt 2>&1
    echo "ncu $1 c$c $kind: $(grep -E 'gpu__time|per_second' /tmp/n.txt | tr -s ' ' | rev | cut -d' ' -f1 | rev | tr '\n' ';')"
  done; done
}
build && times v16
git apply $f 2>/dev/null || patch -p1 -s < $f || echo "applying $f failed"
build && echo "prefetch-first built at $(el) s" && times pf1
git apply -R $f 2>/dev/null || patch -p1 -R -s < $f
echo "=== end $(el) s"
