"""Putting a finished checkpoint folder in place of its target, crash-safe at every step.

A save works in a hidden sibling folder ``.fp8-XXXXXXXX`` (short, so a target name of up to
NAME_MAX = 255 bytes still leaves room) that holds :data:`INCOMPLETE_MARKER` while it is written
(``load_quantized`` refuses such a folder; the marker names the target and is ``flock``-ed by the
saving process, so a leftover of a killed save is told apart from a save in progress).

Placing it, under an ``flock`` of the parent folder (saves into one parent take turns here):

- no target: ``rename`` with ``RENAME_NOREPLACE``, so a folder another writer created meanwhile is
  never replaced;
- an empty folder, or a checkpoint being overwritten: ``renameat2(RENAME_EXCHANGE)`` swaps the two
  names in one step (the target always names the old or the new checkpoint, never nothing); the
  old folder, now under the hidden name, is checked again (still empty / still only checkpoint
  files, else the exchange is undone and the save refused), marked, and deleted;
- where the file system cannot exchange names, two renames with a journal ``.fp8-XXXXXXXX.swap``
  written first: :func:`recover` (run by every save into that parent, and named by a load that
  finds the target missing) puts the old checkpoint back if the second rename never happened.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import shutil

#: Marker file of an unfinished save; its content is ``{"target": name, "pid": pid}``.
INCOMPLETE_MARKER = ".fp8_linear_incomplete"
#: Prefix of the hidden sibling folders and journals of a save.
WORK_PREFIX = ".fp8-"
JOURNAL_SUFFIX = ".swap"
WORK_TOKEN_BYTES = 4
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP)


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _renameat2()


def _rename2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False when the system or file system lacks it."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), dst)


def rename_noreplace(src: str, dst: str) -> None:
    """Rename folder ``src`` to ``dst``; ``FileExistsError`` when ``dst`` exists (an empty folder included)."""
    if _rename2(src, dst, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", dst)
    try:
        os.rename(src, dst)  # without NOREPLACE: may replace an empty folder created in between (nothing lost)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(e.errno, e.strerror, dst) from e
        raise


def exchange(a: str, b: str) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False when the file system cannot."""
    return _rename2(a, b, _RENAME_EXCHANGE)


def fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirLock:
    """An exclusive ``flock`` of a folder (a context manager); a no-op where the folder cannot be opened."""

    def __init__(self, folder: str):
        self.folder = folder
        self.fd = -1

    def __enter__(self) -> DirLock:
        try:
            self.fd = os.open(self.folder, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            self.__exit__()
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock
            self.fd = -1


def new_work_dir(parent: str) -> str:
    """A new hidden folder ``parent/.fp8-XXXXXXXX`` (mode 0777 minus the umask, as ``mkdir`` gives)."""
    while True:
        path = os.path.join(parent, WORK_PREFIX + secrets.token_hex(WORK_TOKEN_BYTES))
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


class Marker:
    """:data:`INCOMPLETE_MARKER` in ``folder``, naming ``target``, ``flock``-ed while this object lives."""

    def __init__(self, folder: str, target: str):
        self.path = os.path.join(folder, INCOMPLETE_MARKER)
        self.file = open(self.path, "w", encoding="utf-8")
        fcntl.flock(self.file.fileno(), fcntl.LOCK_EX)
        json.dump({"target": os.path.basename(target), "pid": os.getpid()}, self.file)
        self.file.flush()

    def remove(self) -> None:
        """Delete the marker (the folder becomes loadable) and release its lock."""
        if not self.file.closed:
            os.remove(self.path)
            self.file.close()

    def release(self) -> None:
        if not self.file.closed:
            self.file.close()


def _dead_leftover(folder: str, target_name: str) -> bool:
    """True for a work folder of a save of ``target_name`` whose process is gone (marker unlocked)."""
    marker = os.path.join(folder, INCOMPLETE_MARKER)
    try:
        fd = os.open(marker, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live save holds it
        with os.fdopen(os.dup(fd), encoding="utf-8") as f:
            info = json.load(f)
        return isinstance(info, dict) and info.get("target") == target_name
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


def discard(folder: str, target: str) -> None:
    """Delete work folder ``folder`` (ours): marked first, so an interrupted deletion leaves a refused leftover."""
    try:
        with open(os.path.join(folder, INCOMPLETE_MARKER), "w", encoding="utf-8") as f:
            json.dump({"target": os.path.basename(target), "pid": os.getpid()}, f)
    except OSError:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def _journals(parent: str, target_name: str):
    for entry in os.listdir(parent):
        if entry.startswith(WORK_PREFIX) and entry.endswith(JOURNAL_SUFFIX):
            path = os.path.join(parent, entry)
            try:
                with open(path, encoding="utf-8") as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and info.get("target") == target_name and isinstance(info.get("old"), str):
                new = info.get("new")
                yield (path, os.path.join(parent, os.path.basename(info["old"])),
                       os.path.join(parent, os.path.basename(new)) if isinstance(new, str) else None)


def recover(target: str) -> None:
    """Finish what an interrupted save of ``target`` left (call with the parent locked): put the old
    checkpoint back when a two-rename swap stopped between its renames, and delete dead work folders."""
    parent, name = os.path.split(target)
    for journal, old, new in _journals(parent, name):
        if os.path.isdir(old):
            if not os.path.lexists(target):
                os.rename(old, target)
            else:
                discard(old, target)
        if new is not None and os.path.isdir(new):
            discard(new, target)  # the new checkpoint never made it in place
        os.remove(journal)
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if entry.startswith(WORK_PREFIX) and os.path.isdir(path) and not os.path.islink(path) and _dead_leftover(path, name):
            shutil.rmtree(path, ignore_errors=True)


def moved_aside(target: str) -> str | None:
    """Where an interrupted two-rename swap left the previous checkpoint of missing ``target``, else None."""
    parent, name = os.path.split(os.path.abspath(target))
    try:
        return next((old for _, old, _ in _journals(parent, name) if os.path.isdir(old)), None)
    except OSError:
        return None


def two_rename_swap(work: str, target: str) -> None:
    """Replace ``target`` by ``work`` where names cannot be exchanged: journal, rename the target
    aside, rename ``work`` in, delete the old folder, delete the journal."""
    parent = os.path.dirname(target)
    old = new_work_dir(parent)
    os.rmdir(old)
    journal = old + JOURNAL_SUFFIX
    with open(journal, "w", encoding="utf-8") as f:
        json.dump({"target": os.path.basename(target), "old": os.path.basename(old), "new": os.path.basename(work)}, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(parent)
    os.rename(target, old)
    os.rename(work, target)
    fsync_dir(parent)
    discard(old, target)
    os.remove(journal)
