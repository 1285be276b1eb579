"""Fine-grained scales on the GPU: our block-scaled kernel against cuBLASLt's block-wise ``scaled_mm``,
our per-tensor path and BF16, on the Llama-3 8B / 70B linear layers.

    python -m benchmarks.block_bench --out benchmarks/results            # 8 layers x M 1 .. 8192
    python -m benchmarks.block_bench --ms 1,16 --layers 2 --quick        # a smoke run

Columns (us per call, bf16 output): ``ours_block`` our kernel with scale_a [M, K/128] (1x128) and
scale_b [N/128, K/128] (128x128) called directly (its own config choice), ``cublas_block``
``torch.nn.functional.scaled_mm`` BlockWise1x128 x BlockWise128x128 (scale_a column-major; cuBLASLt
refuses M = 1), ``ours`` our kernel with per-tensor scales, ``bf16`` ``torch.matmul``. M <= 512: CUDA
graphs over operand copies spanning ``--rotate-mb`` (no weight from L2); M >= 2048: steady state (each
candidate burnt in alone first, the H200 runs these at its power cap). Summary per M: geomean of
cublas_block / ours_block (> 1: ours faster) and of ours / ours_block (block cost, < 1: block slower).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import torch

from benchmarks.common import operands as O
from benchmarks.common import timing as T
from benchmarks.common.results import environment

#: (layer, N, K) of the Llama-3 8B and 70B linear layers (docs/design.md section 7).
LAYERS = (("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 28672, 4096), ("8B down", 4096, 14336),
          ("70B qkv", 10240, 8192), ("70B o", 8192, 8192), ("70B gate_up", 57344, 8192),
          ("70B down", 8192, 28672))
MS = (1, 16, 64, 128, 512, 2048, 8192)
#: From this M on: steady-state timing; below: CUDA graphs over rotated operand copies.
STEADY_M = 2048
COLUMNS = ("ours_block", "cublas_block", "ours", "bf16")
US_PER_MS = 1e3


def _candidates(m: int, n: int, k: int, copies: int) -> dict[str, list]:
    """Per column, one zero-argument call per operand copy (preallocated outputs: graph-capturable)."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType

    import fp8_linear.kernels as kern

    calls: dict[str, list] = {c: [] for c in COLUMNS}
    one = torch.ones(1, device="cuda")
    for _ in range(copies):
        a, b = O.make_operand(m, k), O.make_operand(n, k)
        sa, sb = O.make_scale("group", m, k), O.make_scale("block", n, k)
        sa_cm = O.column_major(sa)
        out_blk = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        out_t = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls["ours_block"].append(lambda a=a, b=b, sa=sa, sb=sb, o=out_blk: kern.sm90_gemm_out(a, b, sa, sb, None, o))
        calls["ours"].append(lambda a=a, b=b, o=out_t: kern.sm90_gemm_out(a, b, one, one, None, o))
        if m > 1:  # cuBLASLt: CUBLAS_STATUS_NOT_SUPPORTED at M = 1
            calls["cublas_block"].append(
                lambda a=a, b=b, sa=sa_cm, sb=sb: F.scaled_mm(a, b.t(), sa, ScalingType.BlockWise1x128, sb.t(),
                                                              ScalingType.BlockWise128x128,
                                                              output_dtype=torch.bfloat16))
        xa = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        calls["bf16"].append(lambda x=xa, w=wb: torch.matmul(x, w.t()))
    if m <= 1:
        del calls["cublas_block"]
    return calls


