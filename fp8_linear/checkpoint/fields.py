"""Typed reads of the fields of an untrusted checkpoint config (``config.json`` and friends).

Each getter returns the field's value when it has the expected JSON type (and range / choices),
its default when absent or ``null``, and raises :class:`CheckpointError` naming the field
(``where``), the expected and the actual value otherwise. JSON booleans are never ints here.
"""

from __future__ import annotations

import math

from ..errors import CheckpointError

_MISSING = object()


def fail(where: str, expected: str, got) -> CheckpointError:
    """The error for field ``where``: ``expected ...``, ``got ...`` (the value's repr, cut at 200 characters)."""
    return CheckpointError(f"{where}: expected {expected}, got {got!r:.200}")


def is_int(v) -> bool:
    """True for a JSON integer (not a boolean)."""
    return isinstance(v, int) and not isinstance(v, bool)


def get_str(d: dict, key: str, where: str, choices=None, default=None, lower: bool = False):
    """``d[key]`` as a string (one of ``choices`` when given; compared lower-cased when ``lower``)."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise fail(f"{where}.{key}", f"a string{f' (one of {list(choices)})' if choices else ''}", v)
    if lower:
        v = v.lower()
    if choices is not None and v not in choices:
        raise fail(f"{where}.{key}", f"one of {list(choices)}", v)
    return v


def get_bool(d: dict, key: str, where: str, default=None):
    """``d[key]`` as a JSON boolean."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise fail(f"{where}.{key}", "true or false", v)
    return v


def get_int(d: dict, key: str, where: str, lo: int | None = None, hi: int | None = None, default=None):
    """``d[key]`` as a JSON integer in ``[lo, hi]``."""
    v = d.get(key)
    if v is None:
        return default
    if not is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f" in [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]" if lo is not None or hi is not None else ""
        raise fail(f"{where}.{key}", f"an integer{rng}", v)
    return v


def get_number(d: dict, key: str, where: str, positive: bool = False, default=None):
    """``d[key]`` as a finite JSON number (``> 0`` when ``positive``, else ``>= 0``)."""
    v = d.get(key)
    if v is None:
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise fail(f"{where}.{key}", f"a finite number {'> 0' if positive else '>= 0'}", v)
    return v


def get_dict(d: dict, key: str, where: str, default=_MISSING):
    """``d[key]`` as a JSON object (``default`` when absent or null; required when no default)."""
    v = d.get(key)
    if v is None and default is not _MISSING:
        return default
    if not isinstance(v, dict):
        raise fail(f"{where}.{key}", "an object", v)
    return v


def get_int_list(d: dict, key: str, where: str, default=None):
    """``d[key]`` as a list of JSON integers."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, list) or not all(is_int(x) for x in v):
        raise fail(f"{where}.{key}", "a list of integers", v)
    return v
