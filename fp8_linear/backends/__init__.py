"""Ordered GEMM backends and the dispatcher (docs/design.md section 4).

Order: ``sm90`` (our Hopper kernel) -> ``cublaslt`` (``torch._scaled_mm``) -> ``emulated``.
The first backend whose ``supports(device)`` and ``can_run(problem)`` both say yes runs the
problem. ``FP8_LINEAR_BACKEND=emulated|cublaslt|sm90`` forces one; a forced backend that cannot
run raises :class:`~fp8_linear.errors.BackendUnavailableError` with its reason (no fallback).
Each choice is logged once per (backend, reason) on the ``fp8_linear`` logger.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from ..errors import BackendUnavailableError
from .base import Backend, GemmProblem
from .cublaslt import CublasLtBackend
from .emulated import EmulatedBackend

logger = logging.getLogger("fp8_linear")

#: Environment variable that forces one backend by name.
BACKEND_ENV = "FP8_LINEAR_BACKEND"


class _MissingBackend(Backend):
    """Stands in for a backend whose module failed to import; always says why."""

    def __init__(self, name: str, reason: str):
        self.name, self._reason = name, reason

    def supports(self, device):
        return False, self._reason

    def can_run(self, problem):
        return False, self._reason


def _sm90() -> Backend:
    try:
        from .sm90 import Sm90Backend
    except ImportError as e:  # the kernel package is optional at runtime
        return _MissingBackend("sm90", f"kernel module unavailable: {e}")
    return Sm90Backend()


#: The ordered backend list; the first that can take a problem wins.
BACKENDS: list[Backend] = [_sm90(), CublasLtBackend(), EmulatedBackend()]
BACKEND_NAMES = tuple(b.name for b in BACKENDS)

_supports_cache: dict[tuple[str, str], tuple[bool, str]] = {}
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``ValueError`` listing the known names otherwise."""
    for b in BACKENDS:
        if b.name == name:
            return b
    raise ValueError(f"{BACKEND_ENV}: expected one of {list(BACKEND_NAMES)}, got {name!r}")


def _supports(backend: Backend, device: torch.device) -> tuple[bool, str]:
    key = (backend.name, str(device))
    if key not in _supports_cache:
        _supports_cache[key] = backend.supports(device)
    return _supports_cache[key]


def _log_once(backend: str, reason: str) -> None:
    key = (backend, reason)
    if key in _logged:
        return
    with _lock:
        if key not in _logged:
            _logged.add(key)
            logger.info("fp8_linear: GEMM backend %s (%s)", backend, reason)


def candidates(problem: GemmProblem) -> list[tuple[str, bool, str]]:
    """Every backend's verdict on ``problem``, in order: ``[(name, ok, reason), ...]``."""
    out = []
    for b in BACKENDS:
        ok, why = _supports(b, problem.device)
        if ok:
            ok, why = b.can_run(problem)
        out.append((b.name, ok, why))
    return out


def select_backend(problem: GemmProblem, backends: "list[Backend] | None" = None) -> Backend:
    """The backend that runs ``problem`` (forced by ``FP8_LINEAR_BACKEND`` or the first able one).

    ``backends`` narrows the ordered list (default: :data:`BACKENDS`); the forced name is still
    looked up in :data:`BACKENDS`.
    """
    forced = os.environ.get(BACKEND_ENV, "").strip()
    if forced:
        b = get_backend(forced)
        ok, why = _supports(b, problem.device)
        if ok:
            ok, why = b.can_run(problem)
        if not ok:
            raise BackendUnavailableError(f"{BACKEND_ENV}={forced} cannot run this problem: {why}")
        _log_once(b.name, f"forced by {BACKEND_ENV}")
        return b
    skipped = []
    for b in BACKENDS if backends is None else backends:
        ok, why = _supports(b, problem.device)
        if ok:
            ok, why = b.can_run(problem)
        if ok:
            _log_once(b.name, "; ".join(skipped + [why]))
            return b
        skipped.append(f"{b.name} skipped: {why}")
    raise BackendUnavailableError(
        f"no FP8 GEMM backend can run M={problem.m} N={problem.n} K={problem.k}: " + "; ".join(skipped)
    )


__all__ = ["BACKENDS", "BACKEND_ENV", "BACKEND_NAMES", "Backend", "GemmProblem", "candidates", "get_backend", "select_backend"]
