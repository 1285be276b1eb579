"""Split K on the small-M shapes: ours with and without it against cuBLASLt per-tensor (steady state).

With M <= 128 the output has few tiles (M = 64, N = 4096: 32 tiles on 132 SMs), so most SMs idle and
the weight streams through a quarter of the chip. Split K (``kernels/configs.py``, ``select_splits``)
cuts K into ranges on more CTAs and sums their fp32 partials in a second small kernel.

    python benchmarks/splitk_bench.py [--ms 1,16,64,128,256] [--splits 2,4,8] [--configs 3,7] [--burn 0.1] [--rep 50]
           [--rounds 2] [--json out.json]

Columns: microseconds per call of ``auto`` (the shipped choice: select_config + select_splits),
``s1`` (no split), each forced ``sN`` (an upper bound, as FP8_LINEAR_SM90_SPLITS), each forced
kernel config ``cfgN`` (``--configs``, no split), and cuBLASLt
(``torch._scaled_mm`` per-tensor, bf16 out); ``split`` is the factor ``auto`` runs; ``ratio`` is
cuBLASLt time / ours auto (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fp8_linear.backends.sm90 import kernels_module  # noqa: E402
from gemm import LLAMA_NK  # noqa: E402
from steady_bench import time_rounds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64,128,256")
    ap.add_argument("--splits", default="2,4,8", help="forced split factors to time as well")
    ap.add_argument("--configs", default="", help="forced kernel configs to time as well (no split)")
    ap.add_argument("--burn", type=float, default=0.1)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    kern = kernels_module()
    e4, bf = torch.float8_e4m3fn, torch.bfloat16
    ms = [int(x) for x in args.ms.split(",")]
    forced = [int(x) for x in args.splits.split(",") if x.strip()]
    cfgs = [int(x) for x in args.configs.split(",") if x.strip()]
    rows = []
    head = "".join(f" {'s' + str(s):>7}" for s in [1, *forced]) + "".join(f" {'cfg' + str(c):>7}" for c in cfgs)
    print(f"{'M':>5}{'N':>7}{'K':>7} | {'auto':>7} split{head} {'cuBLASLt':>8} | ratio   (us per call)", flush=True)
    for _, n, k in LLAMA_NK:
        for m in ms:
            a = torch.randn(m, k, device="cuda").to(e4)
            b = torch.randn(n, k, device="cuda").to(e4)
            s1, s2 = torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda")
            out = torch.empty(m, n, device="cuda", dtype=bf)
            cfg = kern.select_config(m, n, k)
            auto_split = kern.select_splits(cfg, m, n, k)
            fns = {"auto": lambda: kern.sm90_gemm(a, b, s1, s2, None, bf),
                   "cublas": lambda: torch._scaled_mm(a, b.t(), scale_a=s1.reshape(()), scale_b=s2.reshape(()), out_dtype=bf)}
            for s in [1, *forced]:
                fns[f"s{s}"] = lambda s=s: kern.sm90_gemm_out(a, b, s1, s2, None, out, -1, False, s)
            for c in cfgs:
                fns[f"cfg{c}"] = lambda c=c: kern.sm90_gemm_out(a, b, s1, s2, None, out, c, False, 1)
            times = time_rounds(fns, args.rounds, args.burn, args.rep)
            us = {key: 1e3 * min(ts) for key, ts in times.items()}
            rows.append({"M": m, "N": n, "K": k, "config": cfg.id, "split": auto_split, "us": us,
                         "ratio": us["cublas"] / us["auto"]})
            cols = "".join(f" {us[f's{s}']:7.1f}" for s in [1, *forced]) + "".join(f" {us[f'cfg{c}']:7.1f}" for c in cfgs)
            print(f"{m:>5}{n:>7}{k:>7} | {us['auto']:7.1f} {auto_split:>5}{cols} {us['cublas']:8.1f} | "
                  f"{us['cublas'] / us['auto']:.3f}", flush=True)
            del a, b, out
    for m in ms:
        sel = [r for r in rows if r["M"] == m]
        g = math.exp(sum(math.log(r["ratio"]) for r in sel) / len(sel))
        g1 = math.exp(sum(math.log(r["us"]["cublas"] / r["us"]["s1"]) for r in sel) / len(sel))
        print(f"M = {m}: geomean cuBLASLt time / ours: auto {g:.3f}, without split {g1:.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "burn_s": args.burn, "rep_ms": args.rep}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
