"""Ordered backends and the dispatcher (docs/design.md section 4).

Order: ``sm90`` (our Hopper kernel) -> ``cublaslt`` (cuBLASLt) -> ``emulated``.

- A GEMM (``fp8_gemm``) goes to the first backend whose ``supports(device)`` and ``can_run(problem)``
  both say yes (:func:`select_backend`).
- An ``FP8Linear`` gets its backend once per device and settings (:func:`plan_layer`): the first
  whose ``can_implement(layer)`` says yes, which then prepares the layer (``process_weights``) and
  runs every call (``apply``).

``FP8_LINEAR_BACKEND=emulated|cublaslt|sm90`` (read once, :mod:`fp8_linear.settings`) forces one; a
forced backend that cannot run raises :class:`~fp8_linear.errors.BackendUnavailableError` with its
reason (no fallback). Each choice is logged once per (backend, reason) on the ``fp8_linear`` logger.
"""

from __future__ import annotations

import logging
import threading

import torch

from .. import settings
from ..errors import BackendUnavailableError
from ..settings import BACKEND_ENV
from .base import Backend, GemmProblem, LayerPlan, LinearSpec
from .cublaslt import CublasLtBackend
from .emulated import EmulatedBackend
from .sm90 import Sm90Backend

logger = logging.getLogger("fp8_linear")

#: The ordered backend list; the first that can take a problem wins.
BACKENDS: list[Backend] = [Sm90Backend(), CublasLtBackend(), EmulatedBackend()]
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
    forced = settings.get().backend
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


def layer_candidates(layer, device: torch.device | None = None) -> list[tuple[str, bool, str]]:
    """Every backend's ``can_implement`` verdict on ``layer`` (an ``FP8Linear``): ``[(name, ok, reason), ...]``."""
    return [(b.name, *b.can_implement(layer, device)) for b in BACKENDS]


#: Plain attribute of an ``FP8Linear`` naming a backend that every plan of the layer must use.
PINNED_ATTR = "pinned_backend"


def plan_layer(layer) -> LayerPlan:
    """Choose the backend of ``layer`` (an ``FP8Linear``) for its weight's device and the current
    settings, let it prepare the layer's tensors (``process_weights``), and return the plan.

    Raises :class:`BackendUnavailableError` when ``FP8_LINEAR_BACKEND`` forces a backend that cannot
    run the layer (with its reason).
    """
    st = settings.get()
    gen = settings.GENERATION
    device = layer._parameters["weight"].device
    what = f"FP8Linear(in={layer.in_features}, out={layer.out_features}, scheme={layer.scheme.name})"
    # A backend pinned on the layer (FP8LinearConfig(backend=...)) holds across re-plans (device moves,
    # replaced weights), as the environment's forced backend does.
    pinned = layer.__dict__.get(PINNED_ATTR)
    if pinned or st.backend:
        name = pinned or st.backend
        b = get_backend(name)
        ok, why = b.can_implement(layer, device)
        if not ok:
            who = f"backend {name!r} pinned on the layer" if pinned else f"{BACKEND_ENV}={name}"
            raise BackendUnavailableError(f"{who} cannot run {what} on {device}: {why}")
        reason = f"pinned on the layer ({name})" if pinned else f"forced by {BACKEND_ENV}"
    else:
        skipped, b = [], None
        for cand in BACKENDS:
            ok, why = cand.can_implement(layer, device)
            if ok:
                b, reason = cand, "; ".join(skipped + [why])
                break
            skipped.append(f"{cand.name} skipped: {why}")
        if b is None:  # the emulated backend takes every layer; only a replaced list gets here
            raise BackendUnavailableError(f"no FP8 backend can run {what} on {device}: " + "; ".join(skipped))
    b.process_weights(layer)
    _log_once(b.name, reason)
    return LayerPlan(b, LinearSpec.of(layer), layer._parameters["weight"], gen, reason)


__all__ = ["BACKENDS", "BACKEND_ENV", "BACKEND_NAMES", "Backend", "GemmProblem", "LayerPlan", "LinearSpec",
           "PINNED_ATTR", "candidates", "get_backend", "layer_candidates", "plan_layer", "select_backend"]
