"""Runtime switches read from the environment, in one place, once (docs/design.md section 4).

=========================== ================================ ==============================================
variable                    values                           effect
=========================== ================================ ==============================================
``FP8_LINEAR_BACKEND``      ``sm90`` / ``cublaslt`` /        forces that backend for every GEMM and every
                            ``emulated`` (unset: automatic)  ``FP8Linear``; one that cannot run raises
``FP8_LINEAR_FUSED_QUANT``  ``0`` turns it off (default on)  CUDA activation quantization as torch ops
                                                             instead of the fused Triton kernel
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
#: Every variable this module reads.
VARIABLES = (BACKEND_ENV, FUSED_QUANT_ENV)


@dataclass(frozen=True)
class Settings:
    """The switches as read from the environment.

    Attributes:
        backend: the forced backend name (``FP8_LINEAR_BACKEND``, stripped), or ``None`` (automatic).
            Not validated here: the dispatcher raises ``ValueError`` naming the known backends.
        fused_quant: ``False`` when ``FP8_LINEAR_FUSED_QUANT=0``.
    """

    backend: str | None = None
    fused_quant: bool = True

    @classmethod
    def from_environ(cls, environ=None) -> "Settings":
        env = os.environ if environ is None else environ
        forced = (env.get(BACKEND_ENV) or "").strip()
        return cls(backend=forced or None, fused_quant=(env.get(FUSED_QUANT_ENV) or "1").strip() != "0")


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
