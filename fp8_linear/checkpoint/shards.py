"""The safetensors files of a checkpoint folder, their headers checked before any tensor is read.

A folder holds ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor: file}}``). Each file's header is parsed by hand (8-byte little-endian
length, JSON) so that a truncated file, a header that overruns it, or an index that disagrees with
the shards is refused with the file's name, before anything is materialized.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from ..errors import CheckpointError
from .readers import read_json

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_LEN_BYTES = 8
#: Refuse absurd headers before reading them (safetensors itself caps headers at 100 MB).
MAX_HEADER_BYTES = 100_000_000
#: Bytes per element of each safetensors dtype string.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


@dataclass(frozen=True)
class TensorInfo:
    """Header entry of one stored tensor: its file, safetensors dtype string and shape."""

    file: str
    dtype: str
    shape: tuple[int, ...]


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parse and check the header of safetensors file ``path``: ``{name: TensorInfo}``.

    Raises :class:`CheckpointError` naming the file (and tensor) when the file is shorter than its
    header says, a tensor's byte range does not match its dtype and shape, or the header is not JSON.
    """
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER_LEN_BYTES)
            if len(raw) < HEADER_LEN_BYTES:
                raise CheckpointError(f"{name}: expected a safetensors file, got {size} bytes (truncated)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES or HEADER_LEN_BYTES + n > size:
                raise CheckpointError(f"{name}: header of {n} bytes does not fit in the file of {size} bytes (truncated)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{name}: cannot read ({e})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{name}: expected a JSON safetensors header, got {e}") from e
    header.pop("__metadata__", None)
    data_len = size - HEADER_LEN_BYTES - n
    out, end_max = {}, 0
    for key, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{name}: tensor {key!r} has a malformed header entry {entry!r}") from e
        nbytes = math.prod(shape) * DTYPE_BYTES.get(dtype, 0)
        if dtype not in DTYPE_BYTES or end - begin != nbytes or begin < 0:
            raise CheckpointError(
                f"{name}: tensor {key!r} expected {nbytes} bytes for {dtype} {list(shape)}, header says [{begin}, {end})")
        if end > data_len:
            raise CheckpointError(
                f"{name}: tensor {key!r} ends at byte {end} of the data but the file holds {data_len} (truncated)")
        end_max = max(end_max, end)
        out[key] = TensorInfo(path, dtype, shape)
    if end_max != data_len:
        raise CheckpointError(f"{name}: expected {end_max} data bytes after the header, got {data_len}")
    return out


def list_tensors(folder: str) -> dict[str, TensorInfo]:
    """Every stored tensor of the checkpoint in ``folder``, headers checked (see :func:`read_header`)."""
    index_path = os.path.join(folder, INDEX_FILE)
    single = os.path.join(folder, SINGLE_FILE)
    if os.path.exists(index_path):
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{INDEX_FILE}: expected a non-empty 'weight_map', got {weight_map!r}")
        files = sorted(set(weight_map.values()))
    elif os.path.exists(single):
        weight_map, files = None, [SINGLE_FILE]
    else:
        raise CheckpointError(f"{folder}: expected {SINGLE_FILE} or {INDEX_FILE}, found neither")
    tensors: dict[str, TensorInfo] = {}
    for fname in files:
        path = os.path.join(folder, fname)
        if not os.path.isfile(path):
            raise CheckpointError(f"{fname}: listed in {INDEX_FILE} but missing from {folder}")
        for key, info in read_header(path).items():
            if key in tensors:
                raise CheckpointError(f"{fname}: tensor {key!r} is also stored in {os.path.basename(tensors[key].file)}")
            if weight_map is not None and weight_map.get(key) != fname:
                raise CheckpointError(f"{fname}: tensor {key!r} is stored here but {INDEX_FILE} maps it to {weight_map.get(key)!r}")
            tensors[key] = info
    if weight_map is not None:
        lost = sorted(set(weight_map) - set(tensors))
        if lost:
            raise CheckpointError(f"{INDEX_FILE}: tensor {lost[0]!r} is mapped to {weight_map[lost[0]]!r} but not stored there "
                                  f"({len(lost)} such tensors)")
    return tensors
