"""``fp8_gemm``: the validated public GEMM entry point (docs/design.md sections 2 and 4)."""

from __future__ import annotations

import math

import torch

from .backends import select_backend
from .backends.base import SCALE_BLOCK, SCALE_CHANNEL, SCALE_GROUP, SCALE_TENSOR, SCALE_TOKEN, GemmProblem
from .errors import ScaleError, ShapeError
from .formats import FP8_DTYPES, GROUP_SIZE, OUT_DTYPES
from .quantize import validate_scale


def _check_fp8(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FP8_DTYPES:
        raise TypeError(f"{name}: expected dtype float8_e4m3fn or float8_e5m2, got {t.dtype}")
    if t.dim() != 2:
        raise ShapeError(f"{name}: expected a 2-D tensor, got shape {list(t.shape)}")


def _scale_kind(scale, name: str, m: int, k: int, other: str) -> tuple[str, tuple[int, ...]]:
    """Classify a scale by shape (docs/design.md section 2): ``tensor`` ``[1]``; per row, ``token``
    (``scale_a``, other='group') or ``channel`` (``scale_b``, other='block'); or ``other`` (1x128 groups
    ``[m, ceil(k/128)]`` / 128x128 blocks ``[ceil(m/128), ceil(k/128)]``)."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(scale).__name__}")
    shp = tuple(scale.shape)
    if scale.numel() == 1 and len(shp) <= 2:
        return SCALE_TENSOR, shp
    if shp == (m, 1):
        return (SCALE_TOKEN if other == SCALE_GROUP else SCALE_CHANNEL), shp
    kb = math.ceil(k / GROUP_SIZE)
    if other == SCALE_GROUP and shp == (m, kb):
        return SCALE_GROUP, shp
    if other == SCALE_BLOCK and shp == (math.ceil(m / GROUP_SIZE), kb):
        return SCALE_BLOCK, shp
    extra = f" or [{m}, {kb}]" if other == SCALE_GROUP else f" or [{math.ceil(m / GROUP_SIZE)}, {kb}]"
    raise ScaleError(f"{name}: expected shape [1] or [{m}, 1]{extra}, got {list(shp)}")


def make_problem(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, check_values: bool = True) -> GemmProblem:
    """Validate GEMM inputs and build a :class:`GemmProblem` (see :func:`fp8_gemm` for the contract).

    ``check_values=False`` skips the NaN/inf/non-positive scale scan (a device sync); modules
    whose scales were validated once at construction use it on the hot path.
    """
    _check_fp8(a, "a")
    _check_fp8(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ShapeError(f"b: expected K={a.shape[1]} columns to match a [M, K]={list(a.shape)}, got b shape {list(b.shape)}")
    if b.device != a.device:
        raise ValueError(f"b: expected device {a.device} (that of a), got {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {OUT_DTYPES}, got {out_dtype}")
    m, k = a.shape
    n = b.shape[0]
    ka, _ = _scale_kind(scale_a, "scale_a", m, k, SCALE_GROUP)
    kb, _ = _scale_kind(scale_b, "scale_b", n, k, SCALE_BLOCK)
    for s, nm in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        if s.device != a.device:
            raise ValueError(f"{nm}: expected device {a.device} (that of a), got {s.device}")
        if check_values:
            validate_scale(s, tuple(s.shape), nm)
        elif not s.dtype.is_floating_point or s.dtype in FP8_DTYPES:
            raise TypeError(f"{nm}: expected dtype torch.float32, got {s.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
        if not bias.dtype.is_floating_point or bias.dtype in FP8_DTYPES:
            raise TypeError(f"bias: expected a float32/float16/bfloat16 tensor, got {bias.dtype}")
        if tuple(bias.shape) != (n,):
            raise ShapeError(f"bias: expected shape [{n}], got {list(bias.shape)}")
        if bias.device != a.device:
            raise ValueError(f"bias: expected device {a.device} (that of a), got {bias.device}")
        bias = bias.contiguous()
    # 1x128 group scales keep their layout (the sm90 kernel reads them M-major, as the fused quantization
    # writes them; the backends convert any other layout themselves)
    sa = (scale_a.float().reshape(1) if ka == SCALE_TENSOR else scale_a.float() if ka == SCALE_GROUP
          else scale_a.float().contiguous())
    sb = scale_b.float().reshape(1) if kb == SCALE_TENSOR else scale_b.float().contiguous()
    return GemmProblem(a.contiguous(), b.contiguous(), sa, sb, bias, out_dtype, ka, kb)


def run_problem(p: GemmProblem) -> torch.Tensor:
    """Run a validated problem on the selected backend; degenerate sizes are answered directly."""
    if p.m == 0 or p.n == 0 or p.k == 0:
        out = torch.zeros((p.m, p.n), dtype=torch.float32, device=p.device)
        if p.bias is not None and p.m:
            out += p.bias.float()
        return out.to(p.out_dtype)
    return select_backend(p).run(p)


def fp8_gemm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """FP8 GEMM: ``out[m, n] = sum_k a[m, k] * b[n, k] * scale_a[m | 0] * scale_b[n | 0] + bias[n]``.

    Args:
        a: ``[M, K]`` float8_e4m3fn or float8_e5m2 (activations), K-contiguous.
        b: ``[N, K]`` float8_e4m3fn or float8_e5m2 (weights, the nn.Linear layout), K-contiguous.
        scale_a: fp32 ``[1]`` (``tensor``), ``[M, 1]`` (``token``) or ``[M, ceil(K/128)]`` (1x128 ``group``).
        scale_b: fp32 ``[1]`` (``tensor``), ``[N, 1]`` (``channel``) or ``[ceil(N/128), ceil(K/128)]``
            (128x128 ``block``). Kinds as in ``quantize_fp8``'s granularities (docs/design.md section 2).
        bias: optional ``[N]`` float tensor, added in fp32.
        out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32.

    Returns:
        ``[M, N]`` tensor of ``out_dtype`` on ``a``'s device, accumulated in FP32.

    Non-contiguous inputs are copied to contiguous ones. Raises ``TypeError`` / ``ShapeError`` /
    ``ScaleError`` / ``BackendUnavailableError`` naming the offending argument.
    """
    return run_problem(make_problem(a, b, scale_a, scale_b, bias, out_dtype))
