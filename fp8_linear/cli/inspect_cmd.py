"""``fp8-linear inspect CHECKPOINT``: a checkpoint's schemes, tensors, dtypes and sizes, read from
``config.json`` and the safetensors headers (no tensor data is read)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .checks import check_path_length
from .common import EXIT_OK, CLIError, result
from .options import add_output_options

#: Bytes of the little-endian length that precedes a safetensors JSON header.
SAFETENSORS_LEN_BYTES = 8
#: Largest safetensors header read (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
FLAG = "CHECKPOINT"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_safetensors_header(path: str | os.PathLike) -> dict:
    """The JSON header of a ``.safetensors`` file: ``{name: {"dtype", "shape", "data_offsets"}}`` (plus an
    optional ``__metadata__``), read directly and checked (types, offsets inside the file); every problem
    is a :class:`CLIError` naming the file and the tensor."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(SAFETENSORS_LEN_BYTES)
            if len(raw) != SAFETENSORS_LEN_BYTES:
                raise CLIError(f"{FLAG}: {path} is truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", raw)
            size = os.fstat(f.fileno()).st_size
            if n > size - SAFETENSORS_LEN_BYTES or n > MAX_HEADER_BYTES:
                raise CLIError(f"{FLAG}: {path} header length {n} exceeds the file size {size}")
            text = f.read(n)
    except OSError as e:
        raise CLIError(f"{FLAG}: cannot read {path}: {e.strerror or e}") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CLIError(f"{FLAG}: {path} has a corrupt safetensors header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise CLIError(f"{FLAG}: {path} has a corrupt safetensors header (a JSON {type(header).__name__}, expected an object)")
    data_bytes = size - SAFETENSORS_LEN_BYTES - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        where = f"{FLAG}: {path} tensor {name!r}"
        if not isinstance(t, dict) or not isinstance(t.get("dtype"), str):
            raise CLIError(f"{where}: expected an object with a string 'dtype'")
        shape, offs = t.get("shape"), t.get("data_offsets")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise CLIError(f"{where}: 'shape' must be a list of non-negative integers, got {shape!r}"[:300])
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs) and 0 <= offs[0] <= offs[1] <= data_bytes):
            raise CLIError(f"{where}: 'data_offsets' must be [begin, end] inside the {data_bytes} data bytes, got {offs!r}"[:300])
    return header


def _read_config(folder: Path) -> dict:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        return {}
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CLIError(f"{FLAG}: {cfg_path} is not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise CLIError(f"{FLAG}: {cfg_path} holds a JSON {type(cfg).__name__}, expected an object")
    return cfg


def inspect_checkpoint(folder: str | os.PathLike) -> dict:
    """Summary of a checkpoint folder: ``{"path", "architectures", "quantization_config", "files",
    "tensors": [{"name", "dtype", "shape", "bytes", "file"}], "totals": {dtype: {"tensors", "bytes"}}}``."""
    folder = check_path_length(folder, FLAG)
    if not folder.exists():
        raise CLIError(f"{FLAG}: {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise CLIError(f"{FLAG}: {str(folder)!r} is a file, expected a checkpoint folder")
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise CLIError(f"{FLAG}: cannot list {str(folder)!r}: {e.strerror or e}") from None
    files = [f for f in entries if f.suffix == ".safetensors" and f.is_file()]  # regular files: a FIFO would block
    if not files:
        odd = [f.name for f in entries if f.suffix == ".safetensors"]
        why = f" ({', '.join(odd[:3])}: not regular files)" if odd else ""
        raise CLIError(f"{FLAG}: {str(folder)!r} has no .safetensors files{why}")
    cfg = _read_config(folder)
    tensors, totals = [], {}
    for f in files:
        for name, t in read_safetensors_header(f).items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            tensors.append({"name": name, "dtype": t["dtype"], "shape": t["shape"], "bytes": b - a, "file": f.name})
            tot = totals.setdefault(t["dtype"], {"tensors": 0, "bytes": 0})
            tot["tensors"] += 1
            tot["bytes"] += b - a
    archs = cfg.get("architectures")
    return {"path": str(folder), "architectures": archs if isinstance(archs, list) else None,
            "quantization_config": cfg.get("quantization_config"), "files": [f.name for f in files],
            "tensors": tensors, "totals": totals}


def _field(d, key):
    """``d[key]`` when ``d`` is a dict, else None (configs written by other tools may hold anything)."""
    return d.get(key) if isinstance(d, dict) else None


def _print(info: dict, show_tensors: bool) -> None:
    q = info["quantization_config"]
    archs = ", ".join(str(a) for a in info["architectures"] or ["?"])
    result(f"checkpoint {info['path']}  ({archs}, {len(info['files'])} shard(s))")
    if not q:
        result("  no quantization_config: not an FP8 checkpoint")
    elif not isinstance(q, dict):
        result(f"  quantization_config is a JSON {type(q).__name__}, not an object: not a checkpoint this tool reads")
    else:
        result(f"  quant_method={_field(q, 'quant_method')} format={_field(q, 'format')}")
        groups = _field(q, "config_groups")
        for gname, g in (groups.items() if isinstance(groups, dict) else []):
            w, a = _field(g, "weights") or {}, _field(g, "input_activations") or {}
            act = "none" if not a else f"{_field(a, 'strategy')} {'dynamic' if _field(a, 'dynamic') else 'static'}"
            block = _field(w, "block_structure")
            result(f"  {gname}: targets={_field(g, 'targets')} weights={_field(w, 'type')}{_field(w, 'num_bits')} "
                   f"{_field(w, 'strategy')}{' ' + str(block) if block else ''} activations={act}")
        if _field(q, "ignore"):
            result(f"  ignore: {q['ignore']}")
    for dt, t in sorted(info["totals"].items()):
        result(f"  {dt:8s} {t['tensors']:5d} tensors  {t['bytes'] / 2**20:9.2f} MiB")
    if show_tensors and info["tensors"]:
        w = max(len(t["name"]) for t in info["tensors"])
        for t in sorted(info["tensors"], key=lambda t: t["name"]):
            result(f"    {t['name']:{w}s}  {t['dtype']:8s} {str(t['shape']):16s} {t['bytes']:>12,d} B")


def run(args) -> int:
    info = inspect_checkpoint(args.checkpoint)
    if args.json:
        result(json.dumps(info, indent=2))
    else:
        _print(info, args.tensors)
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="list a checkpoint's schemes, tensors, dtypes and sizes",
                       description="Read a checkpoint's config.json and safetensors headers (no tensor data is loaded).")
    p.add_argument("checkpoint", metavar=FLAG, help="checkpoint folder")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_output_options(p)
    p.set_defaults(func=run)
