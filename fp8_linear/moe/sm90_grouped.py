"""``sm90_grouped``: our grouped Hopper FP8 GEMM (``kernels/include/sm90_grouped.cuh``) as a grouped backend.

One launch for every expert, offsets read on the device (no host sync, so CUDA graphs capture it):
tokens sorted by expert ``[M, K]``, weights ``[E, N, K]`` through one 3-D tensor map, per-expert
per-tensor (``[E]``) or per-channel (``[E, N]``) weight scales, per-tensor or per-token activation
scales, bias ``[E, N]``, bf16 / fp16 / fp32 out. Block scales and more than
``MAX_EXPERTS`` experts go to the next backend. Tiles put 128 weight rows on wgmma's M side and
``block_n`` tokens of one expert on its N side (16 / 32 / 64 / 128, :func:`select_block_n`).

Runs inside the ``fp8_linear::grouped_fp8_gemm`` custom op (fake implementation there), so
``torch.compile`` traces it with no graph break.
"""

from __future__ import annotations

import torch

from ..backends.sm90 import BIAS_DTYPES, Sm90Backend, extension
from ..grouped_gemm import A_ROW, A_TENSOR, B_CHANNEL, B_TENSOR, GroupedBackend, GroupedProblem

#: Experts one launch takes (the kernel's shared-memory work list: kGroupedMaxExperts in
#: kernels/include/sm90_grouped_api.h).
MAX_EXPERTS = 512
#: Token-tile widths the kernel has instances for (kGroupedTiles).
BLOCK_NS = (16, 32, 64, 128)
#: TMA: 16-byte row strides, base pointers and expert strides.
TMA_ALIGN = 16
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)


def select_block_n(m: int, e: int) -> int:
    """Token tile for ``m`` routed rows over ``e`` experts, without reading the offsets: the smallest
    width holding twice the rows an expert gets when the rows spread over ``min(m, e)`` experts
    (decode: 1-8 rows per expert -> 16; a 2048-token prefill over 128 experts, top-8 -> 128)."""
    per_expert = -(-m // max(1, min(m, e)))
    for bn in BLOCK_NS:
        if 2 * per_expert <= bn:
            return bn
    return BLOCK_NS[-1]


class Sm90GroupedBackend(GroupedBackend):
    """The grouped sm90 kernel (compute capability 9.0, built with the dense kernel's extension)."""

    name = "sm90_grouped"

    def __init__(self, block_n: int | None = None):
        if block_n is not None and block_n not in BLOCK_NS:
            raise ValueError(f"block_n: expected one of {BLOCK_NS} or None (by shape), got {block_n}")
        self.block_n = block_n

    def supports(self, device):
        return Sm90Backend().supports(device)

    def can_run(self, p: GroupedProblem):
        if p.a.dtype not in _FP8 or p.b.dtype not in _FP8:
            return False, f"needs fp8 operands, got {p.a.dtype} x {p.b.dtype}"
        if p.out_dtype not in _OUT:
            return False, f"writes bf16 / fp16 / fp32, asked for {p.out_dtype}"
        if p.scale_a_kind not in (A_TENSOR, A_ROW) or p.scale_b_kind not in (B_TENSOR, B_CHANNEL):
            return False, f"scales {p.scale_a_kind}/{p.scale_b_kind}: per-tensor / per-token x per-expert / per-channel only"
        if p.bias is not None and p.bias.dtype not in BIAS_DTYPES:
            return False, f"bias dtype {p.bias.dtype}: the epilogue adds {BIAS_DTYPES}"
        if p.num_experts > MAX_EXPERTS:
            return False, f"{p.num_experts} experts, the kernel's work list holds {MAX_EXPERTS}"
        if p.k % TMA_ALIGN:
            return False, f"K={p.k} is not a multiple of {TMA_ALIGN} (TMA row strides)"
        if (p.b.stride(0) if p.num_experts > 1 else 0) % TMA_ALIGN or p.a.data_ptr() % TMA_ALIGN \
                or p.b.data_ptr() % TMA_ALIGN:
            return False, f"a and b must start {TMA_ALIGN}-byte aligned with {TMA_ALIGN}-byte expert strides"
        if max(p.m, p.n, p.k) >= 2**31:
            return False, "dims must be below 2^31"
        return True, "fp8, per-tensor / per-token x per-expert / per-channel scales, K % 16 == 0"

    def run(self, p: GroupedProblem) -> torch.Tensor:
        out = torch.empty((p.m, p.n), dtype=p.out_dtype, device=p.device)
        bn = self.block_n or select_block_n(p.m, p.num_experts)
        offsets = p.offsets if p.offsets.is_contiguous() else p.offsets.contiguous()
        extension().grouped_gemm_out(p.a, p.b, p.scale_a, p.scale_b.contiguous(), offsets, p.bias, out, bn)
        return out


SM90_GROUPED = Sm90GroupedBackend()

__all__ = ["BLOCK_NS", "MAX_EXPERTS", "SM90_GROUPED", "Sm90GroupedBackend", "select_block_n"]
