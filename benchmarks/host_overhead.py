"""Host cost of one FP8Linear call at decode size against BF16 nn.Linear (GPU machine).

Decode (M = 1) GEMMs take a few microseconds on the GPU, so a Linear layer's speed there is the
host's: Python, dispatch, the launches. Each row is the wall time per call of a loop of back-to-back
calls with no synchronization inside (the GPU keeps up, so this is the CPU cost) and the GPU time of
one call (CUDA events over 50 calls). The bar (docs/design.md section 4): an eager FP8Linear call at
M = 1 costs at most BF16 ``nn.Linear``'s host time + 2 us. The last lines print each preset's margin
and whether it meets the bar; ``--json`` writes the rows.

In a model each call goes to another module of another shape, and the larger layers' GEMMs outlast
their launch, so a loop over them would time the GPU. The ``chain`` rows call one Llama-3-8B decoder
layer's seven linear layers (:data:`LAYER_SHAPES`, distinct modules, each on its own input) in order
and time only the enqueueing: :data:`CHAIN_CALLS` layer calls between synchronizations (fewer launches
than the GPU's queue holds, so the host never waits for it), the synchronization outside the clock.

Usage: python -m benchmarks.host_overhead [--n 4096] [--k 4096] [--m 1] [--calls 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fp8_linear import FP8Linear
from fp8_linear.formats import MIN_SCALE, fmt_max

#: FP8Linear may cost this many microseconds of host time more than BF16 nn.Linear per call.
BAR_US = 2.0
PRESETS = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
#: One Llama-3-8B decoder layer's linear layers ``(N, K)`` in call order: q, k, v, o, gate, up, down.
LAYER_SHAPES = ((4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336))
#: Decoder-layer calls enqueued between synchronizations in the chain rows (7 linears, up to 2 launches
#: each: 280 launches, well below the ~1000 a CUDA stream queues before a launch blocks).
CHAIN_CALLS = 20


def per_call_us(fn, calls: int) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls (one sync at the end), best of 3."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def gpu_us(fn, calls: int = 50) -> float:
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    st.record()
    for _ in range(calls):
        fn()
    en.record()
    torch.cuda.synchronize()
    return st.elapsed_time(en) / calls * 1e3


def enqueue_us(fn, calls: int, rounds: int = 5) -> float:
    """Host microseconds per call of ``calls`` back-to-back calls, timed without the synchronization
    that follows them (best of ``rounds``): the host's cost alone while the GPU queue has room."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def measure_chain(m: int) -> dict:
    """Per path (``bf16 nn.Linear`` and ``FP8Linear <preset>``): host us per linear call of one decoder
    layer's :data:`LAYER_SHAPES` layers called in order at ``M = m`` (:func:`enqueue_us` of
    :data:`CHAIN_CALLS` layer calls, divided by 7), and the GPU us of one layer call (CUDA events)."""
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    lins = [torch.nn.Linear(k, n, bias=False, device=dev, dtype=bf) for n, k in LAYER_SHAPES]
    xs = [torch.randn(m, k, device=dev, dtype=bf) for _, k in LAYER_SHAPES]
    out = {}
    for name in ["bf16 nn.Linear", *(f"FP8Linear {s}" for s in PRESETS)]:
        try:
            mods = lins if name.startswith("bf16") else [
                FP8Linear.from_linear(lin, name.split()[-1], input_amax=x.abs().max().float()) for lin, x in zip(lins, xs)]

            def layer(mods=mods):
                for mod, x in zip(mods, xs):
                    mod(x)

            out[name] = {"host_us_per_linear": enqueue_us(layer, CHAIN_CALLS) / len(mods), "gpu_us_per_layer": gpu_us(layer, 20)}
        except Exception as e:  # noqa: BLE001 - a path that cannot run is reported, the others still are
            torch.cuda.synchronize()
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    return out


def measure(n: int, k: int, m: int, calls: int) -> dict:
    """Rows ``{name: (host us, gpu us)}`` and each preset's backend and margin over BF16 nn.Linear."""
    dev, bf = "cuda", torch.bfloat16
    lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=bf)
    x = torch.randn(m, k, device=dev, dtype=bf)
    mods = {s: FP8Linear.from_linear(lin, s, input_amax=x.abs().max().float()) for s in PRESETS}
    rows = {"bf16 nn.Linear": lin, **{f"FP8Linear {s}": mod for s, mod in mods.items()}}
    m_t = mods["fp8-tensor"]
    if m_t.backend == "sm90":
        from fp8_linear.kernels import jit

        ext = jit.load()
        from fp8_linear.backends.sm90 import _choice

        cfg, splits = _choice(m, n, k, 0, bf)
        fmax = fmt_max(m_t.weight.dtype)
        rows["ext.linear_fwd static (binding only)"] = lambda: ext.linear_fwd(
            x, m_t.weight, m_t.input_scale, m_t.weight_scale, None, 0, cfg, fmax, MIN_SCALE, splits)
    out = {"rows": {}, "presets": {}, "shape": {"m": m, "n": n, "k": k}}
    for name, fn in rows.items():
        call = (lambda f=fn: f(x)) if isinstance(fn, torch.nn.Module) else fn
        out["rows"][name] = {"host_us": per_call_us(call, calls), "gpu_us": gpu_us(call)}
    base = out["rows"]["bf16 nn.Linear"]["host_us"]
    for s, mod in mods.items():
        host = out["rows"][f"FP8Linear {s}"]["host_us"]
        out["presets"][s] = {"backend": mod.backend, "margin_us": host - base, "meets_bar": host <= base + BAR_US}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--no-chain", action="store_true", help="leave out the decoder-layer chain rows")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/host_overhead.py needs a CUDA GPU")
    res = measure(args.n, args.k, args.m, args.calls)
    print(f"M={args.m} N={args.n} K={args.k}; {args.calls} calls per row, best of 3; {torch.cuda.get_device_name()}")
    print(f"{'call':<40} {'host us/call':>12} {'gpu us':>8}")
    for name, r in res["rows"].items():
        print(f"{name:<40} {r['host_us']:12.1f} {r['gpu_us']:8.1f}")
    for s, r in res["presets"].items():
        print(f"{s}: backend {r['backend']}, host {r['margin_us']:+.1f} us vs BF16 nn.Linear "
              f"({'meets' if r['meets_bar'] else 'misses'} the +{BAR_US:g} us bar)")
    if not args.no_chain:
        res["chain"] = measure_chain(args.m)
        print(f"\nchain: one Llama-3-8B decoder layer's 7 linears in order at M={args.m}, {CHAIN_CALLS} layer calls "
              f"enqueued between synchronizations (host only), best of 5")
        print(f"{'path':<40} {'host us/linear':>14} {'gpu us/layer':>12}")
        base = res["chain"]["bf16 nn.Linear"].get("host_us_per_linear")
        for name, r in res["chain"].items():
            if "error" in r:
                print(f"{name:<40} {r['error']}")
                continue
            vs = f"  ({r['host_us_per_linear'] - base:+.1f} us vs BF16)" if base is not None and not name.startswith("bf16") else ""
            print(f"{name:<40} {r['host_us_per_linear']:14.1f} {r['gpu_us_per_layer']:12.1f}{vs}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
