"""``fp8-linear compare``: the main job. Calibrate once, quantize with each preset, save and reload each
checkpoint, evaluate all against the unquantized model on held-out text, print the table and write it
(Markdown, CSV, JSON) with PNG plots."""

from __future__ import annotations

import os
import time

from .checks import check_model, check_output_folder, require_positive
from .common import EXIT_OK, CLIError, result, show_progress
from .data import BUNDLED_DATA, DATA_HELP, read_data
from .eval_cmd import eval_batches_checked, fit_length
from .loading import load
from .options import DEFAULT_EVAL_WINDOWS, DEFAULT_SEQ_LEN, MODEL_HELP, PRESET_NAMES, WINDOWS_HELP, add_calib_options, add_run_options, gptq_options, scheme_of, torch_dtype
from .quantize_cmd import check_calib_args
from .threads import set_threads

DEFAULT_OUTPUT_DIR = "fp8-compare"
#: How the plots' titles name the default model.
BUNDLED_DESCRIPTION = "smollm2 (bundled SmolLM2-135M-Instruct, dequantized GGUF Q4_1)"
#: Calibration samples of the main job (fewer than ``quantize``'s: it also evaluates five models).
DEFAULT_COMPARE_SAMPLES = 16
FLAGS = {"calib_data": "--calib", "eval_data": "--data", "model": "--model", "ignore": "--ignore",
         "eval_windows": "--windows", "eval_seq_len": "--eval-seq-len", "seq_len": "--seq-len",
         "max_samples": "--samples", "batch_size": "--batch-size", "schemes": "--schemes",
         "hessian_tokens": "--hessian-tokens", "act_order": "--actorder"}


def run(args) -> int:
    import fp8_linear

    t0 = time.perf_counter()
    check_calib_args(args)
    require_positive(args, "windows", "eval_seq_len")
    dup = sorted({s for s in args.schemes if args.schemes.count(s) > 1})
    if dup:
        raise CLIError(f"--schemes: {', '.join(dup)} given more than once")
    check_model(args.model, "--model")
    check_output_folder(args.output, "-o/--output")
    if args.checkpoints:
        check_output_folder(args.checkpoints, "--checkpoints")
        for s in args.schemes:  # each preset's checkpoint replaces <folder>/<preset>: only a checkpoint
            check_output_folder(os.path.join(args.checkpoints, s), "--checkpoints", overwrite=True)
    data, calib = read_data(args.data, "--data"), read_data(args.calib, "--calib")
    set_threads(args.threads)
    model, tok = load(args.model, args.dtype, "--model")
    # the eval windows are checked now, before minutes of calibration
    _, eval_len = eval_batches_checked(model, data, tok, args.eval_seq_len, args.windows, "--data", "--eval-seq-len")
    seq_len = fit_length(model, args.seq_len, "--seq-len")
    schemes = [scheme_of(args, s) for s in args.schemes]
    table = fp8_linear.compare_schemes(
        model, data, schemes, calib, tokenizer=tok, ignore=tuple(args.ignore),
        max_samples=args.samples, seq_len=seq_len, batch_size=args.batch_size, eval_windows=args.windows,
        eval_seq_len=eval_len, gptq=not args.no_gptq, save_reload=not args.no_save_reload,
        checkpoint_dir=args.checkpoints, output_dir=None, progress=show_progress(),
        calib_dtype=torch_dtype(args.calib_dtype), **gptq_options(args),
    )
    table.notes["model"] = args.model or BUNDLED_DESCRIPTION
    table.notes["eval_data"] = args.data if args.data not in (None, BUNDLED_DATA) else table.notes.get("eval_data")
    table.notes["files"] = table.save(args.output)
    result(str(table))
    files = ", ".join(table.notes.get("files", {}).values())
    result(f"\nbaseline: the unquantized model in {table.notes['eval_dtype']}; wrote {files}; "
           f"total {time.perf_counter() - t0:.0f} s")
    return EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="the main job: every preset vs the unquantized model, as a table",
                       description="Calibrate once, quantize with each preset, save and reload each checkpoint, evaluate "
                                   "all against the unquantized model on held-out text, print the table, and write it "
                                   "(Markdown, CSV, JSON) with PNG plots to --output.")
    p.add_argument("--model", default=None, help=f"{MODEL_HELP}")
    p.add_argument("--schemes", nargs="+", choices=PRESET_NAMES, default=list(PRESET_NAMES), metavar="PRESET",
                   help=f"presets to compare, from {', '.join(PRESET_NAMES)} (default: all four)")
    p.add_argument("--data", metavar="DATA", default=None, help=f"evaluation data (default: the bundled eval split): {DATA_HELP}")
    p.add_argument("--windows", type=int, default=DEFAULT_EVAL_WINDOWS, metavar="N", help=WINDOWS_HELP)
    p.add_argument("--eval-seq-len", type=int, default=None, metavar="N",
                   help=f"causal LMs: tokens per perplexity window (default {DEFAULT_SEQ_LEN}, or the model's positions if fewer)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT_DIR, metavar="FOLDER",
                   help="folder for the table and plots (default %(default)s)")
    p.add_argument("--checkpoints", default=None, metavar="FOLDER",
                   help="keep the checkpoints in FOLDER/<preset> (default: a temporary folder, removed at the end)")
    p.add_argument("--no-save-reload", action="store_true",
                   help="evaluate the in-memory models instead of reloaded checkpoints (default: save and reload)")
    add_calib_options(p)
    p.set_defaults(samples=DEFAULT_COMPARE_SAMPLES)
    add_run_options(p)
    p.set_defaults(func=run, flags=FLAGS)
