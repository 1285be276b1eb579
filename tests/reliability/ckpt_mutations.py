"""A real tiny checkpoint held in memory, and the edits that damage it, for the untrusted-checkpoint
tests and the fuzz test of this folder.

:class:`Snapshot` keeps every file of a saved checkpoint as bytes and writes them back into a folder
(fast: the fuzz test restores the checkpoint before each mutation); :func:`rewrite_header` re-encodes a
safetensors file's header with its data bytes untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

HEADER_LEN_BYTES = 8
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"


class Snapshot:
    """Every file of checkpoint folder ``src`` as bytes (``files``), written back by :meth:`restore`."""

    def __init__(self, src: str):
        self.files = {}
        for name in sorted(os.listdir(src)):
            with open(os.path.join(src, name), "rb") as f:
                self.files[name] = f.read()

    def restore(self, folder: str) -> None:
        """Make ``folder`` hold exactly the snapshot's files."""
        if os.path.lexists(folder):
            if os.path.isdir(folder) and not os.path.islink(folder):
                shutil.rmtree(folder)
            else:
                os.remove(folder)
        os.mkdir(folder)
        for name, data in self.files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)

    def shards(self) -> list[str]:
        return sorted(n for n in self.files if n.endswith(".safetensors"))

    def json(self, name: str) -> dict:
        return json.loads(self.files[name])


def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    """``(header dict, data bytes)`` of a safetensors file's bytes."""
    (n,) = struct.unpack("<Q", data[:HEADER_LEN_BYTES])
    return json.loads(data[HEADER_LEN_BYTES: HEADER_LEN_BYTES + n]), data[HEADER_LEN_BYTES + n:]


def join_safetensors(header, body: bytes) -> bytes:
    """A safetensors file's bytes from any JSON-able ``header`` and the data bytes."""
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def rewrite_header(path: str, edit) -> None:
    """Apply ``edit(header) -> header`` to the header of safetensors file ``path`` (data kept)."""
    with open(path, "rb") as f:
        header, body = split_safetensors(f.read())
    with open(path, "wb") as f:
        f.write(join_safetensors(edit(header), body))


def edit_json(path: str, edit) -> None:
    """Apply ``edit(obj) -> obj`` to JSON file ``path``."""
    with open(path) as f:
        obj = json.load(f)
    with open(path, "w") as f:
        json.dump(edit(obj), f)


def tensor_bytes(path: str, key: str) -> tuple[int, int]:
    """Absolute ``[begin, end)`` byte range of tensor ``key`` in safetensors file ``path``."""
    with open(path, "rb") as f:
        data = f.read()
    header, _ = split_safetensors(data)
    (n,) = struct.unpack("<Q", data[:HEADER_LEN_BYTES])
    begin, end = header[key]["data_offsets"]
    return HEADER_LEN_BYTES + n + begin, HEADER_LEN_BYTES + n + end


def poke(path: str, offset: int, payload: bytes) -> None:
    """Overwrite bytes of ``path`` at ``offset``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(payload)
