"""``fp8-linear``: the command-line tool.

    fp8-linear compare                      # the main job: bundled SmolLM2 + bundled text, every preset
    fp8-linear quantize --scheme fp8-channel --output smollm2-fp8
    fp8-linear eval smollm2-fp8 --reference smollm2
    fp8-linear inspect smollm2-fp8

Exit codes: 0 success, 1 an error the message explains (missing file, bad data, a model without
Linear layers, ...), 2 a usage error (unknown option or preset; argparse prints the usage).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
PRESET_NAMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
OBSERVER_NAMES = ("minmax", "percentile", "mse")
#: Bytes of the little-endian length that precedes a safetensors JSON header.
SAFETENSORS_LEN_BYTES = 8
DEFAULT_OUTPUT_DIR = "fp8-compare"
#: Default number of 512-token perplexity windows (= fp8_linear.calibration.evaluate.DEFAULT_EVAL_WINDOWS, not
#: imported so that --help stays fast; a test keeps the two equal): chosen from the time budget only.
DEFAULT_EVAL_WINDOWS = 16
WINDOWS_HELP = (f"causal LMs: number of 512-token perplexity windows from the eval split (default {DEFAULT_EVAL_WINDOWS}: "
                "the most that keep the main job under 200 s on an idle 2-core CPU, at about 6.75 s per window "
                "for the unquantized model + 4 presets; the bundled eval split holds 63)")

DATA_HELP = ("a .txt file (one sample per paragraph), a .jsonl file (a 'text' or 'input_ids' field per line), "
             "a dataset folder saved with datasets.save_to_disk, or 'bundled' (the default: Python's own "
             "pydoc_data text; calibration and evaluation use disjoint splits of it)")
MODEL_HELP = ("an HF model folder, a .gguf file, an FP8 checkpoint folder, or a bundled model: 'smollm2' "
              "(SmolLM2-135M-Instruct, the default) or 'minilm' (all-MiniLM-L6-v2)")


class CLIError(Exception):
    """An error the CLI reports as one line on stderr with exit code 1."""


# ---------------------------------------------------------------------------------------------- data
def read_data(spec: str | None):
    """Calibration / eval data named on the command line.

    ``None`` or ``"bundled"`` -> ``None`` (the package's embedded corpus split); ``*.txt`` -> a list of
    paragraphs (blank-line separated; the whole file if it has none); ``*.jsonl`` -> a list of strings
    (field ``text``) or of dicts (field ``input_ids``); a folder -> ``datasets.load_from_disk``.
    """
    if spec is None or spec == "bundled":
        return None
    p = Path(spec)
    if not p.exists():
        raise FileNotFoundError(f"data: {spec!r} does not exist (expected {DATA_HELP})")
    if p.is_dir():
        try:
            import datasets
        except ImportError as e:
            raise CLIError(f"data: {spec!r} is a folder; reading a saved dataset needs the 'datasets' package ({e})")
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            split = "train" if "train" in ds else next(iter(ds))
            ds = ds[split]
        return ds
    if p.suffix.lower() == ".jsonl":
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        if not rows:
            raise CLIError(f"data: {spec!r} has no JSON lines")
        if all("text" in r for r in rows):
            return [r["text"] for r in rows]
        if all("input_ids" in r for r in rows):
            return [{k: r[k] for k in ("input_ids", "attention_mask") if k in r} for r in rows]
        raise CLIError(f"data: every line of {spec!r} needs a 'text' or an 'input_ids' field, got keys {sorted(rows[0])}")
    text = p.read_text()
    paras = [s.strip() for s in text.split("\n\n") if s.strip()]
    if not paras:
        raise CLIError(f"data: {spec!r} is empty")
    return paras


# ---------------------------------------------------------------------------------------------- inspect
def read_safetensors_header(path: str | os.PathLike) -> dict:
    """The JSON header of a ``.safetensors`` file (name -> {dtype, shape, data_offsets}), read directly."""
    with open(path, "rb") as f:
        raw = f.read(SAFETENSORS_LEN_BYTES)
        if len(raw) != SAFETENSORS_LEN_BYTES:
            raise CLIError(f"checkpoint: {path} is truncated (no safetensors header)")
        (n,) = struct.unpack("<Q", raw)
        size = os.fstat(f.fileno()).st_size
        if n > size - SAFETENSORS_LEN_BYTES:
            raise CLIError(f"checkpoint: {path} header length {n} exceeds the file size {size}")
        return json.loads(f.read(n))


def inspect_checkpoint(folder: str | os.PathLike) -> dict:
    """Summary of a checkpoint folder: quantization config, per-tensor dtype/shape/bytes, totals per dtype."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint: {str(folder)!r} is not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint: {str(folder)!r} has no .safetensors files")
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    tensors, totals = [], {}
    for f in files:
        for name, info in read_safetensors_header(f).items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            tensors.append({"name": name, "dtype": info["dtype"], "shape": info["shape"], "bytes": b - a, "file": f.name})
            t = totals.setdefault(info["dtype"], {"tensors": 0, "bytes": 0})
            t["tensors"] += 1
            t["bytes"] += b - a
    return {"path": str(folder), "architectures": cfg.get("architectures"), "quantization_config": cfg.get("quantization_config"),
            "files": [f.name for f in files], "tensors": tensors, "totals": totals}


