"""Options several commands share, with help texts that state the real defaults (``%(default)s``)."""

from __future__ import annotations

import argparse

from .common import CLIError
from .data import DATA_HELP

PRESET_NAMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
OBSERVER_NAMES = ("minmax", "percentile", "mse")
DTYPE_NAMES = ("float32", "bfloat16")
#: ``--actorder`` values, llm-compressor's ``GPTQModifier(actorder=...)`` names: "static" = columns in order of
#: decreasing H[i, i] with the scales fixed before the sweep (the package default), "none" = the natural order.
ACTORDER_NAMES = ("static", "none")
#: The earlier GPTQ recipe's token cap of each H (``--actorder none --hessian-tokens 4096``).
EARLIER_HESSIAN_TOKENS = 4096
#: Tokens per calibration sample and per perplexity window when not given (fewer for a model with fewer positions).
DEFAULT_SEQ_LEN = 512
MODEL_HELP = ("an HF model folder, a .gguf file, an FP8 checkpoint folder, or a bundled model: 'smollm2' "
              "(SmolLM2-135M-Instruct from a GGUF Q4_1 file, the default) or 'minilm' (all-MiniLM-L6-v2)")
#: Default number of 512-token perplexity windows (= fp8_linear.calibration.evaluate.DEFAULT_EVAL_WINDOWS,
#: not imported so that --help stays fast; a test keeps the two equal): chosen from the time budget only.
DEFAULT_EVAL_WINDOWS = 16
WINDOWS_HELP = ("causal LMs: number of perplexity windows from the eval data (default %(default)s: the most that "
                "keep the main job under 200 s on an idle 2-core CPU, at about 6.75 s per 512-token window for the "
                "unquantized model + 4 presets; the bundled eval split holds 63)")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """``-q`` and ``-v``: what is printed besides results and errors."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true",
                   help="print only results and errors (no progress bars, no library messages or warnings)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also print the thread count and, for unexpected errors, the traceback")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """``--dtype``, ``--threads``, ``-q`` / ``-v``: options of every command that runs a model."""
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                   help="dtype of the unquantized parts and of activations (default %(default)s: fast and exact on CPU)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="torch CPU threads (default %(default)s = the cores other processes leave free, at least 1)")
    add_output_options(p)


def add_calib_options(p: argparse.ArgumentParser) -> None:
    """Calibration data and the quantization recipe (``quantize`` and ``compare``)."""
    p.add_argument("--calib", metavar="DATA", default=None,
                   help=f"calibration data (default: the bundled calibration split): {DATA_HELP}")
    p.add_argument("--samples", type=int, default=32, metavar="N", help="calibration samples (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help=f"tokens per calibration sample (default {DEFAULT_SEQ_LEN}, or the model's positions if fewer)")
    p.add_argument("--batch-size", type=int, default=4, metavar="N", help="samples per forward pass (default %(default)s)")
    p.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="PATTERN",
                   help="modules kept in high precision: exact names or 're:<regex>' (default: lm_head)")
    p.add_argument("--weight-observer", choices=OBSERVER_NAMES, default=None,
                   help="override the preset's weight observer (default: the preset's, minmax; mse clips outlier weights)")
    p.add_argument("--activation-observer", choices=OBSERVER_NAMES, default=None,
                   help="override the preset's activation observer (default: the preset's, minmax)")
    p.add_argument("--no-gptq", action="store_true",
                   help="round weights to nearest instead of GPTQ error compensation (default: GPTQ; faster, less accurate)")
    p.add_argument("--actorder", choices=ACTORDER_NAMES, default=None,
                   help="GPTQ column order, named as llm-compressor's GPTQModifier(actorder=...): 'static' quantizes "
                        "the weight columns in order of decreasing input energy H[i,i] with the scales fixed "
                        "beforehand (default; AutoGPTQ's desc_act=True), 'none' in their natural order. "
                        f"'--actorder none --hessian-tokens {EARLIER_HESSIAN_TOKENS}' is the earlier recipe, the "
                        "package default before 2026-12-01 (docs/calibration.md)")
    p.add_argument("--hessian-tokens", type=int, default=None, metavar="N",
                   help="calibration tokens folded into each GPTQ Hessian H = sum x x^T (default: every "
                        f"calibration token, as llm-compressor does; {EARLIER_HESSIAN_TOKENS} = the earlier recipe)")
    p.add_argument("--calib-dtype", choices=DTYPE_NAMES, default=None,
                   help="dtype of the calibration forwards (default: --dtype); bfloat16 runs ~3x faster on CPUs "
                        "with AMX, the statistics are still kept in fp32")


def gptq_options(args) -> dict:
    """``--actorder`` / ``--hessian-tokens`` as ``quantize_model``'s ``act_order`` / ``hessian_tokens``
    (``None``: the package default). Raises ``CLIError`` when either is given with ``--no-gptq``."""
    given = [f for f, v in (("--actorder", args.actorder), ("--hessian-tokens", args.hessian_tokens)) if v is not None]
    if given and args.no_gptq:
        raise CLIError(f"{' and '.join(given)}: GPTQ options, but --no-gptq turns GPTQ off; drop one of them")
    return {"act_order": None if args.actorder is None else args.actorder == "static",
            "hessian_tokens": args.hessian_tokens}


def torch_dtype(name: str | None):
    """``"float32"`` / ``"bfloat16"`` -> the torch dtype (``None`` -> ``None``)."""
    import torch

    return None if name is None else {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def scheme_of(args, preset: str):
    """The preset ``preset`` with the observers ``--weight-observer`` / ``--activation-observer`` name."""
    from fp8_linear.scheme import resolve_scheme

    s = resolve_scheme(preset)
    changes = {k: v for k, v in (("weight_observer", args.weight_observer), ("activation_observer", args.activation_observer)) if v}
    return s.with_(**changes) if changes else s
