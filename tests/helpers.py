"""Shared test helpers (import as ``from helpers import calc_diff``; ``tests/`` is on sys.path).

Independent references for the numerics contract (docs/design.md section 7): fp64 math on the
dequantized FP8 tensors, compared with ``calc_diff = 1 - 2*sum(x*y) / sum(x*x + y*y)``.
Nothing here calls the package's own expand/dequantize code, so the reference stays independent.
"""

from __future__ import annotations

import math

import torch

#: Block edge of 1x128 groups and 128x128 blocks (docs/design.md section 2), restated independently.
BLOCK = 128
#: Margin on the output-rounding error and the floor of the emulated backend (docs/design.md section 7).
ROUNDING_MARGIN = 1.05
EMULATED_FLOOR = 1e-12
#: Floor for tensor-core kernels (cuBLASLt, sm90) against the reference.
KERNEL_FLOOR = 1e-8


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2*sum(x*y) / sum(x*x + y*y)`` in fp64 (0 for identical tensors; any shape, any float dtype)."""
    x, y = x.double().flatten(), y.double().flatten()
    den = (x * x + y * y).sum()
    if den == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / den)


def rounding_bar(ref: torch.Tensor, out_dtype: torch.dtype, floor: float = EMULATED_FLOOR) -> float:
    """The bar ``1.05 * calc_diff(ref rounded to out_dtype, ref) + floor`` for an fp64 ``ref``."""
    return ROUNDING_MARGIN * calc_diff(ref.to(out_dtype), ref) + floor


def expand64(scale: torch.Tensor, shape: tuple[int, int], kind: str) -> torch.Tensor:
    """Broadcast a 2-D operand's scale to ``shape`` ``[R, K]`` in fp64.

    ``kind``: ``tensor`` (``[1]``), ``row`` (``[R, 1]``), ``group`` (``[R, ceil(K/128)]``) or
    ``block`` (``[ceil(R/128), ceil(K/128)]``).
    """
    r, k = shape
    s = scale.double()
    if kind == "tensor":
        return s.reshape(1, 1).expand(r, k)
    if kind == "row":
        return s.reshape(r, 1).expand(r, k)
    if kind == "group":
        return s.reshape(r, -1)[:, torch.arange(k) // BLOCK]
    if kind == "block":
        return s[torch.arange(r) // BLOCK][:, torch.arange(k) // BLOCK]
    raise ValueError(f"kind: expected tensor/row/group/block, got {kind!r}")


def scale_kind_of(scale: torch.Tensor, rows: int) -> str:
    """Read a scale's kind off its shape for a ``[rows, K]`` operand (tensor/row/group/block)."""
    if scale.numel() == 1:
        return "tensor"
    if scale.dim() == 2 and scale.shape[0] == rows:
        return "row" if scale.shape[1] == 1 else "group"
    return "block"


def dequant64(q: torch.Tensor, scale: torch.Tensor, kind: str | None = None) -> torch.Tensor:
    """``q * scale`` in fp64 for a 2-D FP8 ``q`` (exact: fp8 x fp32 fits in fp64)."""
    kind = kind or scale_kind_of(scale, q.shape[0])
    return q.double() * expand64(scale.cpu(), tuple(q.shape), kind).to(q.device)


def gemm_ref64(a, b, scale_a, scale_b, bias=None) -> torch.Tensor:
    """fp64 ``dequant(a) @ dequant(b).T + bias``: a ``[M, K]``, b ``[N, K]`` FP8; returns ``[M, N]`` fp64."""
    out = dequant64(a, scale_a) @ dequant64(b, scale_b).t()
    if bias is not None:
        out = out + bias.double()
    return out


def random_fp8(shape, dtype: torch.dtype, device="cpu", generator=None) -> torch.Tensor:
    """Random FP8 tensor: normal values spread over the format's range, never all zero."""
    x = torch.randn(shape, generator=generator) * 4
    return x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype).to(device)


def random_scale(shape, device="cpu", generator=None) -> torch.Tensor:
    """Random positive fp32 scales of ``shape``, log-normal around 1e-2."""
    return (torch.randn(shape, generator=generator) * 0.5 - 4.6).exp().float().to(device)


def scale_shape_for(kind: str, rows: int, k: int) -> tuple[int, ...]:
    """Scale shape of ``kind`` for a ``[rows, K]`` operand."""
    return {
        "tensor": (1,),
        "row": (rows, 1),
        "group": (rows, math.ceil(k / BLOCK)),
        "block": (math.ceil(rows / BLOCK), math.ceil(k / BLOCK)),
    }[kind]


def cpu_scaled_mm_available() -> bool:
    """Whether this torch runs ``torch._scaled_mm`` on CPU tensors. Its oneDNN FP8 matmul needs AVX512-FP16
    (Sapphire Rapids and later): on AVX2 and on AVX-512 CPUs without FP16 it raises "could not create a
    primitive descriptor for the matmul primitive" (``ONEDNN_MAX_CPU_ISA=AVX2`` shows it on any CPU)."""
    a, b = torch.ones(17, 96).to(torch.float8_e4m3fn), torch.ones(64, 96).to(torch.float8_e4m3fn)
    try:  # which dtypes oneDNN takes depends on the CPU: ask for every output dtype, with and without a bias
        for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
            for bias in (None, torch.zeros(64, dtype=out_dtype)):
                for sa, sb in ((torch.ones(()), torch.ones(())), (torch.ones(17, 1), torch.ones(1, 64))):
                    torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True
