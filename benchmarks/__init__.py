"""Benchmarks of fp8-linear, run from the repository root as modules: ``python -m benchmarks.gemm_bench``.

``benchmarks.common`` holds what they share (shape sets, timing, operands, results); ``benchmarks.tools``
the profiling helpers (ncu, compute-sanitizer, SASS diffs). Nothing here is installed with the package.
"""
