"""Steady-state timing of the sm90 kernel's tile raster (row-blocks per group) against cuBLASLt.

The persistent CTAs walk the output tiles in groups of ``group_m`` row-blocks, column-major inside a
group (``tile_coords`` in kernels/include/sm90_tile.cuh); the group height sets how long a group's A
panel and the B columns in flight stay in L2. This script times forced configs under several group
heights (the FP8_LINEAR_SM90_GROUP_M override, read at each launch) in the steady state of
benchmarks/steady_bench.py: each candidate alone for ``--burn`` s, then ``do_bench`` for ``--rep`` ms,
A/B/B/A over ``--rounds``; best of the rounds' medians.

``--even-waves`` adds, for each config and group, the same launch with FP8_LINEAR_SM90_EVEN_WAVES=1 (the
fewest CTAs for the same number of waves; key suffix ``e``).

Usage: python benchmarks/raster_bench.py [--configs 7,10] [--groups 8,16,32,64] [--shapes MxNxK,...]
       [--even-waves] [--burn 0.3] [--rep 200] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from fp8_linear.backends.sm90 import kernels_module  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from steady_bench import parse_shapes, time_rounds  # noqa: E402

ENV = "FP8_LINEAR_SM90_GROUP_M"
ENV_EVEN = "FP8_LINEAR_SM90_EVEN_WAVES"
DEFAULT_SHAPES = ("8192x6144x4096,8192x4096x4096,4096x28672x4096,8192x28672x4096,8192x10240x8192,"
                  "8192x8192x8192,6144x6144x1280,2048x6144x4096")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="7,10")
    ap.add_argument("--groups", default="8,16,32,64")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--burn", type=float, default=0.3)
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--even-waves", action="store_true", help="also each launch with the even-waves grid")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cfgs = [int(c) for c in args.configs.split(",") if c.strip()]
    groups = [int(g) for g in args.groups.split(",") if g.strip()]
    kern = kernels_module()
    e4, bf = torch.float8_e4m3fn, torch.bfloat16
    evens = ("", "e") if args.even_waves else ("",)
    keys = [f"c{c}g{g}{e}" for c in cfgs for g in groups for e in evens]
    print(f"{'shape':>18} {'cuBLASLt':>8} | " + " ".join(f"{k:>8}" for k in keys) + "   (TFLOPS)", flush=True)
    rows = []
    for m, n, k in parse_shapes(args.shapes):
        a = torch.randn(m, k, device="cuda").to(e4)
        b = torch.randn(n, k, device="cuda").to(e4)
        s1, s2 = torch.tensor([0.7], device="cuda"), torch.tensor([1.3], device="cuda")
        fns = {"cublas": lambda: torch._scaled_mm(a, b.t(), scale_a=s1.reshape(()), scale_b=s2.reshape(()), out_dtype=bf)}
        for c in cfgs:
            for g in groups:
                for e in evens:
                    def fn(c=c, g=g, e=e):
                        os.environ[ENV] = str(g)
                        os.environ[ENV_EVEN] = "1" if e else "0"
                        return kern.sm90_gemm(a, b, s1, s2, None, bf, c)
                    fns[f"c{c}g{g}{e}"] = fn
        times = time_rounds(fns, args.rounds, args.burn, args.rep, batch=10)
        os.environ.pop(ENV, None)
        os.environ.pop(ENV_EVEN, None)
        tf = {key: 2 * m * n * k / (min(ts) * 1e-3) / 1e12 for key, ts in times.items()}
        rows.append({"M": m, "N": n, "K": k, "tflops": tf})
        spec = f"{m}x{n}x{k}"
        print(f"{spec:>18} {tf['cublas']:8.0f} | " + " ".join(f"{tf[k]:8.0f}" for k in keys), flush=True)
        del a, b
    for key in keys:
        gm = math.exp(sum(math.log(r["tflops"][key] / r["tflops"]["cublas"]) for r in rows) / len(rows))
        print(f"geomean {key} / cuBLASLt over {len(rows)} shapes: {gm:.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
