"""The safetensors files of a checkpoint folder, their headers checked before any tensor is read.

A folder holds ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor: file}}``). The index is checked first (an object of tensor names to
plain ``*.safetensors`` names inside the folder, see ``folder.py``); then each file's header is parsed
by hand (8-byte little-endian length, JSON) and checked entry by entry as the safetensors format
defines it, so that a truncated file, a header that is not an object, a string offset or shape,
overlapping or gapped byte ranges, or an index that disagrees with the shards is refused with
the file's name before anything is materialized.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import CheckpointError
from .folder import CheckpointFolder, check_relative_name, parse_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_SUFFIX = ".safetensors"
HEADER_LEN_BYTES = 8
#: Refuse absurd headers before reading them (safetensors itself caps headers at 100 MB).
MAX_HEADER_BYTES = 100_000_000
#: Most dimensions a stored tensor may have (safetensors has no limit; real checkpoints use <= 5).
MAX_DIMS = 8
#: Bytes per element of each safetensors dtype string.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


@dataclass(frozen=True)
class TensorInfo:
    """Header entry of one stored tensor: its file (path for messages), safetensors dtype string and shape;
    ``name`` is the file's name inside the checkpoint folder."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    name: str = ""


def _is_index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(fname: str, key, entry) -> tuple[str, tuple[int, ...], int, int]:
    """``(dtype, shape, begin, end)`` of one header entry, every field type- and range-checked."""
    if not isinstance(key, str) or not key:
        raise CheckpointError(f"{fname}: expected tensor names as non-empty strings, got {key!r}")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"{fname}: tensor {key!r} expected a header entry with dtype, shape and data_offsets, got {got!r}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{fname}: tensor {key!r} expected a dtype of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_index(d) for d in shape):
        raise CheckpointError(f"{fname}: tensor {key!r} expected a shape of at most {MAX_DIMS} non-negative ints, got {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_index(o) for o in offsets):
        raise CheckpointError(f"{fname}: tensor {key!r} expected data_offsets [begin, end] of non-negative ints, got {offsets!r}")
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != nbytes:
        raise CheckpointError(
            f"{fname}: tensor {key!r} expected {nbytes} bytes for {dtype} {list(shape)}, header says [{begin}, {end})")
    return dtype, tuple(shape), begin, end


def read_header(folder: CheckpointFolder, name: str) -> dict[str, TensorInfo]:
    """Parse and check the header of safetensors file ``name`` of ``folder``: ``{tensor: TensorInfo}``.

    Raises :class:`CheckpointError` naming the file (and tensor) when the file is shorter than its
    header says, the header is not a JSON object of well-formed entries, or the tensors' byte ranges
    do not tile the data exactly (as safetensors requires: no gap, no overlap, nothing after)."""
    fname = folder.display(name)
    f = folder.open(name, fname)
    size = folder.size(name)
    try:
        f.seek(0)
        raw = f.read(HEADER_LEN_BYTES)
        if len(raw) < HEADER_LEN_BYTES:
            raise CheckpointError(f"{fname}: expected a safetensors file, got {size} bytes (truncated)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or HEADER_LEN_BYTES + n > size:
            raise CheckpointError(f"{fname}: header of {n} bytes does not fit in the file of {size} bytes (truncated)")
        text = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{fname}: cannot read ({e})") from e
    if not text.lstrip(b" ").startswith(b"{"):
        raise CheckpointError(f"{fname}: expected a JSON safetensors header (an object), got {text[:40]!r}")
    try:
        header = parse_json_object(text.rstrip(b" "), fname)
    except CheckpointError as e:
        raise CheckpointError(f"{fname}: expected a JSON safetensors header, got {e}") from e
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{fname}: expected __metadata__ as an object of strings, got {meta!r:.200}")
    data_len = size - HEADER_LEN_BYTES - n
    out, ranges = {}, []
    for key, entry in header.items():
        dtype, shape, begin, end = _entry(fname, key, entry)
        if end > data_len:
            raise CheckpointError(
                f"{fname}: tensor {key!r} ends at byte {end} of the data but the file holds {data_len} (truncated)")
        ranges.append((begin, end, key))
        out[key] = TensorInfo(fname, dtype, shape, name)
    at = 0
    for begin, end, key in sorted(ranges):
        if begin != at:
            raise CheckpointError(f"{fname}: tensor {key!r} starts at byte {begin} of the data, expected {at} "
                                  f"({'overlapping' if begin < at else 'a gap before it'})")
        at = end
    if at != data_len:
        raise CheckpointError(f"{fname}: expected {at} data bytes after the header, got {data_len}")
    return out


def _weight_map(folder: CheckpointFolder) -> dict[str, str]:
    where = folder.display(INDEX_FILE)
    weight_map = folder.read_json(INDEX_FILE).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{where}: expected a non-empty 'weight_map', got {weight_map!r:.200}")
    for key, fname in weight_map.items():
        check_relative_name(fname, f"{where} weight_map[{key!r}]")
        if not fname.endswith(SHARD_SUFFIX):
            raise CheckpointError(f"{where} weight_map[{key!r}]: expected a {SHARD_SUFFIX} file, got {fname!r}")
    return weight_map


def list_tensors(folder: str | CheckpointFolder) -> dict[str, TensorInfo]:
    """Every stored tensor of the checkpoint in ``folder``, headers checked (see :func:`read_header`)."""
    if not isinstance(folder, CheckpointFolder):
        with CheckpointFolder(folder) as opened:
            return list_tensors(opened)
    if folder.exists(INDEX_FILE):
        weight_map = _weight_map(folder)
        files = sorted(set(weight_map.values()))
    elif folder.exists(SINGLE_FILE):
        weight_map, files = None, [SINGLE_FILE]
    else:
        raise CheckpointError(f"{folder.path}: expected {SINGLE_FILE} or {INDEX_FILE}, found neither")
    tensors: dict[str, TensorInfo] = {}
    for fname in files:
        if weight_map is not None and not folder.exists(fname):
            raise CheckpointError(f"{fname}: listed in {INDEX_FILE} but missing from {folder.path}")
        for key, info in read_header(folder, fname).items():
            if key in tensors:
                raise CheckpointError(f"{fname}: tensor {key!r} is also stored in {tensors[key].name}")
            if weight_map is not None and weight_map.get(key) != fname:
                raise CheckpointError(f"{fname}: tensor {key!r} is stored here but {INDEX_FILE} maps it to {weight_map.get(key)!r}")
            tensors[key] = info
    if weight_map is not None:
        lost = sorted(set(weight_map) - set(tensors))
        if lost:
            raise CheckpointError(f"{INDEX_FILE}: tensor {lost[0]!r} is mapped to {weight_map[lost[0]]!r} but not stored there "
                                  f"({len(lost)} such tensors)")
    return tensors
