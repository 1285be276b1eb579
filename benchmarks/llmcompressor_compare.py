"""Our FP8 presets against llm-compressor's ``FP8`` and ``FP8_DYNAMIC`` on SmolLM2-135M, same data.

    python benchmarks/llmcompressor_compare.py [--samples 16] [--windows 8] [--lc-python /tmp/lcvenv/bin/python]

Both projects calibrate on the same token windows (the bundled text's calibration split), save a
checkpoint, and the checkpoints are loaded by ``fp8_linear.load_quantized`` and evaluated by the same
code (``fp8_linear.calibration.evaluate``) on the same held-out windows (the disjoint eval split), in
fp32 against the same unquantized fp32 model (``--eval-dtype bfloat16``: every model, the baseline
included, evaluated in bf16; calibration stays fp32 on both sides). Prints both projects' numbers side by side and writes
Markdown + JSON to ``--out``.

llm-compressor pins a transformers release other than the project's, so it lives in its own virtual
environment: this file re-runs itself there (``--lc-python``, default ``/tmp/lcvenv/bin/python`` or
``$LLMCOMPRESSOR_PYTHON``) in ``--child`` mode, which runs ``oneshot`` with
``QuantizationModifier(scheme=..., targets="Linear", ignore=["lm_head"])`` on the calibration token
ids the parent wrote, and saves a compressed-tensors checkpoint. The child imports nothing from
``fp8_linear``. Without that interpreter only our rows are printed.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

OURS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
THEIRS = ("FP8", "FP8_DYNAMIC")
DEFAULT_LC_PYTHON = "/tmp/lcvenv/bin/python"


# ---------------------------------------------------------------------------------------------------
# child: runs under llm-compressor's interpreter
# ---------------------------------------------------------------------------------------------------

def child(scheme: str, gguf: str, ids_file: str, save_dir: str) -> None:
    """llm-compressor ``oneshot`` with ``scheme`` on the token ids in ``ids_file`` (JSON list of lists);
    the model is the GGUF file ``gguf`` loaded in fp32; saves a compressed-tensors checkpoint to ``save_dir``."""
    import datasets
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # oneshot re-reads the config from model.name_or_path, which must be an HF folder: write one
    src = save_dir + ".fp32-source"
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    gguf_model.hf_quantizer = None  # dequantized to fp32 on load; the GGUF marker only blocks saving
    gguf_model.config.__dict__.pop("quantization_config", None)
    gguf_model.save_pretrained(src)
    tok.save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with open(ids_file) as f:
        rows = json.load(f)
    ds = datasets.Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    oneshot(model=model, processor=tok, dataset=ds, recipe=recipe, num_calibration_samples=len(rows),
            max_seq_length=max(map(len, rows)), shuffle_calibration_samples=False)
    model.save_pretrained(save_dir, save_compressed=True)
    tok.save_pretrained(save_dir)
    shutil.rmtree(src, ignore_errors=True)


def run_llmcompressor(lc_python: str, scheme: str, gguf: str, ids_file: str, save_dir: str) -> float:
    """Run :func:`child` under ``lc_python``; returns its wall time (s). Raises ``RuntimeError`` with
    the child's output tail if it fails."""
    t0 = time.perf_counter()
    cmd = [lc_python, os.path.abspath(__file__), "--child", scheme, "--gguf", gguf, "--ids", ids_file, "--save", save_dir]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llm-compressor {scheme} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
    return time.perf_counter() - t0


