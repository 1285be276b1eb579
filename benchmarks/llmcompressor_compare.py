"""Our FP8 presets against llm-compressor's ``FP8`` and ``FP8_DYNAMIC`` on SmolLM2-135M, same data.

    python benchmarks/llmcompressor_compare.py [--samples 16] [--windows 8] [--out benchmarks/results]

Both projects calibrate on the same token windows (the bundled text's calibration split) and are
evaluated by the same code on the same held-out windows (its eval split), in fp32 against the same
unquantized fp32 model. Prints both projects' numbers side by side and writes Markdown + JSON.
llm-compressor runs when importable (``pip install llmcompressor``; it pins its own transformers,
so a separate ``--target`` folder on PYTHONPATH keeps the project's environment untouched).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import time

import torch

import fp8_linear
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.evaluate import eval_batches, evaluate_models
from fp8_linear.models import load_model

OURS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
THEIRS = ("FP8", "FP8_DYNAMIC")


def run_llmcompressor(model, calib, scheme: str):
    """llm-compressor ``oneshot`` with ``QuantizationModifier(scheme=...)`` on ``calib`` (list of Batch)."""
    import datasets
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    rows = [(ids[m.bool()].tolist()) for b in calib for ids, m in zip(b.input_ids, b.attention_mask)]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    m = copy.deepcopy(model)
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    oneshot(model=m, dataset=ds, recipe=recipe, num_calibration_samples=len(rows), max_seq_length=max(map(len, rows)))
    return m.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=16, help="calibration windows of --seq-len tokens")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--windows", type=int, default=8, help="eval windows of 512 tokens")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()

    model, tok = load_model("smollm2")
    calib = materialize_batches(None, tok, max_samples=args.samples, seq_len=args.seq_len)
    evalb = eval_batches(tok, max_windows=args.windows)
    models, timing = {"unquantized-fp32": model}, {}
    from fp8_linear.calibration import apply_quantization, calibrate, select_linears

    t0 = time.perf_counter()
    obs = calibrate(model, select_linears(model), calib, progress=False, histogram=False, hessian=True)
    t_cal = time.perf_counter() - t0
    for s in OURS:
        t0 = time.perf_counter()
        q = copy.deepcopy(model)
        apply_quantization(q, select_linears(q), s, obs, gptq=True)
        models[f"ours {s}"] = q
        timing[f"ours {s}"] = t_cal + time.perf_counter() - t0
    try:
        import llmcompressor  # noqa: F401

        lc_version = getattr(llmcompressor, "__version__", "?")
        for s in THEIRS:
            t0 = time.perf_counter()
            models[f"llm-compressor {s}"] = run_llmcompressor(model, calib, s)
            timing[f"llm-compressor {s}"] = time.perf_counter() - t0
    except ImportError as e:
        lc_version = None
        print(f"llm-compressor is not importable ({e}); showing our numbers only")
    res = evaluate_models(models, "unquantized-fp32", evalb, progress=False)
    base = res["unquantized-fp32"].perplexity
    lines = ["| model | ppl | ppl vs fp32 % | top-1 agree | KL nats/token | quantize s |", "|---|---|---|---|---|---|"]
    rows = []
    for name, r in res.items():
        row = {"model": name, "perplexity": r.perplexity, "ppl_delta_pct": 100 * (r.perplexity / base - 1),
               "top1_agreement": r.top1_agreement, "kl": r.kl, "quantize_s": timing.get(name)}
        rows.append(row)
        lines.append(f"| {name} | {r.perplexity:.4f} | {row['ppl_delta_pct']:+.3f} | {r.top1_agreement:.4f} | {r.kl:.5f} | "
                     f"{'' if row['quantize_s'] is None else format(row['quantize_s'], '.1f')} |")
    table = "\n".join(lines)
    print(table)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": stamp, "machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "llmcompressor": lc_version, "fp8_linear": fp8_linear.__version__, "calib_windows": args.samples,
            "calib_seq_len": args.seq_len, "eval_tokens": res["unquantized-fp32"].tokens, "eval_dtype": "float32",
            "ours_gptq": True, "data": "pydoc_data.topics: calibration split / disjoint eval split"}
    base_path = os.path.join(args.out, f"llmcompressor_compare_{stamp}")
    with open(base_path + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    with open(base_path + ".md", "w") as f:
        f.write(f"# fp8-linear vs llm-compressor on SmolLM2-135M ({stamp})\n\n{json.dumps(meta)}\n\n{table}\n")
    print(f"wrote {base_path}.json and .md")


if __name__ == "__main__":
    main()
