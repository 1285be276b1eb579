"""A checkpoint folder opened once and read as one snapshot, never outside itself.

:class:`CheckpointFolder` opens the folder's directory and reads every file through that
descriptor (``/proc/self/fd/N`` on Linux): a save that swaps a new checkpoint in while a load runs
cannot mix old and new files into one model, and :meth:`CheckpointFolder.replaced` tells the
load, at its end, that the path now names another checkpoint. A file name a checkpoint gives (an
index's ``weight_map`` entry) must be a plain relative path; after resolving symlinks it must lie
inside the folder (or, for a Hugging Face cache snapshot, in its repository's ``blobs`` folder),
and it must be a regular file (a FIFO or a device is refused, so nothing blocks).
"""

from __future__ import annotations

import json
import os
import stat

from ..errors import CheckpointError

#: Largest JSON file of a checkpoint we parse (config, index, ModelOpt config); real ones are < 10 MB.
MAX_JSON_BYTES = 64 * 2**20
#: Longest file name (path inside the folder) accepted from a checkpoint's index.
MAX_NAME_CHARS = 1024
_PROC_FD = "/proc/self/fd"
#: Hugging Face cache layout: ``models--org--name/snapshots/<rev>/file -> ../../blobs/<sha>``.
HF_SNAPSHOTS, HF_BLOBS = "snapshots", "blobs"


def folder_path(path) -> str:
    """``path`` (a ``str`` / ``bytes`` / ``os.PathLike`` naming a folder) as an absolute ``str``;
    ``TypeError`` for another type, :class:`CheckpointError` for an empty path or one with a NUL byte."""
    try:
        raw = os.fsdecode(os.fspath(path))
    except TypeError as e:
        raise TypeError(f"path: expected a folder path (str or os.PathLike), got {type(path).__name__}") from e
    if not raw or "\x00" in raw:
        raise CheckpointError(f"path: expected a folder path, got {raw!r}")
    return os.path.abspath(raw)


def check_relative_name(name, where: str) -> str:
    """``name`` if it is a plain relative path inside a folder (no ``..``, not absolute, no NUL), else
    :class:`CheckpointError` naming ``where`` (the field that gave it)."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where}: expected a file name (non-empty string), got {name!r}")
    if len(name) > MAX_NAME_CHARS or "\x00" in name or "\\" in name:
        raise CheckpointError(f"{where}: expected a plain file name, got {name[:80]!r}")
    parts = name.split("/")
    if os.path.isabs(name) or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"{where}: expected a file inside the checkpoint folder, got {name!r} (outside it)")
    return name


class CheckpointFolder:
    """The checkpoint folder ``path``, opened for reading (close it, or use it as a context manager).

    Attributes:
        path: the folder as given (absolute), for messages and ``config._name_or_path``.
        root: the path every file is opened through (``/proc/self/fd/N`` where available, else ``path``).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as e:
            raise CheckpointError(f"path: expected a checkpoint folder, got {path!r} ({e.strerror})") from e
        self._stat = os.fstat(self._fd)
        proc = os.path.join(_PROC_FD, str(self._fd))
        self.root = proc if os.path.isdir(proc) else self.path
        #: True when every file is read through the opened directory (one snapshot even if the path changes).
        self.snapshot = self.root != self.path
        self._real = os.path.realpath(self.root)
        self._blobs = self._hf_blobs()
        self._files: dict[str, object] = {}

    def _hf_blobs(self) -> str | None:
        """The ``blobs`` folder of the HF cache repository this folder is a snapshot of, else None."""
        snapshots = os.path.dirname(self._real)
        if os.path.basename(snapshots) != HF_SNAPSHOTS:
            return None
        blobs = os.path.join(os.path.dirname(snapshots), HF_BLOBS)
        return blobs if os.path.isdir(blobs) else None

    def __enter__(self) -> CheckpointFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close every file opened through this folder, and the folder."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def display(self, name: str) -> str:
        """``name`` as a path for messages (under :attr:`path`, not ``/proc``)."""
        return os.path.join(self.path, name)

    def _inside(self, real: str) -> bool:
        roots = [self._real] + ([self._blobs] if self._blobs else [])
        return any(os.path.commonpath([real, r]) == r for r in roots)

    def exists(self, name: str) -> bool:
        """True when ``name`` exists in the folder (a link counts, wherever it points)."""
        return os.path.lexists(os.path.join(self.root, name))

    def open(self, name: str, where: str | None = None):
        """The open binary file ``name`` of the folder (opened once, kept open until :meth:`close`).

        Raises :class:`CheckpointError` naming ``where`` (default: the file) when the name leaves the
        folder, resolves outside it, is missing, or is not a regular file."""
        where = where or self.display(name)
        check_relative_name(name, where)
        if name in self._files:
            return self._files[name]
        real = os.path.realpath(os.path.join(self.root, name))
        if not self._inside(real):
            raise CheckpointError(f"{where}: expected a file inside the checkpoint folder, got {name!r} "
                                  f"resolving to {real!r} (outside it)")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as e:
            raise CheckpointError(f"{where}: expected a file, got no such file") from e
        except OSError as e:
            raise CheckpointError(f"{where}: cannot open ({e.strerror})") from e
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CheckpointError(f"{where}: expected a regular file, got {_kind(real)}")
        f = os.fdopen(fd, "rb")
        self._files[name] = f
        return f

    def size(self, name: str) -> int:
        """Size in bytes of the (opened) file ``name``."""
        return os.fstat(self.open(name).fileno()).st_size

    def path_of(self, name: str) -> str:
        """A path naming the same open file ``name`` (``/proc/self/fd/N``), for readers that want a path."""
        fd = self.open(name).fileno()
        proc = os.path.join(_PROC_FD, str(fd))
        return proc if os.path.exists(proc) else os.path.realpath(os.path.join(self.root, name))

    def read_json(self, name: str) -> dict:
        """The JSON object in file ``name``; :class:`CheckpointError` naming the file when it is
        missing, larger than :data:`MAX_JSON_BYTES`, not JSON, nested too deep, or not an object."""
        where = self.display(name)
        if not self.exists(name):
            raise CheckpointError(f"{where}: expected a JSON file, got no such file")
        f = self.open(name, where)
        if self.size(name) > MAX_JSON_BYTES:
            raise CheckpointError(f"{where}: expected a JSON file of at most {MAX_JSON_BYTES} bytes, got {self.size(name)}")
        f.seek(0)
        return parse_json_object(f.read(), where)

    def replaced(self) -> bool:
        """True when :attr:`path` no longer names the folder opened (a save swapped another one in)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != (self._stat.st_dev, self._stat.st_ino)


def _kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "nothing"
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_json_object(raw: bytes, where: str) -> dict:
    """``raw`` (UTF-8 JSON) as a dict; :class:`CheckpointError` naming ``where`` for anything else
    (invalid UTF-8 or JSON, a duplicate key, NaN / Infinity literals, nesting deeper than Python's stack)."""
    def no_constants(c):
        raise ValueError(f"non-standard constant {c}")

    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: expected valid JSON, got {type(e).__name__}: {str(e)[:200]}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data
