"""Checks of the values of stored FP8 tensors, shared by loading and saving.

- FP8 weight bytes must be finite numbers: e4m3fn encodes NaN as ``S.1111.111`` (it has no inf),
  e5m2 encodes inf and NaN with an all-ones exponent (``S.11111.xx``).
- Scales, whatever float dtype they are stored in (``F8_E8M0`` included), must be finite, positive,
  normal in fp32 and small enough that ``fmt_max * scale`` is finite: checked before the conversion
  to fp32, which would turn a float64 1e-50 into 0 and 1e300 into inf.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError
from ..formats import SCALE_DTYPE, fmt_max
from .shards import TensorInfo

#: Sign bit cleared, the byte values from which an FP8 byte is NaN / inf.
FP8_EXP_MASK = 0x7F
FP8_NONFINITE_FROM = {"e4m3": 0x7F, "e5m2": 0x7C}


def nonfinite_fp8(t: torch.Tensor, fmt: str) -> tuple[int, int]:
    """``(count, first flat index)`` of the NaN / inf entries of FP8 tensor ``t`` (``(0, -1)`` when none)."""
    bad = ((t.view(torch.uint8) & FP8_EXP_MASK) >= FP8_NONFINITE_FROM[fmt]).flatten()
    n = int(bad.sum())
    return n, (int(bad.nonzero()[0]) if n else -1)


def check_scale(owner: str, pname: str, t: torch.Tensor, info: TensorInfo, fmt: str) -> None:
    """Refuse a stored scale (in its stored dtype) that is not finite and positive, or that fp32 cannot
    hold as a normal number with ``fmt_max * scale`` finite (a float64 1e-50 would become 0)."""
    lo, hi = torch.finfo(SCALE_DTYPE).tiny, torch.finfo(SCALE_DTYPE).max / fmt_max(fmt)
    v = t.to(torch.float64).flatten()
    bad = ~torch.isfinite(v) | (v < lo) | (v > hi)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise CheckpointError(
            f"{owner}: {pname}: expected finite positive values representable in fp32 ([{lo:.3g}, {hi:.3g}] for "
            f"{fmt}), got {v[i].item()!r} ({info.dtype} at flat index {i}, {int(bad.sum())} bad entries) in {info.file}")


def check_fp8_weight(name: str, t: torch.Tensor, info: TensorInfo, fmt: str) -> None:
    """Refuse FP8 weight bytes that encode NaN or inf (naming the tensor and the first bad index)."""
    n, i = nonfinite_fp8(t, fmt)
    if n:
        raise CheckpointError(f"{name}: expected finite {fmt} values, got {n} NaN/inf entries "
                              f"(first at flat index {i}, byte 0x{int(t.view(torch.uint8).flatten()[i]):02x}) in {info.file}")