def _print_inspect(info: dict, show_tensors: bool) -> None:
    q = info["quantization_config"]
    print(f"checkpoint {info['path']}  ({', '.join(info['architectures'] or ['?'])}, {len(info['files'])} shard(s))")
    if not q:
        print("  no quantization_config: not an FP8 checkpoint")
    else:
        print(f"  quant_method={q.get('quant_method')} format={q.get('format')}")
        for gname, g in (q.get("config_groups") or {}).items():
            w, a = g.get("weights") or {}, g.get("input_activations") or {}
            act = "none" if not a else f"{a.get('strategy')} {'dynamic' if a.get('dynamic') else 'static'}"
            print(f"  {gname}: targets={g.get('targets')} weights={w.get('type')}{w.get('num_bits')} {w.get('strategy')}"
                  f"{' ' + str(w.get('block_structure')) if w.get('block_structure') else ''} activations={act}")
        if q.get("ignore"):
            print(f"  ignore: {q['ignore']}")
    for dt, t in sorted(info["totals"].items()):
        print(f"  {dt:8s} {t['tensors']:5d} tensors  {t['bytes'] / 2**20:9.2f} MiB")
    if show_tensors:
        w = max(len(t["name"]) for t in info["tensors"])
        for t in sorted(info["tensors"], key=lambda t: t["name"]):
            print(f"    {t['name']:{w}s}  {t['dtype']:8s} {str(t['shape']):16s} {t['bytes']:>12,d} B")


# ---------------------------------------------------------------------------------------------- commands
def busy_elsewhere() -> float:
    """CPUs that other processes keep busy now: the smaller of the 1-minute load average and the
    number of runnable tasks other than this one (``/proc/loadavg``; the load average alone still
    counts a job that ended a minute ago)."""
    load = os.getloadavg()[0]
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0]) - 1  # this process is one of them
    except (OSError, ValueError, IndexError):
        return load
    return min(load, max(0, running))


def pick_threads(requested: int = 0, busy: float | None = None) -> int:
    """Torch intra-op threads for this run: ``requested`` when > 0, else the cores other processes
    leave free (``cpu_count - busy``, ``busy`` defaulting to :func:`busy_elsewhere`; at least 1, at
    most torch's default).

    On a shared CPU, a thread pool larger than the free cores stalls at every op's barrier: on a
    2-core machine with a load of ~6, one thread ran SmolLM2's forward 2x faster than two; on an
    idle one, two threads calibrated 32 x 512 tokens in 42.7 s against 70.3 s with one
    (benchmarks/results/calibration_time_smollm2_cpu_20261129_fp32calib_idle*.txt).
    """
    import torch

    if requested > 0:
        return requested
    free = (os.cpu_count() or 1) - (busy_elsewhere() if busy is None else busy)
    return max(1, min(torch.get_num_threads(), int(free + 0.5)))


def _set_threads(args) -> None:
    import torch

    busy = busy_elsewhere()  # read once: the number printed is the one the choice used
    n = pick_threads(getattr(args, "threads", 0) or 0, busy)
    torch.set_num_threads(n)
    print(f"torch threads: {n} (cpus {os.cpu_count()}, busy elsewhere {busy:.1f})", file=sys.stderr)