def check_block(m: int, n: int, k: int) -> float:
    """calc_diff of ours_block against fp64 math on the dequantized operands (one launch)."""
    import fp8_linear.kernels as kern

    a, b = O.make_operand(m, k), O.make_operand(n, k)
    sa, sb = O.make_scale("group", m, k), O.make_scale("block", n, k)
    out = kern.sm90_gemm(a, b, sa, sb, None, torch.bfloat16)
    ka = torch.arange(k, device="cuda") // 128
    ref = (a.double() * sa.double()[:, ka]) @ (b.double() * sb.double()[torch.arange(n, device="cuda") // 128][:, ka]).T
    x, y = out.double(), ref
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def chosen_configs(m: int, n: int, k: int) -> str:
    """The configs (and split-K factors) of ours_block and ours, as the kernel picks them."""
    import fp8_linear.kernels as kern

    def one(block: bool) -> str:
        cfg = kern.select_config(m, n, k, swap_ok=not block, block=block)
        splits = kern.select_splits(cfg, m, n, k)
        return f"{cfg.id}" + (f"s{splits}" if splits > 1 else "")

    return f"{one(True)}/{one(False)}"


def measure(m: int, n: int, k: int, rotate_mb: int, rounds: int, burn_s: float, rep: int) -> dict[str, float | str]:
    """us per call of each column (the median round), or the error text of a column that failed."""
    if m < STEADY_M:
        per_copy = (m + n) * k + m * n * 2
        copies = O.rotation_copies(per_copy, rotate_mb * 2**20, max_copies=64)
        res = T.time_graph(_candidates(m, n, k, copies), rounds=rounds)
    else:
        fns = {name: calls[0] for name, calls in _candidates(m, n, k, 1).items()}
        res = T.time_steady(fns, rounds=rounds, burn_s=burn_s, rep=rep)
    return {name: (v if isinstance(v, str) else T.median(v) * US_PER_MS) for name, v in res.items()}


def summarize(rows: list[dict]) -> dict:
    """Per M: geomeans of cublas_block / ours_block, ours / ours_block and bf16 / ours_block, with the worst shape."""
    out = {}
    for m in sorted({r["M"] for r in rows}):
        sel = [r for r in rows if r["M"] == m]
        entry = {}
        for peer in ("cublas_block", "ours", "bf16"):
            vals = [(r["us"][peer] / r["us"]["ours_block"], r) for r in sel
                    if isinstance(r["us"].get(peer), float) and isinstance(r["us"].get("ours_block"), float)]
            if vals:
                w = min(vals, key=lambda v: v[0])
                entry[f"{peer}/ours_block"] = {"geomean": T.geomean(v for v, _ in vals), "shapes": len(vals),
                                               "worst": w[0], "worst_shape": f"{m}x{w[1]['N']}x{w[1]['K']}"}
        out[f"M={m}"] = entry
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--layers", type=int, default=len(LAYERS), help="the first N layers of the set")
    ap.add_argument("--rotate-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--burn", type=float, default=0.4, help="steady state: seconds each candidate runs first")
    ap.add_argument("--rep", type=int, default=150, help="steady state: do_bench ms")
    ap.add_argument("--quick", action="store_true", help="one round, short burn-in")
    ap.add_argument("--out", default="", help="folder for the JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.burn, args.rep = 1, 0.1, 50
    ms = [int(x) for x in args.ms.split(",") if x.strip()]
    T.warm_up(2.0)
    rows = []
    print(f"{'layer':<12}{'M':>6}{'N':>7}{'K':>7} |" + "".join(f"{c:>13}" for c in COLUMNS)
          + " | cublas_blk/blk   ours/blk   bf16/blk  diff  configs (block / per-tensor)")
    for layer, n, k in LAYERS[:args.layers]:
        for m in ms:
            us = measure(m, n, k, args.rotate_mb, args.rounds, args.burn, args.rep)
            diff = check_block(m, n, k)
            cfgs = chosen_configs(m, n, k)
            row = {"layer": layer, "M": m, "N": n, "K": k, "us": us, "calc_diff": diff, "configs": cfgs}
            rows.append(row)
            cols = "".join(f"{us[c]:13.1f}" if isinstance(us.get(c), float) else f"{'n/a':>13}" for c in COLUMNS)
            rat = "".join(f"{us[p] / us['ours_block']:11.3f}" if isinstance(us.get(p), float)
                          and isinstance(us.get("ours_block"), float) else f"{'-':>11}"
                          for p in ("cublas_block", "ours", "bf16"))
            print(f"{layer:<12}{m:>6}{n:>7}{k:>7} |{cols} |{rat}  {diff:.1e}  {cfgs}", flush=True)
            torch.cuda.empty_cache()
    summary = summarize(rows)
    for label, entry in summary.items():
        print(f"{label:>7}: " + "; ".join(f"{k} {v['geomean']:.3f} (n={v['shapes']}, worst {v['worst']:.3f} at "
                                         f"{v['worst_shape']})" for k, v in entry.items()))
    if args.out:
        path = pathlib.Path(args.out) / f"block-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": rows, "summary": summary, "env": environment(),
                                    "argv": argv, "columns": COLUMNS}, indent=1, default=str))
        print("wrote", path)
    return 0 if all(not math.isnan(r["calc_diff"]) and r["calc_diff"] < 1e-3 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
