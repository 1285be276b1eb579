"""What every command shares: exit codes, the one-line error, and what is printed where.

- results go to stdout (``result``), always;
- information (``info``: what was loaded, how long it took, progress bars) goes to stderr unless ``-q``;
- details (``debug``: the thread count, tracebacks of unexpected errors) go to stderr with ``-v`` only;
- every error ends the run with one line ``fp8-linear <command>: error: <message>`` on stderr.
"""

from __future__ import annotations

import os
import sys
import warnings

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
#: Exit code after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

_state = {"quiet": False, "verbose": False}


class CLIError(Exception):
    """An error the CLI reports as one line on stderr with exit code 1; the message names the flag or file."""


def configure_output(quiet: bool = False, verbose: bool = False) -> None:
    """Set the output level of this run. ``quiet`` also silences the libraries: transformers' and
    huggingface_hub's progress bars and log lines, and Python warnings (errors still surface)."""
    _state["quiet"], _state["verbose"] = bool(quiet) and not verbose, bool(verbose)
    if not _state["quiet"]:
        return
    # Read by huggingface_hub and transformers at import time and by their progress-bar helpers.
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.simplefilter("ignore")
    if "transformers" in sys.modules:  # already imported: its settings no longer follow the environment
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def quiet() -> bool:
    """True under ``-q``."""
    return _state["quiet"]


def verbose() -> bool:
    """True under ``-v``."""
    return _state["verbose"]


def show_progress() -> bool:
    """Whether tqdm progress bars are shown (not under ``-q``)."""
    return not _state["quiet"]


def result(msg: str = "") -> None:
    """A result line on stdout (printed under ``-q`` too)."""
    print(msg, flush=True)


def info(msg: str) -> None:
    """An information line on stderr (not under ``-q``)."""
    if not _state["quiet"]:
        print(msg, file=sys.stderr, flush=True)


def debug(msg: str) -> None:
    """A detail line on stderr (only under ``-v``)."""
    if _state["verbose"]:
        print(msg, file=sys.stderr, flush=True)


def one_line(msg: str) -> str:
    """``msg`` on one line: its lines joined with ``"; "`` (library messages may list reasons per line)."""
    return "; ".join(s.strip() for s in str(msg).splitlines() if s.strip())


def error_line(command: str | None, msg: str) -> str:
    """``fp8-linear <command>: error: <msg>`` (argparse's own format, so usage errors read the same)."""
    return f"fp8-linear{' ' + command if command else ''}: error: {one_line(msg)}"


def flag_message(flag: str, err: BaseException, python_name: str | None = None) -> str:
    """``err``'s message with the Python argument name it starts with (``"model: "``) replaced by ``flag``."""
    msg = str(err)
    if python_name and msg.startswith(python_name + ": "):
        msg = msg[len(python_name) + 2:]
    return f"{flag}: {msg}"


def name_flags(msg: str, flags: dict[str, str]) -> str:
    """``msg`` with a leading Python argument name (``"calib_data: ..."``, as the library's errors start)
    replaced by the command's flag for it (``flags = {"calib_data": "--calib"}``); unchanged otherwise."""
    head, sep, rest = str(msg).partition(": ")
    return f"{flags[head]}: {rest}" if sep and head in flags else str(msg)
