"""Wall-clock budget of a benchmark run whose expensive steps are compiles of unknown length."""

from __future__ import annotations

import time


class Budget:
    """A run of ``seconds`` (``None``: unlimited) from construction: a compiled cell starts only if its
    estimated compile still fits with ``reserve_s`` left for what follows the last compile (the eager
    reference tokens, the linear-layer split, the JSON). The estimate of a path's compile is the slowest
    compile of that path so far; for a path not compiled yet (or no path given), the slowest of any path,
    ``first_guess_s`` before any. So one slow path (torchao's compile: 122 s on an H200 against 38-47 s
    for ours) does not make the budget skip every other path's next batch size."""

    def __init__(self, seconds: float | None, first_guess_s: float, reserve_s: float = 30.0):
        if seconds is not None and seconds <= 0:
            raise ValueError(f"budget: expected a positive number of seconds or None, got {seconds}")
        if first_guess_s < 0 or reserve_s < 0:
            raise ValueError(f"budget: first_guess_s and reserve_s must be >= 0, got {first_guess_s}, {reserve_s}")
        self.seconds, self.first_guess_s, self.reserve_s = seconds, first_guess_s, reserve_s
        self.t0 = time.perf_counter()
        self.slowest = 0.0
        self.by_path: dict[str, float] = {}

    def left(self) -> float:
        """Seconds left (``inf`` without a budget; negative once overrun)."""
        return float("inf") if self.seconds is None else self.seconds - (time.perf_counter() - self.t0)

    def estimate(self, path: str | None = None) -> float:
        """Seconds one compile of ``path`` is expected to take (see the class)."""
        return self.by_path.get(path) or self.slowest or self.first_guess_s

    def allows_compile(self, compiles: int = 1, path: str | None = None) -> bool:
        """Whether ``compiles`` compiles of ``path`` fit, reserve kept (a baseline cell asks for 2:
        itself and one cell to compare it with)."""
        if compiles < 1:
            raise ValueError(f"compiles: expected at least 1, got {compiles}")
        return self.left() > compiles * self.estimate(path) + self.reserve_s

    def compiled(self, seconds: float, path: str | None = None) -> None:
        """Record a compile of ``seconds`` (compile and first call) of ``path``."""
        self.slowest = max(self.slowest, seconds)
        if path is not None:
            self.by_path[path] = max(self.by_path.get(path, 0.0), seconds)

    def why(self, path: str | None = None) -> str:
        """Why :meth:`allows_compile` said no, for the table and JSON."""
        whose = f"{path}'s compile" if path in self.by_path else "a compile"
        return (f"--budget-s {self.seconds:.0f}: {max(self.left(), 0):.0f} s left, "
                f"{whose} took up to {self.estimate(path):.0f} s")
