"""``grouped_fp8_gemm``: one FP8 GEMM call for every expert of a mixture-of-experts layer.

Layout (DeepGEMM's m-grouped "contiguous" layout, ``torch._grouped_mm``'s ``offs`` convention):
the rows of ``a`` are the routed tokens sorted by expert, expert ``e`` owning rows
``offsets[e-1]:offsets[e]`` (``offsets[-1] = 0``); ``b`` stacks the experts' weights ``[E, N, K]``
in the nn.Linear layout. For every expert::

    out[r, n] = sum_k a[r, k] * b[e, n, k] * scale_a[r | 0] * scale_b[e][n | 0] (+ bias[e, n])

with the dense contract of docs/design.md section 2 per expert (1x128 groups and 128x128 blocks
inside the sum). Rows past ``offsets[-1]`` (expert-parallel sentinels) belong to no expert and
come out as zeros.

Backends (``fp8_linear/moe/grouped_backends.py``), first able one wins:

1. any backend put in front with :func:`register_grouped_backend` (it answers ``supports`` /
   ``can_run`` / ``run`` on a :class:`GroupedProblem`);
2. ``sm90_grouped``: our grouped Hopper kernel (``fp8_linear/kernels/include/sm90_grouped.cuh``; one launch, the
   offsets read on the device; fp8 e4m3 / e5m2, per-tensor / per-token x per-expert / per-channel
   scales, or 1x128 activation groups x 128x128 weight blocks, bf16 / fp16 / fp32 out);
3. ``torch_grouped``: ``torch._scaled_grouped_mm`` (one launch; sm90/sm100, e4m3, per-tensor or
   per-row scales, bf16 out);
4. ``per_expert``: one dense GEMM per expert with tokens through :func:`fp8_linear.gemm.run_problem`,
   i.e. the dense dispatcher (sm90 -> cuBLASLt ``torch._scaled_mm`` -> emulated on CPU).

``FP8_LINEAR_BACKEND`` (which forces a dense backend) sends every grouped GEMM to ``per_expert``,
so the forced dense backend runs each expert. The op is the ``torch.library`` custom op
``fp8_linear::grouped_fp8_gemm`` with a fake implementation (``torch.compile`` traces it); eager
calls run the selected backend directly.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import torch

from .errors import ScaleError, ShapeError
from .formats import FP8_DTYPES, GROUP_SIZE, OUT_DTYPES
from .quantize import validate_scale

logger = logging.getLogger("fp8_linear")

#: Scale kinds of ``scale_b`` (per expert) and ``scale_a`` (per row of ``a``).
B_TENSOR, B_CHANNEL, B_BLOCK = "tensor", "channel", "block"
A_TENSOR, A_ROW, A_GROUP = "tensor", "row", "group"
OFFSET_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class GroupedProblem:
    """A validated grouped FP8 GEMM (see the module docstring for the contract).

    a: ``[M, K]`` FP8, rows sorted by expert, contiguous.
    b: ``[E, N, K]`` FP8, each expert's ``[N, K]`` K-contiguous (a strided view across experts is fine).
    scale_a: fp32 ``[1]``, ``[M, 1]`` or ``[M, ceil(K/128)]`` (groups: any strides, e.g. M-major).
    scale_b: fp32 ``[E]`` (per expert), ``[E, N]`` (per channel) or ``[E, ceil(N/128), ceil(K/128)]``.
    offsets: int32/int64 ``[E]``, cumulative row ends, non-decreasing, ``offsets[-1] <= M``.
    bias: ``None`` or ``[E, N]`` float.
    """

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    offsets: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    scale_a_kind: str
    scale_b_kind: str

    @property
    def m(self) -> int:
        return self.a.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[1]

    @property
    def k(self) -> int:
        return self.a.shape[1]

    @property
    def num_experts(self) -> int:
        return self.b.shape[0]

    @property
    def device(self) -> torch.device:
        return self.a.device

    def expert_scale_b(self, e: int) -> torch.Tensor:
        """Expert ``e``'s weight scale in the dense GEMM's shape (``[1]``, ``[N, 1]`` or blocks)."""
        if self.scale_b_kind == B_TENSOR:
            return self.scale_b[e].reshape(1)
        if self.scale_b_kind == B_CHANNEL:
            return self.scale_b[e].reshape(self.n, 1)
        return self.scale_b[e]


class GroupedBackend:
    """One way to run a :class:`GroupedProblem`; subclasses set ``name`` and implement the three methods."""

    name: str = "?"

    def supports(self, device: torch.device) -> tuple[bool, str]:
        """Whether this backend can run at all on ``device``, with the reason."""
        raise NotImplementedError

    def can_run(self, problem: GroupedProblem) -> tuple[bool, str]:
        """Whether this backend can run ``problem`` (dtypes, scale kinds, alignment), with the reason."""
        raise NotImplementedError

    def run(self, problem: GroupedProblem) -> torch.Tensor:
        """Compute ``problem``: a new ``[M, N]`` tensor of ``problem.out_dtype`` (zeros past ``offsets[-1]``)."""
        raise NotImplementedError


def _check_fp8(t, name: str, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FP8_DTYPES:
        raise TypeError(f"{name}: expected dtype float8_e4m3fn or float8_e5m2, got {t.dtype}")
    if t.dim() != dim:
        raise ShapeError(f"{name}: expected a {dim}-D tensor, got shape {list(t.shape)}")


def _float_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point or t.dtype in FP8_DTYPES:
        raise TypeError(f"{name}: expected dtype torch.float32, got {t.dtype}")


def scale_b_kind(scale_b: torch.Tensor, e: int, n: int, k: int) -> str:
    """Classify a grouped weight scale by shape (``ScaleError`` listing the accepted shapes otherwise)."""
    shp = tuple(scale_b.shape)
    if shp in ((e,), (e, 1), (e, 1, 1)):
        return B_TENSOR
    if shp in ((e, n), (e, n, 1)):
        return B_CHANNEL
    blocks = (e, math.ceil(n / GROUP_SIZE), math.ceil(k / GROUP_SIZE))
    if shp == blocks:
        return B_BLOCK
    raise ScaleError(f"scale_b: expected shape [{e}] (per expert), [{e}, {n}, 1] (per channel) or {list(blocks)} "
                     f"(128x128 blocks), got {list(shp)}")


def scale_a_kind(scale_a: torch.Tensor, m: int, k: int) -> str:
    """Classify a grouped activation scale by shape."""
    shp = tuple(scale_a.shape)
    if scale_a.numel() == 1 and len(shp) <= 2:  # for M = 1 a [1, 1] row scale is the same number
        return A_TENSOR
    if shp == (m, 1):
        return A_ROW
    if shp == (m, math.ceil(k / GROUP_SIZE)):
        return A_GROUP
    raise ScaleError(f"scale_a: expected shape [1], [{m}, 1] or [{m}, {math.ceil(k / GROUP_SIZE)}], got {list(shp)}")


def make_grouped_problem(a, b, scale_a, scale_b, offsets, bias=None, out_dtype=torch.bfloat16,
                         check_values: bool = True) -> GroupedProblem:
    """Validate grouped GEMM inputs and build a :class:`GroupedProblem` (contract: :func:`grouped_fp8_gemm`).

    ``check_values=False`` skips the scans that need a device sync (scale values, offsets order);
    the experts module, which builds its offsets itself, uses it on the hot path.
    """
    ka, kb_ = validate_grouped(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values)
    e, n = b.shape[0], b.shape[1]
    if bias is not None:
        bias = bias.contiguous()
    if ka == A_TENSOR:
        sa = scale_a.float().reshape(1)
    elif ka == A_GROUP:  # any strides: the sm90 kernel reads the M-major layout act_quant writes without a copy
        sa = scale_a if scale_a.dtype == torch.float32 else scale_a.float()
    else:
        sa = scale_a.float().contiguous()
    if kb_ == B_TENSOR:
        sb = scale_b.float().reshape(e)
    elif kb_ == B_CHANNEL:
        sb = scale_b.float().reshape(e, n)
    else:
        sb = scale_b.float().contiguous()
    return GroupedProblem(a.contiguous(), b, sa, sb, offsets, bias, out_dtype, ka, kb_)


def validate_grouped(a, b, scale_a, scale_b, offsets, bias=None, out_dtype=torch.bfloat16,
                     check_values: bool = True) -> tuple[str, str]:
    """The checks of :func:`make_grouped_problem` (typed errors naming the argument); returns the
    ``(scale_a_kind, scale_b_kind)``. Under ``torch.compile`` the grouped GEMM runs these alone at trace time
    (the op builds its problem when it runs), so tracing records no operand conversions that the op redoes."""
    _check_fp8(a, "a", 2)
    _check_fp8(b, "b", 3)
    m, k = a.shape
    e, n, kb = b.shape
    if kb != k:
        raise ShapeError(f"b: expected K={k} columns to match a [M, K]={list(a.shape)}, got b shape {list(b.shape)}")
    if e == 0:
        raise ShapeError(f"b: expected at least one expert, got shape {list(b.shape)}")
    if b.device != a.device:
        raise ValueError(f"b: expected device {a.device} (that of a), got {b.device}")
    if b.stride(-1) != 1 or (n > 1 and b.stride(-2) != k):
        raise ShapeError(f"b: expected each expert's [N, K] to be K-contiguous, got strides {list(b.stride())}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {OUT_DTYPES}, got {out_dtype}")
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"offsets: expected a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(f"offsets: expected dtype int32 or int64, got {offsets.dtype}")
    if tuple(offsets.shape) != (e,):
        raise ShapeError(f"offsets: expected shape [{e}] (one cumulative row end per expert), got {list(offsets.shape)}")
    if offsets.device != a.device:
        raise ValueError(f"offsets: expected device {a.device} (that of a), got {offsets.device}")
    for t, nm in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        _float_tensor(t, nm)
        if t.device != a.device:
            raise ValueError(f"{nm}: expected device {a.device} (that of a), got {t.device}")
    ka = scale_a_kind(scale_a, m, k)
    kb_ = scale_b_kind(scale_b, e, n, k)
    if check_values:
        validate_scale(scale_a, tuple(scale_a.shape), "scale_a")
        validate_scale(scale_b, tuple(scale_b.shape), "scale_b")
        ends = offsets.tolist()
        prev = 0
        for i, end in enumerate(ends):
            if end < prev or end > m:
                raise ValueError(f"offsets: expected non-decreasing row ends within [0, M={m}], got offsets[{i}]={end} "
                                 f"after {prev}")
            prev = end
    if bias is not None:
        _float_tensor(bias, "bias")
        if tuple(bias.shape) != (e, n):
            raise ShapeError(f"bias: expected shape [{e}, {n}], got {list(bias.shape)}")
        if bias.device != a.device:
            raise ValueError(f"bias: expected device {a.device} (that of a), got {bias.device}")
    return ka, kb_


# ---------------------------------------------------------------------------------------------- dispatch
_registered: list[GroupedBackend] = []
_supports_cache: dict[tuple[str, str], tuple[bool, str]] = {}


def register_grouped_backend(backend: GroupedBackend) -> None:
    """Put ``backend`` in front of the built-in grouped backends (e.g. one of them, to force it in a benchmark).

    It is asked first, for every grouped GEMM; registering an object with the same ``name`` again
    replaces the earlier one.
    """
    if not all(callable(getattr(backend, f, None)) for f in ("supports", "can_run", "run")):
        raise TypeError(f"backend: expected a GroupedBackend (supports / can_run / run), got {type(backend).__name__}")
    _registered[:] = [b for b in _registered if b.name != backend.name]
    _registered.insert(0, backend)
    for key in [k for k in _supports_cache if k[0] == backend.name]:
        del _supports_cache[key]


def unregister_grouped_backend(name: str) -> None:
    """Remove the registered backend called ``name`` (``KeyError`` if none is registered under it)."""
    if not any(b.name == name for b in _registered):
        raise KeyError(f"name: expected one of the registered grouped backends {[b.name for b in _registered]}, got {name!r}")
    _registered[:] = [b for b in _registered if b.name != name]


def grouped_backends() -> list[GroupedBackend]:
    """The ordered grouped backends: registered ones first, then ``sm90_grouped``, ``torch_grouped`` and ``per_expert``."""
    from .moe.grouped_backends import BUILTIN_BACKENDS

    return [*_registered, *BUILTIN_BACKENDS]


def grouped_candidates(problem: GroupedProblem) -> list[tuple[str, bool, str]]:
    """Every grouped backend's verdict on ``problem``, in order: ``[(name, ok, reason), ...]``."""
    out = []
    for b in grouped_backends():
        ok, why = _supports(b, problem.device)
        if ok:
            ok, why = b.can_run(problem)
        out.append((b.name, ok, why))
    return out


