"""The GEMM benchmark: our sm90 kernel against cuBLASLt and BF16 on one shape set, in one run.

    python -m benchmarks.gemm_bench --mode decode --quick      # a smoke run (about a minute)
    python -m benchmarks.gemm_bench --mode burst               # the 68 design shapes, interleaved do_bench
    python -m benchmarks.gemm_bench --mode steady              # the 27 judged shapes (M >= 2048), steady state
    python -m benchmarks.gemm_bench --mode decode              # 10 served models' layers at M = 1 .. 1024
    python -m benchmarks.gemm_bench --mode splitk --ms 1,16,64,128 --splits 2,4,8
    python -m benchmarks.gemm_bench --mode splitk --set decode --models Qwen2.5-0.5B --splits 2,4,8
    python -m benchmarks.gemm_bench --mode raster --configs 7,10 --groups 8,16,32,64
    python -m benchmarks.gemm_bench --mode block               # block scales: 8 Llama layers x M 1 .. 8192

Run from the repository root (``benchmarks`` is a plain package). Modes differ in shape set and timing
(``benchmarks/common/timing.py``): ``burst`` interleaved ``do_bench`` rounds; ``steady`` each candidate
alone for ``--burn`` s first (the H200 holds large FP8 GEMMs at its power cap); ``decode`` CUDA graphs
over operand copies that together span ``--rotate-mb`` (no weight served from L2); ``splitk`` the
eight Llama-3 layers (``--set decode``: the decode set's models, ``--models``) at ``--ms`` with forced
split factors, in CUDA graphs below M = 2048 as in ``decode``; ``raster`` forced configs under tile-raster
group heights; ``block`` the block-scaled columns on the eight Llama-3 layers at ``--ms``, in CUDA graphs
below M = 2048 and in steady state from there.

Columns (``--columns``; times in us per call, bf16 output everywhere):
  ours          our kernel, per-tensor scales, its own config choice (the ``config`` column)
  ours_ch       ours with per-channel weight scales (per-tensor activations)
  ours_row      ours with per-token x per-channel scales
  ours_block    ``fp8_gemm``'s dispatch with 1x128 ``scale_a`` [M, K/128] and 128x128 ``scale_b``
                [N/128, K/128], timed only where the sm90 backend takes it ("n/a" and the reason if not)
  cublas_t      ``torch._scaled_mm`` per-tensor (cuBLASLt)
  cublas_row    ``torch._scaled_mm`` row-wise
  cublas_block  ``torch.nn.functional.scaled_mm`` BlockWise1x128 x BlockWise128x128 (cuBLASLt)
  bf16          ``torch.matmul`` in bf16
and per shape: ours' TFLOPS and TB/s (operands and output once), and peer time / ours (> 1: ours
faster) for each pair that ran; the summary gives the geomean of each ratio per M.
``--configs`` adds forced kernel configs (``cfg<id>``), ``--env NAME=v1,v2`` our choice with an
environment variable set around each call (``env<v>``), ``--per-channel`` the per-channel twin of both.
A JSON file with the rows, the summary, the command, GPU and versions goes to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from benchmarks.common import shapes as S
from benchmarks.common.timing import parse_env_sweep

#: splitk mode's forced split factors unless --splits says otherwise (block mode: none unless given).
SPLITK_SPLITS = "2,4,8"
MODES = ("burst", "steady", "decode", "splitk", "raster", "block")
COLUMNS = ("ours", "ours_ch", "ours_row", "ours_block", "cublas_t", "cublas_row", "cublas_block", "bf16")
DEFAULT_COLUMNS = {
    "burst": COLUMNS,
    "steady": ("ours", "ours_ch", "ours_block", "cublas_t", "cublas_block"),
    "decode": ("ours", "ours_row", "ours_block", "cublas_t", "cublas_row", "cublas_block", "bf16"),
    "splitk": ("ours", "cublas_t"),
    "raster": ("cublas_t",),
    "block": ("ours_block", "cublas_block", "ours", "bf16"),
}
DEFAULT_SET = {"burst": "design", "steady": "judged", "decode": "decode", "splitk": "design", "block": "design"}
#: Per-mode timing defaults: rounds, do_bench rep (ms), burn-in (s) before each candidate.
TIMING = {"burst": (3, 40, 0.0), "steady": (2, 400, 0.5), "decode": (3, 0, 0.0),
          "splitk": (2, 50, 0.1), "raster": (2, 200, 0.3), "block": (2, 150, 0.4)}
RASTER_SHAPES = ("8192x6144x4096,8192x4096x4096,4096x28672x4096,8192x28672x4096,8192x10240x8192,"
                 "8192x8192x8192,6144x6144x1280,2048x6144x4096")
#: M values of the splitk and block modes unless --ms says otherwise.
SPLITK_MS = "1,16,64,128,256"
BLOCK_MS = "1,16,64,128,512,2048,8192"
#: The decode mode's operand copies span at least this much: several times the L2 (the JSON records its size).
ROTATE_MB = 256


@dataclass
class Plan:
    """What one invocation measures: the shapes, the columns and the forced variants."""

    mode: str
    shapes: list
    columns: list[str]
    configs: list[str] = field(default_factory=list)
    splits: list[int] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    even_waves: bool = False
    #: Where the operands live: ``cuda``, or ``cpu`` to check the peers' plumbing and the report on a
    #: machine without a GPU (host wall-clock timing; no figure of it means anything).
    device: str = "cuda"
    env_name: str = ""
    env_values: list[str] = field(default_factory=list)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gemm_bench", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--mode", choices=MODES, default="burst")
    ap.add_argument("--set", choices=S.SET_NAMES, default=None, help="shape set (default: the mode's own)")
    ap.add_argument("--shapes", default="", help="comma-separated MxNxK shapes instead of --set")
    ap.add_argument("--quick", action="store_true", help="a small subset of the set (a smoke run)")
    ap.add_argument("--columns", default="", help=f"comma-separated, from {', '.join(COLUMNS)}")
    ap.add_argument("--configs", default="", help="forced kernel configs (ids or names) to time as well")
    ap.add_argument("--per-channel", action="store_true", help="also ours_ch and each forced config's per-channel twin")
    ap.add_argument("--env", default="", help="NAME=v1,v2,...: our choice once per value of the variable")
    ap.add_argument("--ms", default="", help="splitk and decode modes: M values (default 1,16,64,128,256 / 1,2,..,1024)")
    ap.add_argument("--models", default="", help="decode mode, and splitk with --set decode: model names of the decode set")
    ap.add_argument("--splits", default=None,
                    help=f"splitk mode (default {SPLITK_SPLITS}) and block mode (default none): forced split "
                         "factors (upper bounds)")
    ap.add_argument("--groups", default="8,16,32,64", help="raster mode: tile-raster group heights")
    ap.add_argument("--even-waves", action="store_true", help="raster mode: each launch also on the even-waves grid")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--rep", type=int, default=None, help="do_bench rep in ms")
    ap.add_argument("--burn", type=float, default=None, help="seconds of each candidate alone before timing it")
    ap.add_argument("--warm", type=float, default=3.0, help="seconds of cuBLASLt GEMMs before the first shape")
    ap.add_argument("--rotate-mb", type=int, default=ROTATE_MB, help="decode mode: operand copies span this many MB")
    ap.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    rounds, rep, burn = TIMING[args.mode]
    args.rounds = rounds if args.rounds is None else args.rounds
    args.rep = rep if args.rep is None else args.rep
    args.burn = burn if args.burn is None else args.burn
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    """The shapes and columns of an invocation (``ValueError`` on a bad list); needs no GPU."""
    mode = args.mode
    if args.shapes:
        shapes = S.parse_shapes(args.shapes)
    elif ((mode == "splitk" and args.set == "decode")
          or (mode == "decode" and (args.ms or args.models) and args.set in (None, "decode"))):
        models = tuple(m.strip() for m in args.models.split(",") if m.strip()) or None
        default = SPLITK_MS if mode == "splitk" else ""
        shapes = S.decode_set(tuple(S.parse_ints(args.ms or default, "--ms")) or S.DECODE_MS, models)
    elif mode in ("splitk", "block") and not args.set:
        default = SPLITK_MS if mode == "splitk" else BLOCK_MS
        shapes = S.small_m_set(tuple(S.parse_ints(args.ms or default, "--ms")) or (1,))
    elif mode == "raster":
        shapes = S.parse_shapes(RASTER_SHAPES)[: 2 if args.quick else None]
    else:
        shapes = S.named_set(args.set or DEFAULT_SET[mode], quick=args.quick)
    if mode in ("splitk", "block") and args.quick:
        shapes = [s for s in shapes if s.layer in ("8B o", "8B down", "70B o")]
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] or list(DEFAULT_COLUMNS[mode])
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"--columns: unknown {unknown}; expected from {list(COLUMNS)}")
    if args.per_channel and "ours_ch" not in columns:
        columns.append("ours_ch")
    plan = Plan(mode, shapes, columns, configs=[c.strip() for c in args.configs.split(",") if c.strip()])
    if mode == "splitk" or (mode == "block" and args.splits is not None):
        forced = S.parse_ints(SPLITK_SPLITS if args.splits is None else args.splits, "--splits")
        if any(s < 1 for s in forced):
            raise ValueError(f"--splits: expected factors >= 1, got {forced}")
        plan.splits = [1] + [s for s in forced if s != 1]  # s1: the unsplit launch
    if mode == "raster":
        plan.groups = S.parse_ints(args.groups, "--groups")
        plan.configs = plan.configs or ["7", "10"]
        plan.even_waves = args.even_waves
        if not plan.groups:
            raise ValueError("--groups: expected at least one group height")
    if args.env:
        if mode == "decode":
            raise ValueError("--env: not in decode mode (a CUDA graph replays its launches without the host)")
        plan.env_name, plan.env_values = parse_env_sweep(args.env)
    return plan


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        plan = make_plan(args)
    except ValueError as e:
        print(f"gemm_bench: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("gemm_bench: needs a CUDA GPU (Hopper for our kernel)", file=sys.stderr)
        return 1
    from benchmarks.gemm_run import run

    return run(plan, args)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
