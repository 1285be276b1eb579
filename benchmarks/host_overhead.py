"""Host-side cost of one FP8Linear call at decode size, piece by piece (GPU machine).

Decode (M = 1) GEMMs take a few microseconds on the GPU, so a Linear layer's speed there is the
host's: Python, the dispatcher, the torch op, tensor-map encoding, the launch. Each row below is
the wall time per call of a loop of back-to-back calls with no synchronization inside the loop
(the GPU keeps up, so this is the CPU cost), and the GPU time of one call (CUDA events).

Rows "FP8Linear <preset>" run with the decode fast path (fp8_linear/fast_path.py: one host call
quantizes and runs the GEMM); rows "... generic" with FP8_LINEAR_FAST_PATH=0 (the dispatch path).

Usage: python benchmarks/host_overhead.py [--n 4096] [--k 4096] [--calls 2000] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fp8_linear import FP8Linear, fast_path  # noqa: E402
from fp8_linear.backends import select_backend  # noqa: E402
from fp8_linear.backends.sm90 import kernels_module  # noqa: E402
from fp8_linear.gemm import make_problem, run_problem  # noqa: E402
from fp8_linear.formats import MIN_SCALE, fmt_max  # noqa: E402
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked  # noqa: E402

#: Environment of the generic-path rows.
GENERIC = {fast_path.ENV_FAST_PATH: "0"}


@contextlib.contextmanager
def environ(overrides: dict[str, str]):
    """Set environment variables for the block and restore them after."""
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def per_call_us(fn, calls: int) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls (one sync at the end)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler tables of FP8Linear calls (generic and fast path)")
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    lin = torch.nn.Linear(args.k, args.n, bias=False, device=dev, dtype=bf)
    x = torch.randn(args.m, args.k, device=dev, dtype=bf)
    kern = kernels_module()
    from fp8_linear.kernels import jit

    mods = {}
    for scheme in ("fp8-tensor", "fp8-channel", "fp8-dynamic"):
        mods[scheme] = FP8Linear.from_linear(lin, scheme, input_amax=x.abs().max().float())
    m_t = mods["fp8-tensor"]
    q = quantize_unchecked(x, m_t.weight.dtype, m_t.input_scale)
    prob = make_problem(q, m_t.weight, m_t.input_scale, m_t.weight_scale, None, bf, check_values=False)
    be = select_backend(prob)
    out = torch.empty(args.m, args.n, device=dev, dtype=bf)
    ext = jit.load()
    cfg = kern.select_config(args.m, args.n, args.k).id
    code, fmax = (0 if m_t.weight.dtype == torch.float8_e4m3fn else 1), fmt_max(m_t.weight.dtype)
    rows = [
        ("bf16 F.linear", lambda: torch.nn.functional.linear(x, lin.weight)),
        ("torch._scaled_mm (cuBLASLt)", lambda: torch._scaled_mm(q, m_t.weight.t(), scale_a=m_t.input_scale.reshape(()),
                                                                  scale_b=m_t.weight_scale.reshape(()), out_dtype=bf)),
        ("ext.gemm_out (binding only)", lambda: ext.gemm_out(q, m_t.weight, m_t.input_scale, m_t.weight_scale, None, out, 1, 0)),
        ("kern.sm90_gemm_out (+select_config)", lambda: kern.sm90_gemm_out(q, m_t.weight, m_t.input_scale, m_t.weight_scale, None, out)),
        ("torch.ops sm90_gemm (+op dispatch)", lambda: kern.sm90_gemm(q, m_t.weight, m_t.input_scale, m_t.weight_scale, None, bf)),
        ("backend.run", lambda: be.run(prob)),
        ("run_problem (+select_backend)", lambda: run_problem(prob)),
        ("make_problem", lambda: make_problem(q, m_t.weight, m_t.input_scale, m_t.weight_scale, None, bf, check_values=False)),
        ("quantize_unchecked (static act)", lambda: quantize_unchecked(x, m_t.weight.dtype, m_t.input_scale)),
        ("dynamic_quantize (per token)", lambda: dynamic_quantize(x, m_t.weight.dtype, "token")),
        ("ext.act_quant (static, binding only)", lambda: ext.act_quant(x, code, 0, m_t.input_scale, fmax, MIN_SCALE)),
        ("ext.act_quant (per token, binding only)", lambda: ext.act_quant(x, code, 1, None, fmax, MIN_SCALE)),
        ("ext.linear_fwd static (binding only)", lambda: ext.linear_fwd(x, m_t.weight, m_t.input_scale, m_t.weight_scale,
                                                                          None, 0, cfg, fmax, MIN_SCALE)),
    ] + [(f"FP8Linear {s} generic", (lambda mod=mod: mod(x)), GENERIC) for s, mod in mods.items()] + [
        (f"FP8Linear {s}", (lambda mod=mod: mod(x))) for s, mod in mods.items()]
    print(f"backend chosen: {be.name}; M={args.m} N={args.n} K={args.k}; {args.calls} calls each")
    print(f"{'call':<40} {'host us/call':>12} {'gpu us':>8}")
    for name, fn, *env in rows:
        with environ(env[0] if env else {}):
            us = per_call_us(fn, args.calls)
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            st.record()
            for _ in range(50):
                fn()
            en.record()
            torch.cuda.synchronize()
        print(f"{name:<40} {us:12.1f} {st.elapsed_time(en) / 50 * 1e3:8.1f}", flush=True)
    for s, mod in mods.items():
        print(f"fast path {s}: {mod.__dict__[fast_path.STATE_ATTR].reason}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for label, env in (("generic", GENERIC), ("fast path", {})):
            with environ(env), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(200):
                    mods["fp8-tensor"](x)
                torch.cuda.synchronize()
            print(f"FP8Linear fp8-tensor, {label}:")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