def _supports(b: GroupedBackend, device: torch.device) -> tuple[bool, str]:
    key = (b.name, str(device))
    if key not in _supports_cache:
        _supports_cache[key] = b.supports(device)
    return _supports_cache[key]


def select_grouped_backend(problem: GroupedProblem) -> GroupedBackend:
    """The grouped backend that runs ``problem`` (``per_expert`` when ``FP8_LINEAR_BACKEND`` forces a
    dense backend, else the first able one)."""
    from . import settings
    from .moe.grouped_backends import PER_EXPERT

    if settings.get().backend:  # the environment, read once (fp8_linear.settings)
        return PER_EXPERT
    for b in grouped_backends():
        ok, _ = _supports(b, problem.device)
        if ok and b.can_run(problem)[0]:
            return b
    return PER_EXPERT  # never refuses: the dense dispatcher raises with every dense backend's reason


#: (backend, device, N, K, dtypes, scale kinds) that raised at run time: ``per_expert`` takes them from then on.
_refused: set[tuple] = set()


def _signature(b: GroupedBackend, p: GroupedProblem) -> tuple:
    return (b.name, str(p.device), p.n, p.k, p.a.dtype, p.b.dtype, p.out_dtype, p.scale_a_kind, p.scale_b_kind)


def run_grouped_problem(p: GroupedProblem) -> torch.Tensor:
    """Run a validated problem on the selected grouped backend.

    A backend other than ``per_expert`` whose ``run`` raises a ``RuntimeError`` (a library refusing a
    case its ``can_run`` did not foresee) is logged once as a warning with the error, and ``per_expert``
    runs this problem and every later one of the same signature; out-of-memory errors propagate.
    """
    from .moe.grouped_backends import PER_EXPERT

    if p.m == 0 or p.n == 0:
        return torch.zeros((p.m, p.n), dtype=p.out_dtype, device=p.device)
    b = select_grouped_backend(p)
    if b is PER_EXPERT or _signature(b, p) in _refused:
        return PER_EXPERT.run(p)
    try:
        return b.run(p)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        _refused.add(_signature(b, p))
        logger.warning("fp8_linear: grouped backend %s refused N=%d K=%d (%s: %s); per_expert runs it from now on",
                       b.name, p.n, p.k, type(e).__name__, str(e)[:300])
        return PER_EXPERT.run(p)


