"""A printed log that is also kept, for the benchmarks that write their output to a file."""

from __future__ import annotations

import os


class Log:
    """Print lines as they come (``log(line)``) and keep them for :meth:`write`."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self, path: str) -> None:
        """Write every line so far to ``path`` (its folder is created)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")
