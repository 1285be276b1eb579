"""``fp8-linear quantize``: calibrate and quantize a model, save a compressed-tensors FP8 checkpoint."""

from __future__ import annotations

import time

from .checks import check_model, check_output_folder, require_positive
from .common import EXIT_OK, CLIError, result, show_progress
from .data import read_data
from .eval_cmd import fit_length
from .loading import load
from .options import MODEL_HELP, PRESET_NAMES, add_calib_options, add_run_options, gptq_options, scheme_of, torch_dtype
from .threads import set_threads

OUTPUT_FLAG = "-o/--output"
#: Python argument names in the library's error messages -> this command's flags.
FLAGS = {"calib_data": "--calib", "model": "--model", "ignore": "--ignore", "path": OUTPUT_FLAG,
         "seq_len": "--seq-len", "max_samples": "--samples", "batch_size": "--batch-size",
         "hessian_tokens": "--hessian-tokens", "act_order": "--actorder"}


def check_ignore(patterns) -> None:
    """``--ignore`` as ``quantize_model`` checks it (``fp8_linear.checkpoint.plan.ignore_patterns``: every
    ``re:`` pattern compiles), before the model loads; :class:`CLIError` naming the flag."""
    from fp8_linear.checkpoint.plan import ignore_patterns

    try:
        ignore_patterns(patterns, "--ignore")
    except (TypeError, ValueError) as e:
        raise CLIError(str(e)) from None


def check_calib_args(args) -> None:
    """The calibration options every command that calibrates takes: sizes, ``--ignore`` patterns and the
    GPTQ options (``--actorder`` / ``--hessian-tokens`` need GPTQ)."""
    require_positive(args, "samples", "seq_len", "batch_size", "hessian_tokens")
    gptq_options(args)
    if args.threads < 0:
        raise CLIError(f"--threads: expected 0 (automatic) or a positive integer, got {args.threads}")
    check_ignore(args.ignore)


def run(args) -> int:
    import fp8_linear
    from fp8_linear.checkpoint import save_quantized

    check_calib_args(args)
    check_model(args.model, "--model")
    check_output_folder(args.output, OUTPUT_FLAG, overwrite=args.overwrite)
    calib = read_data(args.calib, "--calib")
    set_threads(args.threads)
    model, tok = load(args.model, args.dtype, "--model")
    seq_len = fit_length(model, args.seq_len, "--seq-len")
    t0 = time.perf_counter()
    fp8_linear.quantize_model(model, calib, scheme_of(args, args.scheme), tokenizer=tok, ignore=tuple(args.ignore),
                              max_samples=args.samples, seq_len=seq_len, batch_size=args.batch_size,
                              progress=show_progress(), gptq=False if args.no_gptq else None,
                              calib_dtype=torch_dtype(args.calib_dtype), **gptq_options(args))
    dt = time.perf_counter() - t0
    path = save_quantized(model, args.output, tokenizer=tok, overwrite=args.overwrite)
    n = sum(isinstance(m, fp8_linear.FP8Linear) for m in model.modules())
    result(f"quantized {n} Linear layers with {args.scheme} in {dt:.1f} s; saved to {path}")
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="calibrate and quantize a model, save a compressed-tensors checkpoint",
                       description="Calibrate and quantize a model and save it as a compressed-tensors FP8 checkpoint "
                                   "(loadable by fp8_linear.load_quantized, vLLM and transformers).")
    p.add_argument("--model", default=None, help=f"{MODEL_HELP}")
    p.add_argument("--scheme", choices=PRESET_NAMES, default="fp8-channel", help="quantization preset (default %(default)s)")
    p.add_argument("-o", "--output", required=True, metavar="FOLDER", help="checkpoint folder to write (new or empty)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint in an existing non-empty --output folder (never a folder of other files)")
    add_calib_options(p)
    add_run_options(p)
    p.set_defaults(func=run, flags=FLAGS)
