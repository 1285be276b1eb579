"""Calibration / evaluation data named on the command line, read and checked before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

from .checks import check_input_file
from .common import CLIError

DATA_HELP = ("a .txt file (one sample per paragraph), a .jsonl file (a 'text' or 'input_ids' field per line), "
             "a dataset folder saved with datasets.save_to_disk, 'bundled' (Python's own pydoc_data text; "
             "calibration and evaluation use disjoint splits of it) or 'stdlib' (the docstrings of 67 "
             "standard-library modules: text no calibration default was chosen on)")
BUNDLED_DATA = "bundled"
#: The second bundled text: :func:`fp8_linear.calibration.stdlib_text.stdlib_text`, one sample per paragraph (as a .txt file of it would be read).
STDLIB_DATA = "stdlib"
#: Data fields a JSONL line or a dataset column may hold, in the order they are looked for.
TEXT_FIELD, IDS_FIELD, MASK_FIELD = "text", "input_ids", "attention_mask"
#: Bytes read to tell a binary file from text.
SNIFF_BYTES = 8192


def _decode(p: Path, flag: str) -> str:
    raw = p.read_bytes()
    if b"\x00" in raw[:SNIFF_BYTES]:
        raise CLIError(f"{flag}: {str(p)!r} is a binary file (NUL bytes), expected UTF-8 text ({DATA_HELP})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CLIError(f"{flag}: {str(p)!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def _token_ids(v, where: str, field: str) -> list[int]:
    if not isinstance(v, list):
        raise CLIError(f"{where}: '{field}' must be a list of integers, got {_kind(v)}")
    if not v:
        raise CLIError(f"{where}: '{field}' is an empty list")
    bad = [i for i in v if not isinstance(i, int) or isinstance(i, bool)]
    if bad:
        raise CLIError(f"{where}: '{field}' must hold integers only, got {_kind(bad[0])} ({json.dumps(bad[0])[:20]})")
    if min(v) < 0:
        raise CLIError(f"{where}: '{field}' holds the negative token id {min(v)}")
    return v


def _jsonl_rows(p: Path, flag: str) -> list:
    """Strings (``text`` lines) or ``{"input_ids", "attention_mask"}`` dicts, one per non-blank line;
    line numbers in errors are the file's own (1-based, blank lines counted)."""
    rows, kind = [], None
    for n, line in enumerate(_decode(p, flag).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{flag}: {str(p)!r} line {n}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise CLIError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(r, dict):
            raise CLIError(f"{where}: expected a JSON object with a '{TEXT_FIELD}' or '{IDS_FIELD}' field, got {_kind(r)}")
        this = TEXT_FIELD if TEXT_FIELD in r else IDS_FIELD if IDS_FIELD in r else None
        if this is None:
            raise CLIError(f"{where}: expected a '{TEXT_FIELD}' or '{IDS_FIELD}' field, got the keys {sorted(r)[:8]}")
        if kind is not None and this != kind:
            raise CLIError(f"{where}: has '{this}' but the lines before it have '{kind}'; use one field in the whole file")
        kind = this
        if this == TEXT_FIELD:
            if not isinstance(r[TEXT_FIELD], str):
                raise CLIError(f"{where}: '{TEXT_FIELD}' must be a string, got {_kind(r[TEXT_FIELD])}")
            rows.append(r[TEXT_FIELD])
            continue
        row = {IDS_FIELD: _token_ids(r[IDS_FIELD], where, IDS_FIELD)}
        if MASK_FIELD in r:
            mask = _token_ids(r[MASK_FIELD], where, MASK_FIELD)
            if len(mask) != len(row[IDS_FIELD]) or set(mask) - {0, 1}:
                raise CLIError(f"{where}: '{MASK_FIELD}' must be 0/1 values, one per input id ({len(row[IDS_FIELD])})")
            row[MASK_FIELD] = mask
        rows.append(row)
    if not rows:
        raise CLIError(f"{flag}: {str(p)!r} has no JSON lines")
    return rows


def _dataset(p: Path, flag: str):
    try:
        import datasets
    except ImportError as e:
        raise CLIError(f"{flag}: {str(p)!r} is a folder; reading a saved dataset needs the 'datasets' package ({e})") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # datasets raises FileNotFoundError, ValueError, its own errors: all mean "not a dataset"
        raise CLIError(f"{flag}: {str(p)!r} is not a dataset saved with datasets.save_to_disk ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if not ds:
            raise CLIError(f"{flag}: {str(p)!r} is a dataset with no splits")
        ds = ds["train" if "train" in ds else next(iter(ds))]
    cols = getattr(ds, "column_names", None) or []
    if TEXT_FIELD not in cols and IDS_FIELD not in cols:
        raise CLIError(f"{flag}: the dataset {str(p)!r} needs a '{TEXT_FIELD}' or '{IDS_FIELD}' column, got {cols[:8]}")
    if len(ds) == 0:
        raise CLIError(f"{flag}: the dataset {str(p)!r} has no rows")
    return ds


def read_data(spec: str | None, flag: str = "--data"):
    """The data named by ``flag`` on the command line, checked and parsed.

    ``None`` or ``"bundled"`` -> ``None`` (the package's embedded corpus split); ``"stdlib"`` -> the
    paragraphs of :func:`~fp8_linear.calibration.stdlib_text.stdlib_text`; ``*.jsonl`` -> a list
    of strings (field ``text``) or of dicts (``input_ids``, optional ``attention_mask``); a folder ->
    ``datasets.load_from_disk``; any other file -> its paragraphs (blank-line separated), read as UTF-8.
    Every problem is a :class:`CLIError` naming ``flag`` and the file (and the line, for JSONL).
    """
    if spec is None or spec == BUNDLED_DATA:
        return None
    if spec == STDLIB_DATA:
        from fp8_linear.calibration.stdlib_text import stdlib_text

        try:
            return _paragraphs(stdlib_text())
        except RuntimeError as e:  # a Python installed without its .py sources
            raise CLIError(f"{flag}: {STDLIB_DATA!r}: {e}") from None
    p = check_input_file(spec, flag, folder_ok=True)
    if p.is_dir():
        return _dataset(p, flag)
    if p.suffix.lower() == ".jsonl":
        return _jsonl_rows(p, flag)
    paras = _paragraphs(_decode(p, flag))
    if not paras:
        raise CLIError(f"{flag}: {str(p)!r} is empty")
    return paras


def _paragraphs(text: str) -> list[str]:
    """The non-empty paragraphs (blank-line separated, stripped) of ``text``."""
    return [s.strip() for s in text.replace("\r\n", "\n").split("\n\n") if s.strip()]
