"""Where a compiled decode step's GPU time goes: BF16 against FP8, kernel by kernel.

``python -m benchmarks.step_profile`` builds the Llama-3-8B-shaped model of ``benchmarks/e2e.py``
(random weights, full depth unless ``--layers``), runs transformers' compiled static-cache ``generate``
once per path and batch (compile and CUDA-graph capture), then replays the captured decode step
``--replays`` times under ``torch.profiler`` and sorts every GPU kernel into a category (our FP8 GEMM,
our activation quantization, split-K reduce, cuBLAS GEMMs, attention, inductor's Triton kernels,
copies, other). Per path and batch it prints, per decode step: the kernel count and GPU time of each
category, the GPU busy time (the union of kernel intervals) and the idle time between kernels
(replay wall time minus busy time). This locates a difference between two paths' "rest" of the step
(``benchmarks/e2e.py`` reports step = linear layers + rest) in kernels or in gaps.

The JSON (``--out``) holds the same figures plus the 12 most expensive kernel names of each path.
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from benchmarks.common.results import environment, write_json
from benchmarks.e2e import (build_model, calibrate, decoder_linears, fp8_layers, prompt_ids, reset_compiled,
                            swap_in)
from benchmarks.e2e_decode import timed_generate, wrap_compiled_step

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


def profile_step(call, replays: int) -> dict:
    """Replay ``call`` (a :class:`benchmarks.e2e_decode.LastCall`) ``replays`` times under the profiler;
    per-step kernel counts and GPU us by category, busy and idle us."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for _ in range(3):
            call.fn(*call.args, **call.kwargs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(replays):
                call.fn(*call.args, **call.kwargs)
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
    busy = busy_us(intervals)
    per = {k: dict(count=v["count"] / replays, us=v["us"] / replays) for k, v in sorted(cats.items())}
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return dict(categories=per, busy_us=busy / replays, span_us=span / replays, idle_us=(span - busy) / replays,
                wall_us=wall_us / replays, top=[dict(name=n[:160], us=u / replays) for n, u in top])


def compiled_step(model, batch: int, prompt: int, new: int):
    """Compile and capture transformers' static-cache decode step at ``batch``; the wrapped step."""
    ids = prompt_ids(model.config.vocab_size, batch, prompt)
    kw = dict(cache_implementation="static")
    with torch.inference_mode():
        timed_generate(model, ids, new, kw)
        step = wrap_compiled_step(model)
        timed_generate(model, ids, new, kw)
    return step


def print_cell(label: str, batch: int, r: dict) -> None:
    print(f"\n{label}, batch {batch}: per decode step, span {r['span_us']:.0f} us = busy {r['busy_us']:.0f} "
          f"+ idle {r['idle_us']:.0f} (host wall {r['wall_us']:.0f} us)")
    for k, v in sorted(r["categories"].items(), key=lambda kv: -kv[1]["us"]):
        print(f"  {k:24s} {v['count']:7.1f} kernels {v['us']:9.1f} us")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", help="model shape (benchmarks/e2e.py MODELS; default %(default)s)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default="fp8-tensor", help="FP8 presets profiled after BF16 (default %(default)s)")
    ap.add_argument("--batches", default="1,16", help="decode batch sizes (default %(default)s)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (default %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens per generate call (default %(default)s)")
    ap.add_argument("--replays", type=int, default=20, help="profiled replays of the step (default %(default)s)")
    ap.add_argument("--out", default=None, help="folder of the JSON (default benchmarks/results)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_profile: needs a CUDA GPU")
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model(args.model, args.layers)
    bf16 = decoder_linears(model)
    amax = calibrate(model)
    results = {}
    for preset in ["bf16", *[p for p in args.presets.split(",") if p]]:
        if preset != "bf16":
            swap_in(model, fp8_layers(bf16, preset, amax))
        for b in batches:
            reset_compiled(model)
            step = compiled_step(model, b, args.prompt, args.new_tokens)
            if step is None or step.kwargs is None:
                print(f"{preset} batch {b}: no compiled step to replay")
                continue
            r = profile_step(step, args.replays)
            results[f"{preset}/b{b}"] = r
            print_cell(preset, b, r)
        swap_in(model, bf16)
        reset_compiled(model)
    rows = [dict(path=k, **v) for k, v in results.items()]
    path = write_json("step-profile", environment(dict(args=vars(args))), {}, rows, out=args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
