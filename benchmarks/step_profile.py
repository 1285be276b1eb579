"""Where a compiled decode step's GPU time goes: BF16 against FP8, kernel by kernel.

``python -m benchmarks.step_profile`` builds the Llama-3-8B-shaped model of ``benchmarks/e2e.py``
(``benchmarks/common/random_model.py``: random weights, full depth unless ``--layers``), runs
transformers' compiled static-cache ``generate`` once per path and batch (compile and CUDA-graph capture), then profiles two more calls, of
``--new-tokens`` and of ``--new-tokens + --extra-tokens`` tokens, under ``torch.profiler``; their
difference divided by ``--extra-tokens`` is one steady decode step (prefill, the first step's graph
recording and per-call costs cancel). Every GPU kernel is sorted into a category (our FP8 GEMM,
our activation quantization, split-K reduce, cuBLAS GEMMs, attention, inductor's Triton kernels,
copies, other). Per path and batch it prints, per decode step: the kernel count and GPU time of each
category, the GPU busy time (the union of kernel intervals) and the idle time between kernels
(span minus busy time), and the host wall time. This locates a difference between two paths' "rest" of the step
(``benchmarks/e2e.py`` reports step = linear layers + rest) in kernels or in gaps.

The JSON (``--out``) holds the same figures plus the 12 most expensive kernel names of each path.
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from benchmarks.common.fp8_swap import calibrate, decoder_linears, fp8_layers, swap_in
from benchmarks.common.generate_clock import reset_compiled, timed_generate
from benchmarks.common.random_model import MODELS, build_model, prompt_ids
from benchmarks.common.results import environment, write_json
from fp8_linear import fuse_projections, unfuse_projections

#: Kernel categories, first match wins (regular expressions on the kernel name).
CATEGORIES = (
    ("fp8 gemm (ours)", r"fp8_gemm_sm90|grouped_gemm_sm90"),
    ("act quant (ours)", r"quant_rows_kernel|quant_groups_kernel"),
    ("split-K reduce (ours)", r"splitk_reduce"),
    ("cuBLAS/cuBLASLt gemm", r"nvjet|gemm|gemv|xmma|cutlass|cublas"),
    ("attention", r"flash|fmha|attn|attention|sdpa|efficient"),
    ("inductor triton", r"^triton_"),
    ("copy/fill", r"[Mm]emcpy|[Mm]emset|copy|fill|CatArray"),
)


def category(name: str) -> str:
    """The :data:`CATEGORIES` label of a GPU kernel's name (the first pattern that matches), else ``other``."""
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (us)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def stop_after(length: int):
    """A ``generate`` stopping criterion: stop once the sequences are ``length`` tokens long (so two calls
    of different lengths share ``max_new_tokens``, hence one static-cache shape and one compiled graph)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= length, dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([_StopAfter()])


def profile_generate(model, ids: torch.Tensor, new: int, max_new: int) -> dict:
    """One greedy compiled static-cache ``generate`` (cache sized for ``max_new`` tokens) stopped after
    ``new`` tokens, under the profiler: kernel counts and GPU us by category, GPU us by kernel name,
    busy (union of kernels) and span us, host wall us."""
    from torch.profiler import ProfilerActivity, profile

    kw = dict(cache_implementation="static", stopping_criteria=stop_after(ids.shape[1] + new))
    with torch.inference_mode():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            timed_generate(model, ids, max_new, kw)
            torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    cats: dict[str, dict] = {}
    names: dict[str, float] = {}
    intervals = []
    for e in kernels:
        dur = e.time_range.end - e.time_range.start
        c = cats.setdefault(category(e.name), dict(count=0, us=0.0))
        c["count"] += 1
        c["us"] += dur
        names[e.name] = names.get(e.name, 0.0) + dur
        intervals.append((e.time_range.start, e.time_range.end))
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    return dict(categories=cats, names=names, busy_us=busy_us(intervals), span_us=span, wall_us=wall_us)


def per_step(short: dict, long: dict, steps: int) -> dict:
    """Per decode step: ``(long - short) / steps`` of every figure of two :func:`profile_generate` results
    (prefill, the first step's CUDA-graph recording and the call's fixed costs cancel)."""
    cats = {}
    for k in set(short["categories"]) | set(long["categories"]):
        a = short["categories"].get(k, dict(count=0, us=0.0))
        b = long["categories"].get(k, dict(count=0, us=0.0))
        cats[k] = dict(count=(b["count"] - a["count"]) / steps, us=(b["us"] - a["us"]) / steps)
    names = {n: (long["names"].get(n, 0.0) - short["names"].get(n, 0.0)) / steps for n in long["names"]}
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    busy = (long["busy_us"] - short["busy_us"]) / steps
    span = (long["span_us"] - short["span_us"]) / steps
    return dict(categories=dict(sorted(cats.items())), busy_us=busy, span_us=span, idle_us=span - busy,
                wall_us=(long["wall_us"] - short["wall_us"]) / steps,
                top=[dict(name=n[:160], us=u) for n, u in top])


def profile_decode(model, batch: int, prompt: int, new: int, extra: int) -> dict:
    """Per-step figures of compiled static-cache decode at ``batch``: ``generate`` of ``new`` and of
    ``new + extra`` tokens, each profiled, after a warm-up call that compiles and captures."""
    ids = prompt_ids(model.config.vocab_size, batch, prompt, "cuda")
    with torch.inference_mode():
        timed_generate(model, ids, new + extra, dict(cache_implementation="static"))
    short = profile_generate(model, ids, new, new + extra)
    long = profile_generate(model, ids, new + extra, new + extra)
    return per_step(short, long, extra)


def print_cell(label: str, batch: int, r: dict) -> None:
    """Print one :func:`per_step` result: span = busy + idle, host wall, then the categories by GPU time."""
    print(f"\n{label}, batch {batch}: per decode step, GPU span {r['span_us']:.0f} us = busy {r['busy_us']:.0f} "
          f"+ idle {r['idle_us']:.0f}; host wall {r['wall_us']:.0f} us")
    for k, v in sorted(r["categories"].items(), key=lambda kv: -kv[1]["us"]):
        print(f"  {k:24s} {v['count']:7.1f} kernels {v['us']:9.1f} us")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS), help="model shape (default %(default)s)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default="fp8-tensor", help="FP8 presets profiled after BF16 (default %(default)s)")
    ap.add_argument("--batches", default="1,16", help="decode batch sizes (default %(default)s)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (default %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens per generate call (default %(default)s)")
    ap.add_argument("--extra-tokens", type=int, default=16,
                    help="decode steps that the longer of the two profiled calls adds (default %(default)s)")
    ap.add_argument("--fuse", action="store_true",
                    help="also each preset with q/k/v and gate/up fused (fp8_linear.fuse_projections): <preset>+fused")
    ap.add_argument("--out", default=None, help="folder of the JSON (default benchmarks/results)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_profile: needs a CUDA GPU")
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model(args.model, args.layers, "cuda")
    bf16 = decoder_linears(model)
    amax = calibrate(model)
    results = {}
    presets = [p for p in args.presets.split(",") if p]
    paths = ["bf16", *presets, *([f"{p}+fused" for p in presets] if args.fuse else [])]
    for path in paths:
        preset, fused = path.removesuffix("+fused"), path.endswith("+fused")
        if preset != "bf16":
            swap_in(model, fp8_layers(bf16, preset, amax))
            if fused:
                fuse_projections(model)
        for b in batches:
            reset_compiled(model)
            r = profile_decode(model, b, args.prompt, args.new_tokens, args.extra_tokens)
            results[f"{path}/b{b}"] = r
            print_cell(path, b, r)
        unfuse_projections(model)
        swap_in(model, bf16)
        reset_compiled(model)
    rows = [dict(path=k, **v) for k, v in results.items()]
    path = write_json("step-profile", environment(dict(args=vars(args))), {}, rows, out=args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
