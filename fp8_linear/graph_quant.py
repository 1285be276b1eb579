"""Activation quantization as plain torch ops, for ``torch.compile`` graphs (docs/design.md section 4).

Eagerly, ``FP8Linear`` quantizes its input with our kernels (one launch, or fused with the GEMM's host
call). Inside a compiled graph a separate quantization kernel would cost one launch per layer (224 per
decode step of a 32-layer Llama); written as torch ops, inductor fuses it into the kernel that produces
the activation (the RMSNorm before q/k/v and gate/up, the SiLU-and-multiply before down), so that kernel
writes FP8 directly. The ops here compute bit for bit what the kernels compute:

- ``y = x / scale`` as one IEEE fp32 division: the quotient is taken in fp64 and rounded once to fp32.
  Inductor's Triton code lowers an fp32 ``/`` to an approximate division (``div.full.f32``), and torch's
  CUDA kernels turn division by a scalar into a multiplication by its reciprocal; an fp64 quotient of two
  fp32 values rounded to fp32 is the correctly rounded fp32 quotient (fp64 has more than 2 * 24 + 2
  significand bits, so the double rounding is innocuous: Figueroa, "When is double rounding innocuous?",
  1995).
- clamp to the format's finite range (NaN passes), then the round-to-nearest-even cast: together
  ``cvt.rn.satfinite``.
- dynamic per-token scales: the amax of the row's finite values, ``max(amax / fmt_max, MIN_SCALE)``.
"""

from __future__ import annotations

import torch

from .formats import MIN_SCALE, SCALE_DTYPE, fmt_max


def exact_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a / b`` (fp32 or lower, broadcasting) as the correctly rounded fp32 quotient, under any compiler."""
    return (a.to(torch.float64) / b.to(torch.float64)).to(SCALE_DTYPE)


def quantize_static(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """``x`` ``[M, K]`` (bf16/fp16/fp32) -> ``fp8`` ``[M, K]`` with the per-tensor fp32 ``scale`` ``[1]``."""
    m = fmt_max(fp8)
    return exact_div(x, scale).clamp(-m, m).to(fp8)


def quantize_per_token(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``x`` ``[M, K]`` quantized with per-row scales ``[M, 1]`` fp32 computed from ``x``."""
    m = fmt_max(fp8)
    a = x.to(SCALE_DTYPE).abs()
    amax = torch.where(a < float("inf"), a, 0.0).amax(dim=-1, keepdim=True)  # NaN < inf is False: 0
    scale = exact_div(amax, torch.full_like(amax, m)).clamp(min=MIN_SCALE)
    return exact_div(x, scale).clamp(-m, m).to(fp8), scale


__all__ = ["exact_div", "quantize_per_token", "quantize_static"]
