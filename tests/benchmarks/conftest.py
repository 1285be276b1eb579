"""The benchmarks are a plain package in the repository root (``python -m benchmarks.gemm_bench``);
``python -m pytest`` from the root finds it, and this puts the root on the path for a bare ``pytest``."""

import pathlib
import sys

ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
