"""Record the files this process opens (Python's ``open`` audit event, which ``open()``, ``os.open``
and every import raise), to show that a load reads nothing outside its checkpoint folder.

``safetensors`` opens files from Rust, unaudited; the loader only hands it ``/proc/self/fd/N`` of
files it opened (audited) and checked itself, so the Python events cover every file a load reads.
"""

from __future__ import annotations

import contextlib
import os
import sys

_recording: list[str] | None = None
_busy = False


def _hook(event: str, args) -> None:
    global _busy
    if event != "open" or _recording is None or _busy or not args or isinstance(args[0], int):
        return
    _busy = True
    try:
        _recording.append(os.path.realpath(os.fsdecode(args[0])))
    except (TypeError, ValueError, OSError):
        pass
    finally:
        _busy = False


sys.addaudithook(_hook)  # once per process; inert outside recording_opens()


@contextlib.contextmanager
def recording_opens():
    """Collect the resolved paths of the files opened inside the ``with`` block into the yielded list."""
    global _recording
    opened: list[str] = []
    previous, _recording = _recording, opened
    try:
        yield opened
    finally:
        _recording = previous


def outside(opened: list[str], area: str, folder: str) -> list[str]:
    """The opened paths inside ``area`` but not inside ``folder`` (both resolved)."""
    area, folder = os.path.realpath(area), os.path.realpath(folder)
    return [p for p in opened if os.path.commonpath([p, area]) == area and os.path.commonpath([p, folder]) != folder]
