"""Kernel names to categories: the first ``(label, regular expression)`` of a table that matches a GPU
kernel's name (the profiles' tables: ``benchmarks.step_profile.CATEGORIES``, ``benchmarks.moe_profile.CATEGORIES``)."""

from __future__ import annotations

import re


def first_match(name: str, table: tuple[tuple[str, str], ...], default: str = "other") -> str:
    """The label of the first ``(label, pattern)`` in ``table`` whose pattern ``re.search``es ``name``,
    else ``default``."""
    return next((label for label, pattern in table if re.search(pattern, name)), default)