#: True while dynamo traces (the op is then recorded); eager calls run the backend directly, as the dense
#: ops do (fp8_linear/ops.py), so compiled and eager outputs are the same backend's bits.
_compiling = torch.compiler.is_dynamo_compiling


@torch.library.custom_op("fp8_linear::grouped_fp8_gemm", mutates_args=())
def _grouped_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                offsets: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    return run_grouped_problem(make_grouped_problem(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values=False))


@_grouped_op.register_fake
def _grouped_op_fake(a, b, scale_a, scale_b, offsets, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def grouped_fp8_gemm_unchecked(a, b, scale_a, scale_b, offsets, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """:func:`grouped_fp8_gemm` without the value scans (no device sync): shapes and dtypes are still
    checked. Inputs must already satisfy the contract (finite positive scales, ordered offsets)."""
    if not _compiling():  # eager: the backend directly (no dispatcher round trip, one validation)
        return run_grouped_problem(make_grouped_problem(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values=False))
    validate_grouped(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values=False)
    return _grouped_op(a, b, scale_a, scale_b, offsets, bias, out_dtype)


def grouped_fp8_gemm(a, b, scale_a, scale_b, offsets, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Grouped FP8 GEMM over experts: ``out[r] = a[r] @ b[e(r)]^T`` with per-expert scales.

    Args:
        a: ``[M, K]`` float8_e4m3fn / float8_e5m2, the routed tokens sorted by expert.
        b: ``[E, N, K]`` float8_e4m3fn / float8_e5m2, expert weights in the nn.Linear layout
            (each expert K-contiguous).
        scale_a: fp32 ``[1]`` (per tensor), ``[M, 1]`` (per token, e.g. a static per-expert scale
            gathered per row) or ``[M, ceil(K/128)]`` (1x128 groups).
        scale_b: fp32 ``[E]`` (per expert), ``[E, N, 1]`` / ``[E, N]`` (per channel) or
            ``[E, ceil(N/128), ceil(K/128)]`` (128x128 blocks).
        offsets: int32 / int64 ``[E]``: expert ``e`` owns rows ``offsets[e-1]:offsets[e]``
            (``offsets = cumsum(tokens_per_expert)``); experts with no rows are skipped; rows past
            ``offsets[-1]`` get zeros.
        bias: optional ``[E, N]``, added in fp32 to each expert's rows.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.

    Returns:
        ``[M, N]`` tensor of ``out_dtype`` on ``a``'s device, accumulated in FP32.

    Raises ``TypeError`` / ``ShapeError`` / ``ScaleError`` / ``ValueError`` naming the argument.
    """
    if not _compiling():
        return run_grouped_problem(make_grouped_problem(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values=True))
    validate_grouped(a, b, scale_a, scale_b, offsets, bias, out_dtype, check_values=True)
    return _grouped_op(a, b, scale_a, scale_b, offsets, bias, out_dtype)


def offsets_from_counts(tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """``offsets`` (int32 ``[E]``) for :func:`grouped_fp8_gemm` from per-expert row counts ``[E]``."""
    return torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)


__all__ = [
    "GroupedBackend", "GroupedProblem", "grouped_fp8_gemm", "grouped_fp8_gemm_unchecked", "grouped_backends",
    "grouped_candidates", "make_grouped_problem", "offsets_from_counts", "register_grouped_backend",
    "run_grouped_problem", "select_grouped_backend", "unregister_grouped_backend",
]
