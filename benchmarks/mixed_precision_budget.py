"""Mixed precision to a KL budget on SmolLM2-135M, against keeping every FFN projection in BF16.

    python benchmarks/mixed_precision_budget.py [--scheme fp8-channel] [--samples 32] [--windows 16]
    python benchmarks/mixed_precision_budget.py --quick     # 8 calibration windows, 2 per text: the time check

1. ``ffn-bf16``: ``quantize_model(..., ignore=("lm_head", "re:.*\\.mlp\\..*"))``: attention projections
   in FP8, all 90 FFN projections (gate / up / down) in BF16. Its KL on the held-out slice of the
   calibration data that the budget search uses is the budget ``B``.
2. The all-FP8 model (``quantize_model`` on the same calibration batches: the model the budget search
   of ``quantize_model(..., max_kl=B)`` starts from) and two searches on it with
   :func:`~fp8_linear.calibration.mixed_precision.keep_to_budget`: ``budget-slice``, the held-out slice
   alone (held-out KL + 1 SE ``<= B``; what ``quantize_model(..., max_kl=B)`` does without a probe), and
   ``budget-probe``, also the unseen-text probe (16 windows of the ``choose`` split: probe KL + 1.645
   prediction SE for a 16-window text ``<= B``).

All three are then measured on text none of them was calibrated on: ``choose`` (the probe's text, so
not a held-out judge for ``budget-probe``), ``report`` and the standard-library docstrings (the held-out
judges; ``--windows`` windows of 512 tokens each, spread over each text), bf16 against the unquantized
bf16 model. Prints BF16 layer counts, weight memory, KL and perplexity; writes JSON to ``--out`` with the
GPTQ recipe it ran (the package defaults, or ``--act-order off --hessian-tokens 4096`` for the earlier
recipe), the CPU and the torch version.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import pathlib
import platform
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from benchmarks.common.eval_windows import Reference, spread_windows, to_batches  # noqa: E402

from fp8_linear import FP8Linear, quantize_model  # noqa: E402
from fp8_linear.calibration import gptq  # noqa: E402
from fp8_linear.calibration.data import corpus_text, materialize_batches  # noqa: E402
from fp8_linear.calibration import mixed_precision as mp  # noqa: E402
from fp8_linear.calibration.quantize import select_linears  # noqa: E402
from fp8_linear.calibration.stdlib_text import stdlib_text, stdlib_text_digest  # noqa: E402
from fp8_linear.models import load_model  # noqa: E402

FFN_IGNORE = ("lm_head", r"re:.*\.mlp\..*")
#: ``--quick``: calibration windows and eval windows per text (a time check, not a result).
QUICK_SAMPLES, QUICK_WINDOWS = 8, 2


def cpu_name() -> str:
    """``lscpu``'s model name (from ``/proc/cpuinfo``) and whether the CPU has AVX-512 and AMX."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    feats = [f for f, key in (("AVX-512", "avx512f"), ("AMX", "amx_tile")) if key in flags]
    cpus = sum(ln.split(":")[0].strip() == "processor" for ln in info.splitlines())
    return f"{name} ({', '.join(feats) or 'no AVX-512'}; {cpus} logical CPUs)"


def bf16_layers(model) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and n != "lm_head"]


def weight_mib(model) -> float:
    total = 0
    for n, m in model.named_modules():
        if n == "lm_head":
            continue
        if isinstance(m, FP8Linear):
            total += m.weight.numel() + m.weight_scale.numel() * 4
        elif type(m) is torch.nn.Linear:
            total += m.weight.numel() * 2
    return total / 2**20


