"""Quantize / dequantize tensors to FP8 at every granularity of docs/design.md section 2.

Granularities (``x`` is ``[..., K]``; weights are ``[out, in]``):

=========== ===================================== ==========================================
name        scale shape                            used for
=========== ===================================== ==========================================
``tensor``  ``[1]``                                weights and static activations
``channel`` ``[out, 1]`` (one per row of 2-D x)    weights
``token``   ``[..., 1]`` (one per row of x)        dynamic activations
``group``   ``[..., ceil(K/128)]`` (1x128 groups)  dynamic activations of ``fp8-block``
``block``   ``[ceil(out/128), ceil(in/128)]``      weights of ``fp8-block``
=========== ===================================== ==========================================

Amax is taken over finite values only, so ``inf`` saturates to the format's max and ``NaN``
stays ``NaN`` without poisoning the scale of its neighbours.
"""

from __future__ import annotations

import math

import torch

from . import settings
from .errors import ScaleError, ShapeError
from .formats import (
    GROUP_SIZE,
    MANTISSA_BITS,
    MIN_SCALE,
    SCALE_DTYPE,
    fmt_max,
    min_normal_exponent,
    resolve_format,
    scale_from_amax,
)

#: The one vocabulary of scale granularities (docs/design.md section 2), shared with QuantScheme,
#: fp8_gemm's scale kinds and the backends: ``channel`` and ``token`` are both one scale per row
#: (of a weight ``[out, in]`` and of an activation ``[..., K]``).
GRANULARITIES = ("tensor", "channel", "token", "group", "block")
ROUNDINGS = ("nearest", "stochastic")


def _finite_abs(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    size = x.shape[dim]
    pad = (-size) % multiple
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, torch.zeros(shape, dtype=x.dtype, device=x.device)], dim=dim)


def scale_shape(shape: tuple[int, ...] | torch.Size, granularity: str) -> tuple[int, ...]:
    """The scale shape that ``granularity`` gives a tensor of ``shape`` (see module table)."""
    shape = tuple(shape)
    if granularity == "tensor":
        return (1,)
    if granularity == "channel":
        if len(shape) != 2:
            raise ShapeError(f"x: granularity 'channel' expects a 2-D weight [out, in], got shape {list(shape)}")
        return (shape[0], 1)
    if granularity == "token":
        return shape[:-1] + (1,)
    if granularity == "group":
        return shape[:-1] + (math.ceil(shape[-1] / GROUP_SIZE),)
    if granularity == "block":
        if len(shape) != 2:
            raise ShapeError(f"x: granularity 'block' expects a 2-D weight [out, in], got shape {list(shape)}")
        return (math.ceil(shape[0] / GROUP_SIZE), math.ceil(shape[1] / GROUP_SIZE))
    raise ValueError(f"granularity: expected one of {GRANULARITIES}, got {granularity!r}")


