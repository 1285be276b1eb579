"""GEMM benchmark: our sm90 kernel vs torch._scaled_mm (cuBLASLt, per-tensor and row-wise) vs bf16
torch.matmul, on the docs/design.md section 7 shape set, in one run.

    python benchmarks/gemm.py                 # full shape set, JSON to benchmarks/results/
    python benchmarks/gemm.py --quick         # a few shapes
    python benchmarks/gemm.py --configs 0,4   # also time forced kernel configs (tensor scales)

Timing: triton.testing.do_bench (CUDA events, L2 cleared before every repetition, median), random
data, bf16 output everywhere.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import pathlib
import platform
import statistics
import time
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fp8_linear.backends.sm90 import kernels_module  # noqa: E402

LLAMA_NK = [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096), ("8B down", 4096, 14336),
            ("70B qkv", 10240, 8192), ("70B o", 8192, 8192), ("70B gate_up", 57344, 8192), ("70B down", 8192, 28672)]
MS = (1, 16, 64, 128, 512, 2048, 4096, 8192)
EXTRA = [("square", 8192, 8192, 8192), ("extra", 8192, 8192, 4096), ("extra", 1024, 4096, 2048),
         ("extra", 6144, 6144, 1280)]


def shape_set(quick: bool):
    if quick:
        return [("70B o", 8192, 8192, 8192), ("8B gate_up", 4096, 28672, 4096), ("8B qkv", 2048, 6144, 4096),
                ("70B down", 4096, 8192, 28672), ("8B o", 128, 4096, 4096), ("8B o", 16, 4096, 4096),
                ("8B o", 1, 4096, 4096), ("70B o", 64, 8192, 8192)]
    out = [(name, m, n, k) for (name, n, k) in LLAMA_NK for m in MS]
    out += [(name, m, n, k) for (name, m, n, k) in EXTRA]
    return out


BURN_S = 0.2  # seconds of cuBLASLt FP8 GEMMs before each shape's timed rounds


def burn(fn, seconds: float = BURN_S) -> None:
    """Run ``fn`` back to back for ``seconds`` so that the card's clock and power state are those of
    sustained FP8 GEMM work before timing (run 12: without it, whatever is timed first after the
    fp64 correctness check ran ~5% faster than the same kernel timed later)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", default="", help="comma list of forced sm90 config ids to time as well")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep (ms) per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median taken)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--min-m", type=int, default=0, help="only shapes with M >= this (e.g. 2048: the judged set)")
    args = ap.parse_args(argv)

    from triton.testing import do_bench

    kern = kernels_module()
    dev = "cuda"
    torch.manual_seed(0)
    e4 = torch.float8_e4m3fn
    forced = [int(c) for c in args.configs.split(",") if c.strip()]
    rows = []
    hdr = (f"{'layer':<12}{'M':>6}{'N':>7}{'K':>7} | {'ours_t':>7}{'ours_ch':>8}{'ours_row':>9} | {'cublas_t':>9}"
           f"{'cublas_row':>11} | {'bf16':>6} | {'t/cuT':>6}{'row/cuR':>8}{'ch cost':>8}"
           + "".join(f"{'cfg' + str(c):>8}" for c in forced))
    print(hdr, flush=True)
    for name, m, n, k in [sh for sh in shape_set(args.quick) if sh[1] >= args.min_m]:
        a32 = torch.randn(m, k, device=dev)
        b32 = torch.randn(n, k, device=dev)
        a, b = a32.to(e4), b32.to(e4)
        abf, bbf = a32.to(torch.bfloat16), b32.to(torch.bfloat16)
        del a32, b32
        s1 = torch.tensor([0.7], device=dev)
        s2 = torch.tensor([1.3], device=dev)
        sa_row = torch.rand(m, 1, device=dev) + 0.5
        sb_row = torch.rand(n, 1, device=dev) + 0.5
        sb_row_t = sb_row.reshape(1, n).contiguous()
        bf = torch.bfloat16
        fns = {
            "ours_t": lambda: kern.sm90_gemm(a, b, s1, s2, None, bf),
            "ours_ch": lambda: kern.sm90_gemm(a, b, s1, sb_row.reshape(-1), None, bf),
            "ours_row": lambda: kern.sm90_gemm(a, b, sa_row.reshape(-1), sb_row.reshape(-1), None, bf),
            "cublas_t": lambda: torch._scaled_mm(a, b.t(), scale_a=s1.reshape(()), scale_b=s2.reshape(()), out_dtype=bf),
            "cublas_row": lambda: torch._scaled_mm(a, b.t(), scale_a=sa_row, scale_b=sb_row_t, out_dtype=bf),
            "bf16": lambda: torch.matmul(abf, bbf.t()),
        }
        for c in forced:
            fns[f"cfg{c}"] = (lambda c=c: kern.sm90_gemm(a, b, s1, s2, None, bf, c))
        # sanity: ours vs cuBLASLt on this shape
        o, r = fns["ours_t"]().float(), fns["cublas_t"]().float()
        diff = float(1 - 2 * (o.double() * r.double()).sum() / (o.double() ** 2 + r.double() ** 2).sum())
        res = {"layer": name, "M": m, "N": n, "K": k, "diff_vs_cublas": diff}
        # Rounds interleave the candidates so that clock/power drift hits them alike; the reported
        # time is the median over rounds of do_bench medians.
        times = {key: [] for key in fns}
        burn(fns["cublas_t"])
        # Odd rounds run the candidates in reverse order, so that the position inside a round (the
        # card's clock and power state drift within it) cancels out of the pairwise comparisons.
        for rnd in range(args.rounds):
            order = list(fns.items()) if rnd % 2 == 0 else list(fns.items())[::-1]
            for key, fn in order:
                if isinstance(times[key], str):
                    continue
                try:
                    times[key].append(do_bench(fn, warmup=10, rep=args.rep, return_mode="median"))
                except Exception as e:  # noqa: BLE001
                    times[key] = repr(e)[:200]
        for key, ts in times.items():
            if isinstance(ts, str):
                res[key] = {"error": ts}
            else:
                ms = statistics.median(ts)
                res[key] = {"ms": ms, "tflops": tflops(m, n, k, ms), "ms_rounds": ts}
        rows.append(res)
        tf = {key: (res[key].get("tflops", float("nan"))) for key in fns}
        if forced:
            res["best_cfg"] = max(forced, key=lambda c: tf[f"cfg{c}"] if tf[f"cfg{c}"] == tf[f"cfg{c}"] else -1.0)
        res["ratio_t"] = tf["ours_t"] / tf["cublas_t"]
        res["ratio_row"] = tf["ours_row"] / tf["cublas_row"]
        # per-channel cost: median over rounds of the per-round time ratio (the two run back to back)
        if all(isinstance(times[k], list) and times[k] for k in ("ours_t", "ours_ch")):
            res["channel_cost"] = statistics.median(c / t - 1.0 for c, t in zip(times["ours_ch"], times["ours_t"]))
        else:
            res["channel_cost"] = float("nan")
        print(f"{name:<12}{m:>6}{n:>7}{k:>7} | {tf['ours_t']:7.0f}{tf['ours_ch']:8.0f}{tf['ours_row']:9.0f} | "
              f"{tf['cublas_t']:9.0f}{tf['cublas_row']:11.0f} | {tf['bf16']:6.0f} | {res['ratio_t']:6.3f}"
              f"{res['ratio_row']:8.3f}{100 * res['channel_cost']:7.1f}%"
              + "".join(f"{tf['cfg' + str(c)]:8.0f}" for c in forced)
              + (f"  best cfg{res['best_cfg']}" if forced else ""), flush=True)
        del a, b, abf, bbf
        torch.cuda.empty_cache()

    big = [r for r in rows if r["M"] >= 2048]
    summary = {}
    if big:
        for key in ("ratio_t", "ratio_row"):
            vals = [r[key] for r in big if r[key] == r[key] and r[key] > 0]
            summary[f"geomean_{key}_M>=2048"] = math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        costs = [r["channel_cost"] for r in big]
        summary["mean_channel_cost_M>=2048"] = sum(costs) / len(costs)
        summary["max_channel_cost_M>=2048"] = max(costs)
        for c in forced:
            vals = [r[f"cfg{c}"]["tflops"] / r["cublas_t"]["tflops"] for r in big
                    if "tflops" in r[f"cfg{c}"] and "tflops" in r["cublas_t"]]
            if vals:
                summary[f"geomean_cfg{c}/cublas_t_M>=2048"] = math.exp(sum(map(math.log, vals)) / len(vals))
    sq = [r for r in rows if (r["M"], r["N"], r["K"]) == (8192, 8192, 8192)]
    if sq:
        summary["8192^3_ours_t_tflops"] = sq[0]["ours_t"].get("tflops")
        summary["8192^3_cublas_t_tflops"] = sq[0]["cublas_t"].get("tflops")
    print(json.dumps(summary, indent=1))

    import triton

    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "timing": (f"triton.testing.do_bench median (warmup 10 ms, rep {args.rep} ms, L2 cleared per rep), "
                   f"{args.rounds} interleaved rounds (odd rounds in reverse order), median over rounds; "
                   f"channel_cost = median over rounds of time(ours_ch) / time(ours_t) - 1; {BURN_S} s of "
                   "cuBLASLt GEMMs before each shape's rounds"),
        "out_dtype": "bfloat16",
        "tag": args.tag,
        "kernel_cache_key": importlib.import_module(kern.__name__ + ".jit").cache_key(),
    }
    outdir = pathlib.Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = outdir / f"gemm-{stamp}{('-' + args.tag) if args.tag else ''}.json"
    path.write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
