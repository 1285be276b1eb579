"""``sm90_grouped``: our grouped Hopper FP8 GEMM (``fp8_linear/kernels/include/sm90_grouped.cuh``) as a grouped backend.

One launch for every expert, offsets read on the device (no host sync, so CUDA graphs capture it):
tokens sorted by expert ``[M, K]``, weights ``[E, N, K]`` through one 3-D tensor map, per-expert
per-tensor (``[E]``) or per-channel (``[E, N]``) weight scales with per-tensor or per-token activation
scales, or 128x128 weight blocks (``[E, ceil(N/128), ceil(K/128)]``) with 1x128 activation groups
(``[M, ceil(K/128)]``, read M-major as the dense kernel reads them; a per-tensor / per-token scale is
spread over the groups), bias ``[E, N]``, bf16 / fp16 / fp32 out. More than ``MAX_EXPERTS`` experts
go to the next backend. Tiles put 128 weight rows on wgmma's M side and ``block_n`` tokens of one
expert on its N side (16 / 32 / 64 / 128, :func:`select_block_n`).

:func:`quantize_groups` quantizes the sorted tokens of block-scaled experts to 1x128 groups with the
extension's one-pass activation quantization (``act_quant`` mode 2), which writes the M-major scales
the kernel reads without a copy.

Runs inside the ``fp8_linear::grouped_fp8_gemm`` custom op (fake implementation there), so
``torch.compile`` traces it with no graph break.
"""

from __future__ import annotations

import torch

from ..backends.base import expand_scale_a_to_groups
from ..backends.sm90 import BIAS_DTYPES, Sm90Backend, extension
from ..formats import GROUP_SIZE, MIN_SCALE, fmt_max
from ..grouped_gemm import A_GROUP, A_ROW, A_TENSOR, B_BLOCK, B_CHANNEL, B_TENSOR, GroupedBackend, GroupedProblem
from ..ops import quantize_dynamic

#: Experts one launch takes (the kernel's shared-memory work list: kGroupedMaxExperts in
#: fp8_linear/kernels/include/sm90_grouped_api.h).
MAX_EXPERTS = 512
#: Token-tile widths the kernel has instances for (kGroupedTiles).
BLOCK_NS = (16, 32, 64, 128)
#: TMA: 16-byte row strides, base pointers and expert strides.
TMA_ALIGN = 16
#: Indices the kernel's block-scale arithmetic keeps in 32 bits (M x ceil(K/128), E x ceil(N/128) x ceil(K/128)).
INT32_LIMIT = 2**31
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)
#: The extension's act_quant: FP8 format codes and its 1x128 group mode.
_FMT_CODE = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
ACT_QUANT_GROUP = 2
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_act_quant_ok: dict[str, bool] = {}


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
        if p.scale_b_kind == B_BLOCK:
            kbn = -(-p.k // GROUP_SIZE)
            if p.m * kbn >= INT32_LIMIT or p.num_experts * -(-p.n // GROUP_SIZE) * kbn >= INT32_LIMIT:
                return False, f"block scales of M={p.m}, N={p.n}, K={p.k}, {p.num_experts} experts exceed 2^31 entries"
        elif p.scale_a_kind == A_GROUP:
            return False, f"scales {p.scale_a_kind}/{p.scale_b_kind}: 1x128 activation groups pair only with 128x128 weight blocks"
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
        if p.scale_b_kind == B_BLOCK:
            return True, "fp8, 1x128 activation groups x 128x128 weight blocks per expert, K % 16 == 0"
        return True, "fp8, per-tensor / per-token x per-expert / per-channel scales, K % 16 == 0"

    def run(self, p: GroupedProblem) -> torch.Tensor:
        out = torch.empty((p.m, p.n), dtype=p.out_dtype, device=p.device)
        bn = self.block_n or select_block_n(p.m, p.num_experts)
        offsets = p.offsets if p.offsets.is_contiguous() else p.offsets.contiguous()
        sa = p.scale_a
        if p.scale_b_kind == B_BLOCK and p.scale_a_kind != A_GROUP:  # spread over the 1x128 groups (M-major)
            sa = expand_scale_a_to_groups(sa, p.m, p.k)
        extension().grouped_gemm_out(p.a, p.b, sa, p.scale_b.contiguous(), offsets, p.bias, out, bn)
        return out


def quantize_groups(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic 1x128 group quantization of the sorted tokens ``x`` ``[M, K]`` (bf16 / fp16 / fp32) to ``fp8``.

    Returns ``(q, scale)``: ``q`` FP8 ``[M, K]`` contiguous, ``scale`` fp32 ``[M, ceil(K/128)]``. On an
    sm90 device in eager mode the extension's ``act_quant`` (mode 2: group amax, scale, cast in one pass)
    writes ``scale`` M-major (strides ``(1, round_up(M, 4))``), the layout the grouped kernel reads without
    a copy; elsewhere (and under ``torch.compile``) ``fp8_linear.ops.quantize_dynamic``, the same formula
    bit for bit, row-major.
    """
    if (x.is_cuda and x.dim() == 2 and x.shape[0] > 0 and x.stride(-1) == 1 and not _dynamo_compiling()
            and _fused_groups_ok(x.device)):
        return extension().act_quant(x, _FMT_CODE[fp8], ACT_QUANT_GROUP, None, fmt_max(fp8), MIN_SCALE)
    return quantize_dynamic(x, fp8, "group")


def _fused_groups_ok(device: torch.device) -> bool:
    key = str(device)
    if key not in _act_quant_ok:
        _act_quant_ok[key] = bool(Sm90Backend().supports(device)[0])
    return _act_quant_ok[key]


SM90_GROUPED = Sm90GroupedBackend()

__all__ = ["BLOCK_NS", "MAX_EXPERTS", "SM90_GROUPED", "Sm90GroupedBackend", "quantize_groups", "select_block_n"]
