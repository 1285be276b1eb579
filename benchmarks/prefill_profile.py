"""Where a prefill forward's GPU time goes: BF16 against FP8, kernel category by category.

``python -m benchmarks.prefill_profile`` builds the Llama-3-8B-shaped model of ``benchmarks/e2e.py``
(random weights, full depth unless ``--layers``), and for BF16 and each FP8 preset (q/k/v and gate/up fused
with ``--fuse``) runs the eager prefill forward of ``benchmarks/e2e.py`` (one ``[1, --tokens]`` forward with
``logits_to_keep=1``) once to warm up, then ``--reps`` times under ``torch.profiler`` and ``--reps`` times
unprofiled (the forward's time, as the e2e benchmark clocks it). Per path it prints the forward's time and
GPU kernels by category (``benchmarks/common/kernel_names.py`` CATEGORIES: our FP8 GEMM, our activation
quantization, cuBLAS GEMMs, attention, inductor, copies, other): count and GPU us a forward, the GPU busy
time (union of kernel intervals), the span and the idle time between kernels, and the kernels whose time
differs most from BF16's. This locates the e2e benchmark's prefill "rest" (forward = linear layers + rest)
in kernels or in gaps.

Usage: python -m benchmarks.prefill_profile [--presets fp8-tensor] [--fuse] [--tokens 2048] [--out DIR]
       python -m benchmarks.prefill_profile --tiny --device cpu --layers 2 --tokens 64   (checks the script)
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common.cuda_clock import cuda_ms, is_cuda, sync
from benchmarks.common.kernel_names import kernel_totals
from benchmarks.common.fp8_swap import calibrate, decoder_linears, fp8_layers, swap_in
from benchmarks.common.random_model import MODELS, build_model
from benchmarks.common.results import environment, write_json
from benchmarks.common.trace_gaps import busy_us
from fp8_linear import fuse_projections, unfuse_projections

#: Kernels listed per FP8 path: those whose GPU time a forward differs most from BF16's.
TOP = 12


def profile_forward(model, ids: torch.Tensor, reps: int) -> dict:
    """``reps`` eager forwards of ``ids`` ``[1, T]`` (``logits_to_keep=1``) under the profiler, after one
    unprofiled warm-up: per forward, kernel count and GPU us by category and by kernel name, busy (union
    of kernel intervals), span and idle us."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if ids.is_cuda else ProfilerActivity.CPU
    with torch.inference_mode():
        model(ids, logits_to_keep=1)
        sync(ids.device)
        with profile(activities=[activity]) as prof:
            for _ in range(reps):
                model(ids, logits_to_keep=1)
            sync(ids.device)
        forward_ms = cuda_ms(lambda: model(ids, logits_to_keep=1), reps, ids.device)  # unprofiled, the e2e clock
    cats, names, intervals = kernel_totals(prof, reps)
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) / reps if intervals else 0.0
    busy = busy_us(intervals) / reps
    return dict(categories=dict(sorted(cats.items())), names=names, busy_us=busy, span_us=span,
                idle_us=span - busy, forward_ms=forward_ms)


def differences(row: dict, base: dict, top: int = TOP) -> list[dict]:
    """The ``top`` kernel names whose GPU us a forward differ most (in absolute value) between ``row`` and
    ``base`` (a name absent from one side counts as 0 there)."""
    names = set(row["names"]) | set(base["names"])
    diff = {n: row["names"].get(n, 0.0) - base["names"].get(n, 0.0) for n in names}
    return [dict(name=n[:160], us=d) for n, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]]


def print_row(path: str, r: dict, base: dict | None) -> None:
    speed = f" ({base['forward_ms'] / r['forward_ms']:.2f}x BF16)" if base and r["forward_ms"] else ""
    print(f"\n{path}: a forward {r['forward_ms']:.2f} ms{speed}, GPU span {r['span_us']:.0f} us = busy "
          f"{r['busy_us']:.0f} + idle {r['idle_us']:.0f}")
    for c, v in sorted(r["categories"].items(), key=lambda kv: -kv[1]["us"]):
        b = (base or {}).get("categories", {}).get(c, dict(us=0.0))["us"] if base else None
        extra = "" if b is None else f"   ({v['us'] - b:+9.1f} us against BF16)"
        print(f"  {c:26s} {v['count']:7.1f} kernels {v['us']:10.1f} us{extra}")
    for d in r.get("diff", []):
        print(f"    {d['us']:+9.1f} us  {d['name'][:110]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default="fp8-tensor", help="FP8 presets after BF16 (default %(default)s)")
    ap.add_argument("--fuse", action="store_true", help="q/k/v and gate/up fused (fp8_linear.fuse_projections)")
    ap.add_argument("--tokens", type=int, default=2048, help="prompt tokens of the forward (default %(default)s)")
    ap.add_argument("--reps", type=int, default=2, help="profiled forwards per path (default %(default)s)")
    ap.add_argument("--tiny", action="store_true", help="a small model of the same architecture (checks the script)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only to check the script")
    ap.add_argument("--out", default=None, help="folder of the JSON (default benchmarks/results)")
    args = ap.parse_args(argv)
    if is_cuda(args.device) and not torch.cuda.is_available():
        raise SystemExit("prefill_profile: needs a CUDA GPU (or --tiny --device cpu to check the script)")
    if args.tokens < 1 or args.reps < 1:
        raise SystemExit("prefill_profile: --tokens and --reps must be at least 1")
    model = build_model(args.model, args.layers, args.device, args.tiny)
    bf16 = decoder_linears(model)
    amax = calibrate(model)
    gen = torch.Generator(device=args.device).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), device=args.device, generator=gen)
    rows, base = [], None
    for preset in ["bf16"] + [p for p in args.presets.split(",") if p]:
        path = preset + ("+fused" if args.fuse and preset != "bf16" else "")
        try:
            if preset != "bf16":
                swap_in(model, fp8_layers(bf16, preset, amax))
                if args.fuse:
                    fuse_projections(model)
            r = profile_forward(model, ids, args.reps)
        finally:
            unfuse_projections(model)
            swap_in(model, bf16)
        if base is None:
            base = r
        else:
            r["diff"] = differences(r, base)
        print_row(path, r, None if r is base else base)
        rows.append(dict(path=path, **{k: v for k, v in r.items() if k != "names"}))
    written = write_json("prefill-profile", environment(dict(args=vars(args))), {}, rows, out=args.out)
    print(f"\nwrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
