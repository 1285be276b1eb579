"""Reliability tests: ``tests/reliability`` is importable (``from catalogue import Bad``)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
