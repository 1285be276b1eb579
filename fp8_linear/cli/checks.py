"""Checks of the command line's inputs, made before any model loads: each failure is a
:class:`~fp8_linear.cli.common.CLIError` naming the flag (``--calib``, ``-o/--output``) and the path."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .common import CLIError, flag_message

#: Fallbacks where ``os.pathconf`` cannot tell (the Linux limits).
NAME_MAX_DEFAULT, PATH_MAX_DEFAULT = 255, 4096
#: Longest part of an over-long name quoted in a message.
QUOTE_CHARS = 40


def _quote(name: str) -> str:
    return repr(name if len(name) <= QUOTE_CHARS else name[:QUOTE_CHARS] + "...")


def _nearest_existing(p: Path) -> Path:
    """The longest prefix of ``p`` that exists (at least the current folder or ``/``)."""
    q = p.absolute()
    while not os.path.lexists(q) and q != q.parent:
        q = q.parent
    return q


def check_path_length(path: str | os.PathLike, flag: str) -> Path:
    """``Path(path)`` if every part of it fits the file system's name and path limits, else a
    :class:`CLIError` (the OS would answer "File name too long" from deep inside a library)."""
    p = Path(path)
    base = _nearest_existing(p)
    probe = base if base.is_dir() else base.parent
    try:
        name_max, path_max = os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = NAME_MAX_DEFAULT, PATH_MAX_DEFAULT
    for part in p.parts:
        n = len(os.fsencode(part))
        if n > name_max:
            raise CLIError(f"{flag}: the name {_quote(part)} is {n} bytes long; this file system allows {name_max}")
    n = len(os.fsencode(str(p.absolute())))
    if n > path_max:
        raise CLIError(f"{flag}: the path is {n} bytes long; this file system allows {path_max}")
    return p


def check_input_file(path: str | os.PathLike, flag: str, *, folder_ok: bool = False) -> Path:
    """An existing, readable regular file (or folder when ``folder_ok``) named by ``flag``."""
    p = check_path_length(path, flag)
    if not p.exists():
        raise CLIError(f"{flag}: {str(p)!r} does not exist")
    if p.is_dir():
        if not folder_ok:
            raise CLIError(f"{flag}: {str(p)!r} is a folder, expected a file")
    elif not stat.S_ISREG(p.stat().st_mode):
        raise CLIError(f"{flag}: {str(p)!r} is not a regular file (a pipe or device would block the read)")
    if not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
        raise CLIError(f"{flag}: {str(p)!r} is not readable (permission denied)")
    return p


def _check_creatable(p: Path, flag: str) -> None:
    """``p`` does not exist: its nearest existing ancestor must be a writable folder."""
    base = _nearest_existing(p)
    if not base.is_dir():
        raise CLIError(f"{flag}: cannot create {str(p)!r}: {str(base)!r} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise CLIError(f"{flag}: cannot create {str(p)!r}: the folder {str(base)!r} is not writable")


def is_checkpoint_folder(p: Path) -> bool:
    """True for a folder holding a model checkpoint: a ``config.json`` next to ``*.safetensors`` shards."""
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def check_output_folder(path: str | os.PathLike, flag: str, *, overwrite: bool | None = None) -> Path:
    """A folder the command may write into.

    ``overwrite=None``: files are added to the folder (tables, plots), it only has to be a folder or
    creatable. ``False`` / ``True``: a checkpoint folder: new or empty, or (with ``--overwrite``) holding
    a checkpoint, never a folder of other files (replacing it would delete them).
    """
    p = check_path_length(path, flag)
    if not os.path.lexists(p):
        _check_creatable(p, flag)
        return p
    if not p.is_dir():
        raise CLIError(f"{flag}: {str(p)!r} is a file, expected a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise CLIError(f"{flag}: the folder {str(p)!r} is not writable")
    if overwrite is None or not any(p.iterdir()):
        return p
    if not overwrite:
        raise CLIError(f"{flag}: {str(p)!r} is not empty; pass --overwrite to replace the checkpoint in it")
    if not is_checkpoint_folder(p):
        raise CLIError(f"{flag}: {str(p)!r} holds files but no checkpoint (config.json and *.safetensors); "
                       "--overwrite replaces only a checkpoint folder")
    return p


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """A file the command may write (created or replaced)."""
    p = check_path_length(path, flag)
    if p.is_dir():
        raise CLIError(f"{flag}: {str(p)!r} is a folder, expected a file name")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise CLIError(f"{flag}: {str(p)!r} is not writable")
    elif not p.parent.is_dir():
        raise CLIError(f"{flag}: the folder {str(p.parent)!r} does not exist")
    elif not os.access(p.parent, os.W_OK | os.X_OK):
        raise CLIError(f"{flag}: the folder {str(p.parent)!r} is not writable")
    return p


def check_model(spec: str | None, flag: str) -> None:
    """``spec`` names a model :func:`fp8_linear.models.load_model` can open (a bundled name, a ``.gguf``
    file, an HF or FP8 checkpoint folder with a readable ``config.json``)."""
    from fp8_linear.models import BUNDLED, resolve_model_path

    if spec is not None and spec not in BUNDLED:
        check_path_length(spec, flag)
    try:
        folder, gguf = resolve_model_path(spec)
    except (OSError, ValueError) as e:
        raise CLIError(flag_message(flag, e, "model")) from None
    if gguf is None:
        cfg = Path(folder) / "config.json"
        try:
            json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CLIError(f"{flag}: {str(cfg)!r} is not a readable JSON file ({e})") from None


def require_positive(args, *dests: str) -> None:
    """Every ``args.<dest>`` that is set is a positive int; the error names the flag (``--seq-len``)."""
    for d in dests:
        v = getattr(args, d, None)
        if v is not None and v < 1:
            raise CLIError(f"--{d.replace('_', '-')}: expected a positive integer, got {v}")