def compute_amax(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """Absolute maximum of the finite values of ``x`` per granularity cell, fp32, shaped as the scale."""
    if x.device.type == "cpu" and x.numel():
        # Fast path (no isfinite/where pass over x): the amax of |x| is the amax of its finite values
        # whenever every cell's result is finite. A host tensor costs no device sync to check.
        fast = _cell_amax(x.detach().abs().to(SCALE_DTYPE), x.shape, granularity)
        if bool(torch.isfinite(fast).all()):
            return fast
    return _cell_amax(_finite_abs(x.detach()).to(SCALE_DTYPE), x.shape, granularity)


def _cell_amax(a: torch.Tensor, shape: torch.Size, granularity: str) -> torch.Tensor:
    """:func:`compute_amax` of the non-negative ``a`` (``|x|``, fp32) of a tensor of ``shape``."""
    if granularity == "tensor":
        # An empty tensor has amax 0 (and so gets MIN_SCALE), not a reduction error.
        return a.amax().reshape(1) if a.numel() else torch.zeros(1, dtype=SCALE_DTYPE, device=a.device)
    if granularity in ("channel", "token"):
        scale_shape(shape, granularity)  # validates rank
        return a.amax(dim=-1, keepdim=True)
    if granularity == "group":
        # Full groups through a view, the partial last group apart (no padded copy). Explicit group
        # count (not -1): an empty batch [0, K] has no inferable dimension.
        k, full = a.shape[-1], a.shape[-1] // GROUP_SIZE
        parts = [a[..., : full * GROUP_SIZE].unflatten(-1, (full, GROUP_SIZE)).amax(dim=-1)] if full else []
        if k % GROUP_SIZE:
            parts.append(a[..., full * GROUP_SIZE:].amax(dim=-1, keepdim=True))
        if not parts:  # K == 0: no groups
            return a.new_zeros(*a.shape[:-1], 0)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    if granularity == "block":
        scale_shape(shape, "block")
        g = _pad_to(_pad_to(a, 0, GROUP_SIZE), 1, GROUP_SIZE)
        r, c = g.shape[0] // GROUP_SIZE, g.shape[1] // GROUP_SIZE
        return g.reshape(r, GROUP_SIZE, c, GROUP_SIZE).amax(dim=(1, 3))
    raise ValueError(f"granularity: expected one of {GRANULARITIES}, got {granularity!r}")


def expand_scale(scale: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """Broadcast a scale of any supported granularity to ``shape`` (the tensor it scales).

    The granularity is read off the scale's shape: ``[1]`` per-tensor, ``[..., 1]`` per-row,
    ``[..., G]`` 1x128 groups along the last dim, 2-D ``[R, C]`` with ``R < rows`` 128x128 blocks.
    """
    shape = tuple(shape)
    s = scale.to(SCALE_DTYPE)
    if s.numel() == 1:
        return s.reshape([1] * len(shape)).expand(shape)
    if s.dim() == len(shape) and tuple(s.shape[:-1]) == shape[:-1]:
        if s.shape[-1] == 1:
            return s.expand(shape)
        return s.repeat_interleave(GROUP_SIZE, dim=-1)[..., : shape[-1]]
    if s.dim() == 2 and len(shape) == 2:
        return s.repeat_interleave(GROUP_SIZE, 0).repeat_interleave(GROUP_SIZE, 1)[: shape[0], : shape[1]]
    lead, k = list(shape[:-1]), shape[-1] if shape else 1
    accepted = [[1], lead + [1], lead + [math.ceil(k / GROUP_SIZE)]]
    if len(shape) == 2:
        accepted.append([math.ceil(shape[0] / GROUP_SIZE), math.ceil(k / GROUP_SIZE)])
    raise ScaleError(
        f"scale: expected shape {' or '.join(dict.fromkeys(map(str, accepted)))} for a tensor of shape {list(shape)}, got {list(s.shape)}"
    )


#: e4m3fn bits ``s eeee mmm`` placed as fp16 bits ``s 0eeee mmm0000000`` read 2**-8 times the value
#: (normals and subnormals alike: fp16's exponent bias is 8 more than e4m3's).
_E4M3_VIA_FP16_SHIFT, _E4M3_VIA_FP16_FACTOR = 7, 256.0
_E4M3_NAN_BITS = 0x7F


def fp8_to_float32(q: torch.Tensor) -> torch.Tensor:
    """``q.to(torch.float32)`` for an FP8 tensor (any shape), bitwise; a new tensor.

    On CPU, torch converts ``float8_e4m3fn`` element by element (~10 ms per million values on a
    2-core host); this moves the bits into fp16 with integer ops instead (exact: every e4m3 value is
    an fp16 value) and converts that, ~4x faster. NaN (``0x7F``/``0xFF``) is restored explicitly.
    """
    if q.dtype != torch.float8_e4m3fn or q.device.type != "cpu":
        return q.to(torch.float32)
    b = q.view(torch.uint8).to(torch.int16)
    mag = b & 0x7F
    bits = ((b & 0x80) << 8) | (mag << _E4M3_VIA_FP16_SHIFT)
    out = bits.view(torch.float16).to(torch.float32).mul_(_E4M3_VIA_FP16_FACTOR)
    nan = mag == _E4M3_NAN_BITS
    if bool(nan.any()):
        out[nan] = float("nan")
    return out


def _is_group_scale(s: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """True when ``s`` is a 1x128-group scale ``[..., ceil(K/128)]`` of a tensor of ``shape`` (read as
    :func:`expand_scale` reads it)."""
    return s.numel() > 1 and s.dim() == len(shape) and tuple(s.shape[:-1]) == tuple(shape[:-1]) and s.shape[-1] > 1


def _group_apply_(y: torch.Tensor, s: torch.Tensor, op) -> None:
    """``op(y, scale)`` in place for a group scale ``s`` ``[..., G]`` of ``y`` ``[..., K]``, through views."""
    k = y.shape[-1]
    full = k // GROUP_SIZE
    if full:
        op(y[..., : full * GROUP_SIZE].unflatten(-1, (full, GROUP_SIZE)), s[..., :full, None])
    if k % GROUP_SIZE:
        op(y[..., full * GROUP_SIZE:], s[..., full:])


def scale_(y: torch.Tensor, scale: torch.Tensor, divide: bool = False) -> torch.Tensor:
    """``y *= expand_scale(scale, y.shape)`` (or ``/=`` with ``divide``) in place, and return ``y``.

    ``y``: fp32 ``[..., K]`` that the caller owns; ``scale``: any shape :func:`expand_scale` reads.
    Bitwise what the out-of-place ``y * expand_scale(...)`` gives; 1x128 groups and 128x128 blocks
    are applied through views instead of a materialized ``[..., K]`` scale.
    """
    s = scale.to(SCALE_DTYPE)
    op = torch.Tensor.div_ if divide else torch.Tensor.mul_
    shape = tuple(y.shape)
    if _is_group_scale(s, shape):
        _group_apply_(y, s, op)
    elif s.numel() > 1 and s.dim() == 2 and len(shape) == 2 and s.shape[1] > 1 and s.shape[0] < shape[0]:
        expand_scale(s, shape)  # validates the block shape
        for r in range(s.shape[0]):  # 128x128 blocks: each block row is a group scale of its rows
            rows = y[r * GROUP_SIZE: (r + 1) * GROUP_SIZE]
            _group_apply_(rows, s[r: r + 1].expand(rows.shape[0], -1), op)
    else:
        op(y, expand_scale(s, shape))
    return y


def validate_scale(scale: torch.Tensor, expected_shape: tuple[int, ...], name: str = "scale") -> torch.Tensor:
    """Check that ``scale`` is a floating tensor of ``expected_shape`` with finite positive values."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(scale).__name__}")
    if not scale.dtype.is_floating_point or scale.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{name}: expected dtype torch.float32, got {scale.dtype}")
    if tuple(scale.shape) != tuple(expected_shape) and not (
        scale.numel() == 1 and math.prod(expected_shape) == 1
    ):
        raise ScaleError(f"{name}: expected shape {list(expected_shape)}, got {list(scale.shape)}")
    if scale.numel():
        bad = ~torch.isfinite(scale) | (scale <= 0)
        if bool(bad.any()):
            v = scale[bad].flatten()[0].item()
            raise ScaleError(f"{name}: expected finite positive values, got {v} ({int(bad.sum())} bad entries)")
    out = scale.to(SCALE_DTYPE).reshape(expected_shape)
    if scale.dtype != SCALE_DTYPE and out.numel():
        # A wider float (fp64) can hold values that fp32 cannot: they would become 0 or inf silently.
        lost = (out == 0) | ~torch.isfinite(out)
        if bool(lost.any()):
            v = scale.reshape(expected_shape)[lost].flatten()[0].item()
            raise ScaleError(f"{name}: {scale.dtype} value {v} overflows or underflows float32 ({int(lost.sum())} entries)")
    return out


def _check_same_device(t, ref: torch.Tensor, name: str, ref_name: str) -> None:
    """``ValueError`` naming ``name`` when tensor ``t`` is not on ``ref``'s device."""
    if isinstance(t, torch.Tensor) and t.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} (that of {ref_name}), got {t.device}")


def _stochastic_round(y: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    """Round fp32 ``y`` (already inside the format's range) to a neighbour on the FP8 grid,
    up with probability equal to the distance from the lower neighbour in ulps (unbiased)."""
    mbits = MANTISSA_BITS[dtype]
    _, e = torch.frexp(y)
    e = torch.clamp(e - 1, min=min_normal_exponent(dtype))
    ulp = torch.ldexp(torch.ones_like(y), e - mbits)
    lo = torch.floor(y / ulp) * ulp
    p = (y - lo) / ulp
    u = torch.rand(y.shape, generator=generator, device=y.device, dtype=y.dtype)
    return torch.where(u < p, lo + ulp, lo)


def quantize_fp8(
    x: torch.Tensor,
    fmt: str | torch.dtype = "e4m3",
    granularity: str = "tensor",
    scale: torch.Tensor | None = None,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to FP8.

    Args:
        x: floating tensor (fp32/fp16/bf16/fp64), any shape (2-D for ``channel`` and ``block``).
        fmt: ``"e4m3"`` (max 448) or ``"e5m2"`` (max 57344), or the torch dtype.
        granularity: one of :data:`GRANULARITIES` (see the module table for scale shapes).
        scale: fp32 scale of the granularity's shape; ``None`` computes ``amax / fmt_max``.
        rounding: ``"nearest"`` (round-to-nearest-even, as ``tensor.to(fp8)``) or ``"stochastic"``.
        generator: seeds stochastic rounding.

    Returns:
        ``(q, scale)``: ``q`` of ``x``'s shape in the FP8 dtype, ``scale`` fp32 with ``x ~= q * scale``.
        Values saturate at +-fmt_max; NaN stays NaN.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"x: expected a floating dtype (float32/float16/bfloat16/float64), got {x.dtype}")
    dtype = resolve_format(fmt)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    shp = scale_shape(x.shape, granularity)
    if scale is None:
        scale = scale_from_amax(compute_amax(x, granularity), dtype)
    else:
        _check_same_device(scale, x, "scale", "x")
        scale = validate_scale(scale, shp)
    return quantize_unchecked(x, dtype, scale, rounding, generator), scale


def _fused(x: torch.Tensor):
    """The fused CUDA quantization module when it can take ``x`` (``fp8_linear/kernels/quant_triton.py``; off with
    ``FP8_LINEAR_FUSED_QUANT=0``, :mod:`fp8_linear.settings`), else None."""
    if x.device.type != "cuda" or not settings.get().fused_quant:
        return None
    from fp8_linear.kernels import quant_triton

    return quant_triton if quant_triton.available(x)[0] else None


def quantize_unchecked(
    x: torch.Tensor,
    dtype: torch.dtype,
    scale: torch.Tensor,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``saturate(x / scale)`` cast to the FP8 ``dtype``, with no validation (hot path).

    ``scale`` must already be a valid fp32 scale for ``x`` (any shape :func:`expand_scale` reads).
    """
    m = fmt_max(dtype)
    fused = _fused(x) if rounding == "nearest" and scale.numel() == 1 else None
    if fused is not None:
        return fused.quantize_rows(x, dtype, fused.MODE_STATIC, m, MIN_SCALE, scale.reshape(1))[0]
    if scale.numel() == 1 or scale.shape[-1] == 1:  # per tensor / row: a broadcast view of the scale
        y = torch.div(x.to(SCALE_DTYPE), expand_scale(scale, x.shape))
    else:
        y = scale_(x.to(SCALE_DTYPE, copy=True), scale, divide=True)
    y.clamp_(-m, m)
    if rounding == "stochastic":
        y = _stochastic_round(y, dtype, generator)
    return y.to(dtype)


def dynamic_quantize(x: torch.Tensor, dtype: torch.dtype, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` with scales computed from its own amax (dynamic activations), no validation.

    2-D CUDA ``x`` with ``token`` / ``group`` granularity runs one fused Triton launch
    (``fp8_linear.kernels.quant_triton``: same formula, bitwise equal to the CPU path; turned off
    with ``FP8_LINEAR_FUSED_QUANT=0``); elsewhere torch ops.
    """
    fused = _fused(x) if granularity in ("token", "group") else None
    if fused is not None:
        mode = fused.MODE_TOKEN if granularity == "token" else fused.MODE_GROUP
        return fused.quantize_rows(x, dtype, mode, fmt_max(dtype), MIN_SCALE)
    scale = scale_from_amax(compute_amax(x, granularity), dtype)
    return quantize_unchecked(x, dtype, scale), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``out_dtype``; the granularity is read off ``scale``'s shape (see :func:`expand_scale`).

    ``q`` is an FP8 tensor ``[..., K]``; ``scale`` is fp32 of shape ``[1]``, ``[..., 1]``,
    ``[..., ceil(K/128)]`` or, for 2-D ``q``, ``[ceil(rows/128), ceil(K/128)]``.
    """
    if not isinstance(q, torch.Tensor) or q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"q: expected an FP8 tensor (float8_e4m3fn/float8_e5m2), got {getattr(q, 'dtype', type(q).__name__)}")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale: expected a torch.Tensor, got {type(scale).__name__}")
    _check_same_device(scale, q, "scale", "q")
    return scale_(fp8_to_float32(q), scale).to(out_dtype)