def llmcompressor_version(lc_python: str) -> str | None:
    """The llmcompressor version importable by ``lc_python`` (``None`` if none is)."""
    if not os.path.isfile(lc_python):
        return None
    p = subprocess.run([lc_python, "-c", "import importlib.metadata as m; print(m.version('llmcompressor'))"],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


# ---------------------------------------------------------------------------------------------------
# parent: the project's environment
# ---------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=16, help="calibration windows of --seq-len tokens (default 16)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--windows", type=int, default=8, help="eval windows of 512 tokens (default 8)")
    ap.add_argument("--lc-python", default=os.environ.get("LLMCOMPRESSOR_PYTHON", DEFAULT_LC_PYTHON),
                    help="python of a virtual environment with llmcompressor installed")
    ap.add_argument("--eval-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="dtype of the evaluation (models and baseline); calibration is fp32 either way")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.gguf, args.ids, args.save)
        return

    import torch

    import fp8_linear
    from fp8_linear.calibration import apply_quantization, calibrate, select_linears
    from fp8_linear.calibration.data import materialize_batches
    from fp8_linear.calibration.evaluate import eval_batches, evaluate_models
    from fp8_linear.calibration.quantize import needs_histogram
    from fp8_linear.checkpoint import load_quantized, save_quantized
    from fp8_linear.models import bundled_path, load_model
    from fp8_linear.scheme import resolve_scheme

    eval_dtype = getattr(torch, args.eval_dtype)
    short = {"float32": "fp32", "bfloat16": "bf16"}[args.eval_dtype]
    baseline = f"unquantized-{short}"
    gguf = bundled_path("smollm2")
    model, tok = load_model(gguf)
    calib = materialize_batches(None, tok, max_samples=args.samples, seq_len=args.seq_len)
    evalb = eval_batches(tok, max_windows=args.windows)
    models, timing = {baseline: model}, {}
    work = tempfile.mkdtemp(prefix="fp8-vs-llmcompressor-")
    atexit.register(shutil.rmtree, work, True)  # six checkpoints, ~1.3 GB: removed however the run ends

    schemes = [resolve_scheme(s) for s in OURS]
    t0 = time.perf_counter()
    obs = calibrate(model, select_linears(model), calib, progress=False, histogram=needs_histogram(schemes), hessian=True)
    t_cal = time.perf_counter() - t0
    cache: dict = {}
    for s in schemes:
        t0 = time.perf_counter()
        q = copy.deepcopy(model)
        apply_quantization(q, select_linears(q), s, obs, gptq=True, cache=cache)
        timing[f"ours {s.name}"] = t_cal + time.perf_counter() - t0
        path = os.path.join(work, s.name)
        save_quantized(q, path, overwrite=True)
        models[f"ours {s.name}"] = load_quantized(path, dtype=eval_dtype).eval()

    lc_version = llmcompressor_version(args.lc_python)
    if lc_version is None:
        print(f"llm-compressor is not importable by {args.lc_python!r}; showing our numbers only")
    else:
        ids_file = os.path.join(work, "calib_ids.json")
        with open(ids_file, "w") as f:
            json.dump([ids[m.bool()].tolist() for b in calib for ids, m in zip(b.input_ids, b.attention_mask)], f)
        for s in THEIRS:
            path = os.path.join(work, f"llmcompressor-{s}")
            timing[f"llm-compressor {s}"] = run_llmcompressor(args.lc_python, s, gguf, ids_file, path)
            models[f"llm-compressor {s}"] = load_quantized(path, dtype=eval_dtype).eval()

    models[baseline] = models[baseline].to(eval_dtype)  # after every calibration (fp32) is done
    res = evaluate_models(models, baseline, evalb, progress=False)
    base = res[baseline].perplexity
    lines = [f"| model | ppl | ppl vs {short} % | top-1 agree | KL nats/token | mean / min layer SQNR dB | quantize s |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    for name, r in res.items():
        row = {"model": name, "perplexity": r.perplexity, "ppl_delta_pct": 100 * (r.perplexity / base - 1),
               "top1_agreement": r.top1_agreement, "kl": r.kl, "mean_sqnr_db": r.mean_sqnr_db,
               "min_sqnr_db": r.min_sqnr_db, "quantize_s": timing.get(name)}
        rows.append(row)
        sq = "" if r.mean_sqnr_db is None else f"{r.mean_sqnr_db:.2f} / {r.min_sqnr_db:.2f}"
        lines.append(f"| {name} | {r.perplexity:.4f} | {row['ppl_delta_pct']:+.3f} | {r.top1_agreement:.4f} | {r.kl:.5f} | "
                     f"{sq} | {'' if row['quantize_s'] is None else format(row['quantize_s'], '.1f')} |")
    table = "\n".join(lines)
    print(table)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": stamp, "machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "llmcompressor": lc_version, "fp8_linear": fp8_linear.__version__, "calib_windows": args.samples,
            "calib_seq_len": args.seq_len, "eval_tokens": res[baseline].tokens, "eval_dtype": args.eval_dtype,
            "ours_gptq": True, "checkpoints": "every model saved and reloaded with fp8_linear.load_quantized",
            "data": "pydoc_data.topics: calibration split / disjoint eval split"}
    base_path = os.path.join(args.out, f"llmcompressor_compare_{stamp}")
    with open(base_path + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    with open(base_path + ".md", "w") as f:
        f.write(f"# fp8-linear vs llm-compressor on SmolLM2-135M ({stamp})\n\n"
                f"`python benchmarks/llmcompressor_compare.py --samples {args.samples} --windows {args.windows}"
                f" --eval-dtype {args.eval_dtype}`\n\n"
                f"{json.dumps(meta)}\n\n{table}\n")
    print(f"wrote {base_path}.json and .md")


if __name__ == "__main__":
    sys.exit(main())
