"""Profiling helpers: ncu targets and source-counter diffs, the compute-sanitizer sweep, SASS diffs,
and the one-call device scripts (``device_run.sh``, ``device_prelude.sh``)."""