def _set_module(model, name, module):
    model.set_submodule(name, module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="fp8-channel")
    ap.add_argument("--samples", type=int, default=32, help="calibration windows of 512 tokens (1/8 held out)")
    ap.add_argument("--windows", type=int, default=mp.PROBE_JUDGE_WINDOWS,
                    help="eval windows per text (default: the probe's judge size, as many as compare evaluates)")
    ap.add_argument("--probe-windows", type=int, default=mp.PROBE_WINDOWS, help="windows of the choose split in the probe")
    ap.add_argument("--act-order", choices=("on", "off"), default=None,
                    help="GPTQ column order by decreasing H[i, i] (default: the package's, on)")
    ap.add_argument("--hessian-tokens", type=int, default=None,
                    help="tokens in each GPTQ H (default: the package's, every calibration token; 4096 = the earlier recipe)")
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="search with max_kl = this x B (a diagnostic; default 1); 'within_budget' is still judged against B")
    ap.add_argument("--no-slice-search", action="store_true",
                    help="skip the budget-slice search and model (the probe search alone: less time)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_SAMPLES} calibration windows, {QUICK_WINDOWS} eval windows per text: a time check")
    ap.add_argument("--out", default="benchmarks/results/mixed_precision_budget_smollm2_cpu_20261201_probe.json")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.windows, args.probe_windows = QUICK_SAMPLES, QUICK_WINDOWS, QUICK_WINDOWS
    if not 0 < args.budget_scale <= 1:
        ap.error(f"--budget-scale: expected a factor in (0, 1], got {args.budget_scale}")
    act_order = None if args.act_order is None else args.act_order == "on"
    t_start = time.time()
    model, tok = load_model(None)
    model = model.to(torch.bfloat16).eval()
    kw = dict(seq_len=512, max_samples=args.samples, batch_size=4, progress=False, act_order=act_order,
              hessian_tokens=args.hessian_tokens)
    # the budget search's slices, as quantize_model(..., max_kl=...) cuts them
    batches = materialize_batches(None, tok, seq_len=512, max_samples=args.samples, batch_size=4)
    cal, hold = mp.split_holdout(batches)
    rank = mp.split_ranking(cal, hold)
    refs, rank_refs = mp.reference_logprobs(model, hold), mp.reference_logprobs(model, rank)
    cal_rows = [r for b in cal for r in b.input_ids]
    ffn = quantize_model(copy.deepcopy(model), cal_rows, args.scheme, ignore=FFN_IGNORE, **kw)
    budget = mp.measure_kl(ffn, hold, refs)
    target = args.budget_scale * budget
    print(f"ffn-bf16: {len(bf16_layers(ffn))} BF16 layers, held-out-slice KL {budget:.5f} -> budget", flush=True)
    fp8 = quantize_model(copy.deepcopy(model), cal_rows, args.scheme, **kw)
    originals = select_linears(model)
    quantized = {n: fp8.get_submodule(n) for n in originals}
    searches, models = {}, [("ffn-bf16", ffn)]
    if not args.no_slice_search:
        searches["budget-slice"] = mp.keep_to_budget(fp8, quantized, originals, hold, refs, target, _set_module, rank, rank_refs)
        print("budget-slice:", searches["budget-slice"].summary(), flush=True)
        models.append(("budget-slice", copy.deepcopy(fp8)))
        for n, m in quantized.items():
            fp8.set_submodule(n, m)
    probe = mp.probe_batches(tok, 512, windows=args.probe_windows)
    searches["budget-probe"] = mp.keep_to_budget(fp8, quantized, originals, hold, refs, target, _set_module, rank,
                                                 rank_refs, probe=probe, probe_refs=mp.reference_logprobs(model, probe))
    print("budget-probe:", searches["budget-probe"].summary(), flush=True)
    models.append(("budget-probe", fp8))
    texts = {"choose": corpus_text("choose"), "report": corpus_text("report"), "stdlib": stdlib_text()}
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python benchmarks/mixed_precision_budget.py " + " ".join(sys.argv[1:]), "scheme": args.scheme,
           "calib_windows": args.samples, "eval_windows": args.windows, "budget_kl": budget, "budget_scale": args.budget_scale,
           "gptq_act_order": gptq.ACT_ORDER if act_order is None else act_order,
           "gptq_hessian_tokens": args.hessian_tokens if args.hessian_tokens is not None else gptq.MAX_TOKENS,
           "cpu": cpu_name(), "torch": torch.__version__, "python": platform.python_version(), "stdlib_sha256": stdlib_text_digest(),
           "held_out_judges": ["report", "stdlib"], "searches": {}, "unquantized_weight_mib": weight_mib(model), "models": {}}
    for name, r in searches.items():
        out["searches"][name] = {k: getattr(r, k) for k in (
            "kl", "kl_se", "margin_se", "holdout_tokens", "rank_tokens", "kl_all_fp8", "probe_tokens", "probe_windows",
            "probe_kl_all_fp8", "probe_kl", "probe_se", "probe_margin", "probe_z", "probe_judge_windows")}
    for name, q in models:
        out["models"][name] = {"bf16_layers": len(bf16_layers(q)), "weight_mib": round(weight_mib(q), 2),
                               "kept": bf16_layers(q) if name != "ffn-bf16" else "every mlp projection"}
    for text, t in texts.items():
        ref = Reference(model, to_batches(spread_windows(t, tok, args.windows)))
        for name, q in models:
            r = ref.compare(q)
            out["models"][name][text] = {k: r[k] for k in ("kl", "ppl_delta_pct", "ppl_delta_se_pct", "top1")}
            out["models"][name][text]["within_budget"] = r["kl"] <= budget
            print(f"{name:12s} {text:7s} KL {r['kl']:.5f} ({100 * (r['kl'] / budget - 1):+.1f}% vs budget {budget:.5f})  "
                  f"ppl {r['ppl_delta_pct']:+.3f}% +- {r['ppl_delta_se_pct']:.3f}", flush=True)
        del ref
    for name, m in out["models"].items():
        print(f"{name:12s} {m['bf16_layers']:3d} BF16 layers, weights {m['weight_mib']:.1f} MiB "
              f"(unquantized {out['unquantized_weight_mib']:.1f} MiB)")
    out["total_s"] = round(time.time() - t_start, 1)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
