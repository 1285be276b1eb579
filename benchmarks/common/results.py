"""Result files of the benchmarks: one JSON document per run, with what reproduces it.

``{"meta": {date, command, gpu, sms, torch, cuda, triton, python, kernel_cache_key, ...},
"summary": {...}, "rows": [...]}``, written to ``<out>/<name>-<UTC stamp>[-tag].json``
(default ``<out>`` = ``benchmarks/results``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import pathlib
import platform
import shlex
import sys

#: Where results go unless ``--out`` says otherwise.
RESULTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "results"


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - an absent optional package is recorded as None
        return None


def environment(extra: dict | None = None) -> dict:
    """Date (UTC), the command line, GPU name, SM count and L2 size, torch / CUDA / triton / Python versions and
    our kernel's build key (``None`` for what is not there), plus ``extra``."""
    import torch

    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m " + " ".join(shlex.quote(a) for a in [_module_name(), *sys.argv[1:]]),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton"),
            "python": platform.python_version(), "gpu": None, "sms": None, "kernel_cache_key": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta.update(gpu=props.name, sms=props.multi_processor_count, l2_bytes=getattr(props, "L2_cache_size", None))
        try:
            from fp8_linear.kernels import jit

            meta["kernel_cache_key"] = jit.cache_key()
        except Exception:  # noqa: BLE001 - recorded as absent
            pass
    meta.update(extra or {})
    return meta


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None and spec.name else sys.argv[0]


def _clean(obj):
    """JSON has no NaN / inf: they become ``None``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(name: str, meta: dict, summary: dict, rows: list, out: str | pathlib.Path | None = None,
               tag: str = "") -> pathlib.Path:
    """Write ``{"meta", "summary", "rows"}`` to ``<out>/<name>-<stamp>[-tag].json``; returns the path.
    ``name`` and ``tag`` must be plain file-name words (letters, digits, ``-``, ``_``)."""
    for what, word in (("name", name), ("tag", tag)):
        if word and not all(c.isalnum() or c in "-_" for c in word):
            raise ValueError(f"{what}: expected letters, digits, '-' or '_', got {word!r}")
    if not name:
        raise ValueError("name: expected a non-empty file-name word")
    outdir = pathlib.Path(out) if out else RESULTS_DIR
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = outdir / f"{name}-{stamp}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(_clean({"meta": meta, "summary": summary, "rows": rows}), indent=1))
    return path


def rewrite_json(name: str, meta: dict, rows: list, out: str | pathlib.Path | None,
                 previous: pathlib.Path | None) -> pathlib.Path:
    """:func:`write_json` of the rows so far (no summary), then delete ``previous`` (the file of the last
    rewrite) once the new one is whole: a long run keeps one JSON that holds every finished cell."""
    new = write_json(name, meta, {}, rows, out=out)
    if previous is not None and previous != new:
        previous.unlink(missing_ok=True)
    return new
