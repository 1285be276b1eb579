"""Activation quantization as plain torch ops, for ``torch.compile`` graphs (docs/design.md section 4).

Eagerly, ``FP8Linear`` quantizes its input with our kernels (one launch, or fused with the GEMM's host
call). Inside a compiled graph a separate quantization kernel would cost one launch per layer (224 per
decode step of a 32-layer Llama); written as torch ops, inductor fuses it into the kernel that produces
the activation (the RMSNorm before q/k/v and gate/up, the SiLU-and-multiply before down), so that kernel
writes FP8 directly. The ops here compute bit for bit what the kernels compute:

- ``y = x / scale`` as one IEEE fp32 division, computed as ``RN32(RN64(x) * RN64(1 / scale))``: the
  fp64 reciprocal of each scale value, then one fp64 multiply a element rounded once to fp32 (what the
  CUDA kernel computes, ``kernels/csrc/act_quant.cu`` ``scaled``, with the proof that it is the correctly
  rounded fp32 quotient for every quotient that does not convert to zero in FP8). Inductor's Triton
  code lowers an fp32 ``/`` to an approximate division (``div.full.f32``), and torch's CUDA kernels turn
  division by a scalar into a multiplication by its fp32 reciprocal, so neither is written here. An fp64
  division a element (``exact_div``, the form before 2026-12-04) gives the same bits; the two forms timed
  level inside their producers' kernels at decode sizes (H200, 2026-12-04, ``python -m
  benchmarks.traced_quant_bench --ms 1,16``: RMSNorm + quantization 4.9 us either way, SiLU-and-multiply +
  per-token quantization of 14336 values 6.6 / 6.4 us at M = 1), so the fp64 division was not what makes
  the per-token form cost more than the static one there (the row's amax pass; docs/serving.md).
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


def scaled_quotient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` (``scale`` fp32, broadcast against ``x``) rounded to fp32 as
    ``RN32(RN64(x) * RN64(1 / scale))``: the IEEE fp32 quotient wherever it does not convert to zero in FP8
    (module docstring); the division runs once per scale value, not per element."""
    return (x.to(torch.float64) * torch.reciprocal(scale.to(torch.float64))).to(SCALE_DTYPE)


def quantize_static(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """``x`` ``[M, K]`` (bf16/fp16/fp32) -> ``fp8`` ``[M, K]`` with the per-tensor fp32 ``scale`` ``[1]``."""
    m = fmt_max(fp8)
    return scaled_quotient(x, scale).clamp(-m, m).to(fp8)


def quantize_per_token(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``x`` ``[M, K]`` quantized with per-row scales ``[M, 1]`` fp32 computed from ``x``."""
    m = fmt_max(fp8)
    a = x.to(SCALE_DTYPE).abs()
    amax = torch.where(a < float("inf"), a, 0.0).amax(dim=-1, keepdim=True)  # NaN < inf is False: 0
    scale = exact_div(amax, torch.full_like(amax, m)).clamp(min=MIN_SCALE)
    return scaled_quotient(x, scale).clamp(-m, m).to(fp8), scale


__all__ = ["exact_div", "quantize_per_token", "quantize_static", "scaled_quotient"]
