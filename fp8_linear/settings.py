"""Runtime switches read from the environment, in one place, once (docs/design.md section 4).

=========================== ================================ ==============================================
variable                    values                           effect
=========================== ================================ ==============================================
``FP8_LINEAR_BACKEND``      ``sm90`` / ``cublaslt`` /        forces that backend for every GEMM and every
                            ``emulated`` (unset: automatic)  ``FP8Linear``; one that cannot run raises
``FP8_LINEAR_FUSED_QUANT``  ``0`` turns it off (default on)  CUDA activation quantization as torch ops
                                                             instead of the fused Triton kernel
``FP8_LINEAR_SPLIT_ROWS``   rows (tokens), default ``512``;  from that many rows an eager fused group
                            ``0`` turns it off               (``fuse_projections``) quantizes its input
                                                             once and runs each member's GEMM into its own
                                                             contiguous output (docs/serving.md)
=========================== ================================ ==============================================

The variables are read on first use and kept as a frozen :class:`Settings`. A program (or a test)
that changes them afterwards calls :func:`reload`; every ``FP8Linear`` then chooses its backend again
on its next call (``GENERATION`` counts the reloads). Nothing on the per-call path reads ``os.environ``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Forces one backend by name.
BACKEND_ENV = "FP8_LINEAR_BACKEND"
#: ``0`` turns the fused (Triton) activation quantization off.
FUSED_QUANT_ENV = "FP8_LINEAR_FUSED_QUANT"
#: Rows from which an eager fused group runs its members' GEMMs apart on one quantized input; ``0``: never.
SPLIT_ROWS_ENV = "FP8_LINEAR_SPLIT_ROWS"
#: Its default: prefill-sized inputs (measured at 2048 tokens, docs/serving.md "Fused projections").
SPLIT_ROWS_DEFAULT = 512
#: Every variable this module reads.
VARIABLES = (BACKEND_ENV, FUSED_QUANT_ENV, SPLIT_ROWS_ENV)


@dataclass(frozen=True)
class Settings:
    """The switches as read from the environment.

    Attributes:
        backend: the forced backend name (``FP8_LINEAR_BACKEND``, stripped), or ``None`` (automatic).
            Not validated here: the dispatcher raises ``ValueError`` naming the known backends.
        fused_quant: ``False`` when ``FP8_LINEAR_FUSED_QUANT=0``.
        split_rows: ``FP8_LINEAR_SPLIT_ROWS`` (a non-negative integer; ``0``: never split), else
            :data:`SPLIT_ROWS_DEFAULT`; ``ValueError`` for anything else.
    """

    backend: str | None = None
    fused_quant: bool = True
    split_rows: int = SPLIT_ROWS_DEFAULT

    @classmethod
    def from_environ(cls, environ=None) -> "Settings":
        env = os.environ if environ is None else environ
        forced = (env.get(BACKEND_ENV) or "").strip()
        raw = (env.get(SPLIT_ROWS_ENV) or "").strip()
        if raw and not raw.isdigit():
            raise ValueError(f"{SPLIT_ROWS_ENV}: expected a non-negative integer (rows), got {raw!r}")
        return cls(backend=forced or None, fused_quant=(env.get(FUSED_QUANT_ENV) or "1").strip() != "0",
                   split_rows=int(raw) if raw else SPLIT_ROWS_DEFAULT)


_current: Settings | None = None
#: Incremented by every :func:`reload`; ``FP8Linear`` compares it with the generation its backend was chosen in.
GENERATION = 0


def get() -> Settings:
    """The current settings (read from the environment on the first call)."""
    global _current
    if _current is None:
        _current = Settings.from_environ()
    return _current


def reload() -> Settings:
    """Read the environment again; modules choose their backend again on their next call."""
    global _current, GENERATION
    _current = Settings.from_environ()
    GENERATION += 1
    return _current


__all__ = ["BACKEND_ENV", "FUSED_QUANT_ENV", "GENERATION", "Settings", "VARIABLES", "get", "reload"]
