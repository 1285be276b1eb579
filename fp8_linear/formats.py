"""FP8 formats and the numerics contract (docs/design.md section 2) in one place.

``x ~= q * scale`` with ``scale = amax / fmt_max``; maxima come from ``torch.finfo``.
"""

from __future__ import annotations

import torch

#: Names of the supported FP8 formats and their torch dtypes.
FORMATS: dict[str, torch.dtype] = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}
FP8_DTYPES = tuple(FORMATS.values())

#: Output dtypes a GEMM may produce.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Mantissa bits of each format (for ulp computations in stochastic rounding).
MANTISSA_BITS: dict[torch.dtype, int] = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}

#: Smallest scale ever produced: an all-zero tensor or channel gets this, never 0, inf or NaN.
MIN_SCALE = 1e-12

#: Block edge of the 1x128 activation groups and 128x128 weight blocks.
GROUP_SIZE = 128

#: Scale dtype: fp32, as in compressed-tensors and vLLM.
SCALE_DTYPE = torch.float32


def resolve_format(fmt: str | torch.dtype, name: str = "fmt") -> torch.dtype:
    """Return the torch FP8 dtype for ``fmt`` ("e4m3", "e5m2" or one of the two dtypes).

    Raises ``ValueError`` naming ``name`` for anything else.
    """
    if isinstance(fmt, torch.dtype):
        if fmt in FP8_DTYPES:
            return fmt
        raise TypeError(f"{name}: expected one of {list(FORMATS)} or an FP8 dtype, got dtype {fmt}")
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    raise ValueError(f"{name}: expected one of {list(FORMATS)}, got {fmt!r}")


def format_name(dtype: torch.dtype) -> str:
    """Inverse of :func:`resolve_format`: ``torch.float8_e4m3fn -> "e4m3"``."""
    for k, v in FORMATS.items():
        if v == dtype:
            return k
    raise TypeError(f"dtype: expected an FP8 dtype {FP8_DTYPES}, got {dtype}")


def fmt_max(dtype: "torch.dtype | str") -> float:
    """Largest finite value of the FP8 ``dtype`` (448 for e4m3, 57344 for e5m2; a name works too).

    Raises ``TypeError`` / ``ValueError`` for anything that is not an FP8 format (never fp32's max).
    """
    return float(torch.finfo(resolve_format(dtype, "dtype")).max)


def min_normal_exponent(dtype: torch.dtype) -> int:
    """Exponent of the smallest normal number of ``dtype`` (-6 for e4m3, -14 for e5m2)."""
    return int(torch.log2(torch.tensor(torch.finfo(dtype).smallest_normal)).item())


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``scale = amax / fmt_max`` in fp32, floored at :data:`MIN_SCALE` (all-zero -> small positive)."""
    a = amax.to(SCALE_DTYPE)
    # Divide by a tensor, not a Python scalar: torch's CUDA kernels turn division by a scalar into a
    # multiplication by its reciprocal (off by one ulp from IEEE division); the CPU, the fused
    # kernel and the contract all use IEEE division, so scales agree bitwise across devices.
    s = a / torch.full_like(a, fmt_max(dtype))
    return torch.clamp(s, min=MIN_SCALE)
