"""Wall-clock budget of a benchmark run whose expensive steps are compiles of unknown length."""

from __future__ import annotations

import time


class Budget:
    """A run of ``seconds`` (``None``: unlimited) from construction: a compiled cell starts only if the
    slowest compile seen so far (or ``first_guess_s`` before any) still fits with ``reserve_s`` left for
    what follows the last compile (the eager reference tokens, the linear-layer split, the JSON)."""

    def __init__(self, seconds: float | None, first_guess_s: float, reserve_s: float = 30.0):
        if seconds is not None and seconds <= 0:
            raise ValueError(f"budget: expected a positive number of seconds or None, got {seconds}")
        if first_guess_s < 0 or reserve_s < 0:
            raise ValueError(f"budget: first_guess_s and reserve_s must be >= 0, got {first_guess_s}, {reserve_s}")
        self.seconds, self.first_guess_s, self.reserve_s = seconds, first_guess_s, reserve_s
        self.t0 = time.perf_counter()
        self.slowest = 0.0

    def left(self) -> float:
        """Seconds left (``inf`` without a budget; negative once overrun)."""
        return float("inf") if self.seconds is None else self.seconds - (time.perf_counter() - self.t0)

    def allows_compile(self, compiles: int = 1) -> bool:
        """Whether ``compiles`` compiles as slow as the slowest so far (the first guess before any) fit,
        reserve kept (a baseline cell asks for 2: itself and one cell to compare it with)."""
        if compiles < 1:
            raise ValueError(f"compiles: expected at least 1, got {compiles}")
        return self.left() > compiles * (self.slowest or self.first_guess_s) + self.reserve_s

    def compiled(self, seconds: float) -> None:
        """Record a compile of ``seconds`` (compile and first call)."""
        self.slowest = max(self.slowest, seconds)

    def why(self) -> str:
        """Why :meth:`allows_compile` said no, for the table and JSON."""
        return (f"--budget-s {self.seconds:.0f}: {max(self.left(), 0):.0f} s left, "
                f"a compile took up to {self.slowest or self.first_guess_s:.0f} s")
