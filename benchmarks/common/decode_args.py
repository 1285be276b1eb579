"""The command-line options that the compiled-decode profiles share (``step_profile``, ``host_profile``):
the model, the paths, the batches, the two calls' token counts, the budget and the device; and the list of
paths they make of them."""

from __future__ import annotations

import argparse

from benchmarks.common.random_model import MODELS


def path_list(presets: list[str], fuse: bool, fused_only: bool, no_pdl: bool = False) -> list[str]:
    """The profiled paths in order: ``bf16``, each preset (unless ``fused_only``), each ``<preset>+fused``
    (with ``fuse``), then every FP8 path again as ``<path>+nopdl`` (with ``no_pdl``)."""
    fp8 = [*([] if fuse and fused_only else presets), *([f"{p}+fused" for p in presets] if fuse else [])]
    return ["bf16", *fp8, *([f"{p}+nopdl" for p in fp8] if no_pdl else [])]


def add_decode_args(ap: argparse.ArgumentParser, presets: str, batches: str, new_tokens: int, extra_tokens: int,
                    new_help: str = "tokens per generate call") -> None:
    """Add ``--model --layers --presets --batches --prompt --new-tokens --extra-tokens --fuse --fused-only
    --budget-s --cell-guess-s --tiny --device --out`` to ``ap``, with the defaults given for the four
    that differ between the profiles (``new_help``: what ``--new-tokens`` counts there)."""
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS), help="model shape (default %(default)s)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's full depth)")
    ap.add_argument("--presets", default=presets, help="FP8 presets profiled after BF16 (default %(default)s)")
    ap.add_argument("--batches", default=batches, help="decode batch sizes (default %(default)s)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (default %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=new_tokens, help=new_help + " (default %(default)s)")
    ap.add_argument("--extra-tokens", type=int, default=extra_tokens,
                    help="decode steps that the longer of the two profiled calls adds (default %(default)s)")
    ap.add_argument("--fuse", action="store_true",
                    help="also each preset with q/k/v and gate/up fused (fp8_linear.fuse_projections): <preset>+fused")
    ap.add_argument("--fused-only", action="store_true", help="with --fuse: only the fused rows of the presets")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget: a path whose cell would not finish in time is skipped (and listed)")
    ap.add_argument("--cell-guess-s", type=float, default=75.0,
                    help="with --budget-s: seconds assumed for a cell before the first is measured (default %(default)s)")
    ap.add_argument("--tiny", action="store_true", help="a small model of the same architecture (checks the script)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only to check the script (no GPU kernels)")
    ap.add_argument("--out", default=None, help="folder of the JSON and traces (default benchmarks/results)")