def _load(model_spec, dtype_name: str, args=None):
    import torch

    from .models import load_model

    if args is not None:
        _set_threads(args)

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    t0 = time.perf_counter()
    model, tok = load_model(model_spec, dtype=dtype)
    print(f"loaded {model_spec or 'smollm2 (bundled)'} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return model, tok


def _calib_dtype(args):
    import torch

    return {None: None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.calib_dtype]


def _scheme(args):
    from .scheme import resolve_scheme

    s = resolve_scheme(args.scheme)
    changes = {k: v for k, v in (("weight_observer", args.weight_observer), ("activation_observer", args.activation_observer)) if v}
    return s.with_(**changes) if changes else s


def cmd_quantize(args) -> int:
    import fp8_linear
    from fp8_linear.checkpoint import save_quantized

    model, tok = _load(args.model, args.dtype, args)
    calib = read_data(args.calib)
    t0 = time.perf_counter()
    fp8_linear.quantize_model(model, calib, _scheme(args), tokenizer=tok, ignore=tuple(args.ignore),
                              max_samples=args.samples, seq_len=args.seq_len, batch_size=args.batch_size,
                              progress=not args.quiet, gptq=False if args.no_gptq else None, calib_dtype=_calib_dtype(args))
    dt = time.perf_counter() - t0
    path = save_quantized(model, args.output, tokenizer=tok, overwrite=args.overwrite)
    n = sum(isinstance(m, fp8_linear.FP8Linear) for m in model.modules())
    print(f"quantized {n} Linear layers with {args.scheme} in {dt:.1f} s; saved to {path}")
    return EXIT_OK


def cmd_eval(args) -> int:
    from .calibration.compare import build_eval_batches
    from .calibration.evaluate import evaluate_models

    model, tok = _load(args.model, args.dtype, args)
    models = {"model": model}
    if args.reference:
        models = {"reference": _load(args.reference, args.dtype)[0], "model": model}
    batches = build_eval_batches(model, read_data(args.data), tok, seq_len=args.seq_len, max_windows=args.windows)
    res = evaluate_models(models, next(iter(models)), batches, progress=not args.quiet)
    out = {}
    for name, r in res.items():
        out[name] = {k: v for k, v in (("perplexity", r.perplexity), ("top1_agreement", r.top1_agreement), ("kl", r.kl),
                                       ("embedding_cosine", r.embedding_cosine), ("mean_sqnr_db", r.mean_sqnr_db))
                     if v is not None and not (name == "model" and len(res) == 1 and k in ("top1_agreement", "kl", "embedding_cosine"))}
        print(f"{name:10s} " + "  ".join(f"{k}={v:.5g}" for k, v in out[name].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return EXIT_OK


def cmd_compare(args) -> int:
    import fp8_linear

    t0 = time.perf_counter()
    model, tok = _load(args.model, args.dtype, args)
    schemes = [_scheme(argparse.Namespace(**{**vars(args), "scheme": s})) for s in args.schemes]
    table = fp8_linear.compare_schemes(
        model, read_data(args.data), schemes, read_data(args.calib), tokenizer=tok, ignore=tuple(args.ignore),
        max_samples=args.samples, seq_len=args.seq_len, batch_size=args.batch_size, eval_windows=args.windows,
        eval_seq_len=args.eval_seq_len, gptq=not args.no_gptq, save_reload=not args.no_save_reload, checkpoint_dir=args.checkpoints,
        output_dir=args.output, progress=not args.quiet, calib_dtype=_calib_dtype(args),
    )
    print(table)
    print(f"\nbaseline: the unquantized model in {table.notes['eval_dtype']}; "
          f"wrote {', '.join(table.notes.get('files', {}).values())}; total {time.perf_counter() - t0:.0f} s")
    return EXIT_OK


def cmd_inspect(args) -> int:
    info = inspect_checkpoint(args.checkpoint)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_inspect(info, args.tensors)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parser
def _common(p: argparse.ArgumentParser, model_default: str | None = "smollm2") -> None:
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the unquantized parts and of activations (default float32: fast and exact on CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="torch CPU threads (default 0 = the cores other processes leave free, at least 1)")


def _calib_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calib", metavar="DATA", default=None, help=f"calibration data: {DATA_HELP}")
    p.add_argument("--samples", type=int, default=32, help="calibration samples (default 32)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sample (default 512)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per forward pass (default 4)")
    p.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="PATTERN",
                   help="modules kept in high precision: exact names or 're:<regex>' (default: lm_head)")
    p.add_argument("--weight-observer", choices=OBSERVER_NAMES, default=None,
                   help="override the preset's weight observer (presets use minmax; mse clips outlier weights)")
    p.add_argument("--activation-observer", choices=OBSERVER_NAMES, default=None,
                   help="override the preset's activation observer")
    p.add_argument("--no-gptq", action="store_true",
                   help="round weights to nearest instead of GPTQ error compensation (faster, less accurate)")
    p.add_argument("--calib-dtype", choices=("float32", "bfloat16"), default=None,
                   help="dtype of the calibration forwards (default: --dtype); bfloat16 runs ~3x faster on CPUs "
                        "with AMX, the statistics are still kept in fp32")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fp8-linear",
        description="FP8 inference for Hugging Face models: calibrate, quantize, save, evaluate and inspect.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "start here:\n"
            "  fp8-linear compare            quantize the bundled SmolLM2-135M with every preset, save, reload,\n"
            "                                and compare perplexity against the unquantized model (minutes on a CPU)\n"
            "presets:\n"
            "  fp8-tensor   per-tensor weights, static per-tensor activations   (compressed-tensors FP8)\n"
            "  fp8-channel  per-channel weights, static per-tensor activations  (the default)\n"
            "  fp8-dynamic  per-channel weights, dynamic per-token activations (FP8_DYNAMIC)\n"
            "  fp8-block    128x128 weight blocks, dynamic 1x128 activations    (FP8_BLOCK)\n"
            "exit codes: 0 ok, 1 error (explained on stderr), 2 usage error"
        ),
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("quantize", help="calibrate and quantize a model, save a compressed-tensors checkpoint",
                       description="Calibrate and quantize a model and save it as a compressed-tensors FP8 checkpoint "
                                   "(loadable by fp8_linear.load_quantized, vLLM and transformers).")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--scheme", choices=PRESET_NAMES, default="fp8-channel", help="quantization preset (default fp8-channel)")
    p.add_argument("-o", "--output", required=True, help="checkpoint folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output folder")
    _calib_args(p)
    _common(p)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("eval", help="perplexity / embedding fidelity of a model, optionally against a reference",
                       description="Evaluate a model (e.g. a saved FP8 checkpoint) on held-out text; with --reference "
                                   "also top-1 agreement, KL divergence, per-layer SQNR (or embedding cosine for encoders).")
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument("--reference", default=None, help="the unquantized model to compare against (same forms as MODEL)")
    p.add_argument("--data", metavar="DATA", default=None, help=f"evaluation data: {DATA_HELP}")
    p.add_argument("--windows", type=int, default=DEFAULT_EVAL_WINDOWS, help=WINDOWS_HELP)
    p.add_argument("--seq-len", type=int, default=512, help="causal LMs: tokens per window (default 512)")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the metrics as JSON")
    _common(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compare", help="the main job: every preset vs the unquantized model, as a table",
                       description="Calibrate once, quantize with each preset, save and reload each checkpoint, evaluate "
                                   "all against the unquantized model on held-out text, print the table, and write it "
                                   "(Markdown, CSV, JSON) with PNG plots to --output.")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--schemes", nargs="+", choices=PRESET_NAMES, default=list(PRESET_NAMES), help="presets to compare (default: all)")
    p.add_argument("--data", metavar="DATA", default=None, help=f"evaluation data: {DATA_HELP}")
    p.add_argument("--windows", type=int, default=DEFAULT_EVAL_WINDOWS, help=WINDOWS_HELP)
    p.add_argument("--eval-seq-len", type=int, default=512, help="causal LMs: tokens per perplexity window (default 512)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT_DIR, help=f"folder for the table and plots (default {DEFAULT_OUTPUT_DIR})")
    p.add_argument("--checkpoints", default=None, help="keep the checkpoints in this folder (default: a temporary one)")
    p.add_argument("--no-save-reload", action="store_true", help="evaluate the in-memory models instead of reloaded checkpoints")
    _calib_args(p)
    p.set_defaults(samples=16)
    _common(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("inspect", help="list a checkpoint's schemes, tensors, dtypes and sizes",
                       description="Read a checkpoint's config.json and safetensors headers (no tensor data is loaded).")
    p.add_argument("checkpoint", help="checkpoint folder")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fp8-linear``; returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help()
        return EXIT_USAGE
    from .errors import FP8LinearError

    try:
        return args.func(args)
    except (FileNotFoundError, CLIError, FP8LinearError, ValueError, TypeError) as e:
        print(f"fp8-linear {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
