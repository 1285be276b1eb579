"""Operands and scales of the GEMM benchmarks.

Operands are FP8 ``[rows, K]`` row-major (K contiguous), as ``fp8_gemm`` takes them (A = activations
``[M, K]``, B = the weight ``[N, K]``). Scales are fp32 in the layouts of docs/design.md section 2:
per-tensor ``[1]``, per-row ``[rows, 1]``, 1x128 groups ``[M, ceil(K/128)]``, 128x128 blocks
``[ceil(N/128), ceil(K/128)]``. Scale values lie in [0.5, 1.5) so that no product over- or underflows.
"""

from __future__ import annotations

import math

import torch

from fp8_linear.formats import GROUP_SIZE, fmt_max

E4M3 = torch.float8_e4m3fn
#: Largest finite magnitude of float8_e4m3fn (448).
E4M3_MAX = fmt_max(E4M3)
#: Operand value kinds (the tensor cores' energy, and so the power-capped clock, depends on them):
#: N(0, 1) cast to e4m3 (the default), N(0, 1) scaled so that the largest magnitude is 448 (as a
#: per-tensor quantizer produces), all ones, all zeros.
DATA_KINDS = ("randn", "scaled", "ones", "zeros")
SCALE_KINDS = ("tensor", "row", "group", "block")


def make_operand(rows: int, k: int, kind: str = "randn", device: str = "cuda",
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """A ``[rows, k]`` float8_e4m3fn tensor (row-major, K contiguous) of the value ``kind``
    (:data:`DATA_KINDS`); ``ValueError`` for an unknown kind."""
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r}; expected one of {DATA_KINDS}")
    if kind == "ones":
        return torch.ones(rows, k, device=device).to(E4M3)
    if kind == "zeros":
        return torch.zeros(rows, k, device=device).to(E4M3)
    x = torch.randn(rows, k, device=device, generator=generator)
    if kind == "scaled":
        x = x * (E4M3_MAX / x.abs().max())
    return x.to(E4M3)


def make_scale(kind: str, rows: int, k: int, device: str = "cuda",
               generator: torch.Generator | None = None) -> torch.Tensor:
    """An fp32 scale for an operand of ``[rows, k]``: ``tensor`` ``[1]``, ``row`` ``[rows, 1]``,
    ``group`` ``[rows, ceil(k/128)]`` (1x128, for A), ``block`` ``[ceil(rows/128), ceil(k/128)]``
    (128x128, for B); row-major contiguous, except ``group``: M-major (strides ``(1, round_up(rows, 4))``,
    the layout the fused activation quantization writes and our kernel reads without a copy);
    ``ValueError`` for an unknown kind."""
    kb = math.ceil(k / GROUP_SIZE)
    shapes = {"tensor": (1,), "row": (rows, 1), "group": (kb, -(-rows // 4) * 4),
              "block": (math.ceil(rows / GROUP_SIZE), kb)}
    if kind not in shapes:
        raise ValueError(f"unknown scale kind {kind!r}; expected one of {SCALE_KINDS}")
    t = torch.rand(shapes[kind], device=device, generator=generator) + 0.5
    return t[:, :rows].t() if kind == "group" else t


def column_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` ([rows, cols]) with the same values, stored column-major (``t.t().contiguous().t()``): the
    layout cuBLASLt's block-wise ``scaled_mm`` wants for the 1x128 ``scale_a``."""
    return t.t().contiguous().t()


def cublas_block_call(a: torch.Tensor, b: torch.Tensor, sa_group: torch.Tensor, sb_block: torch.Tensor,
                      out_dtype: torch.dtype = torch.bfloat16):
    """cuBLASLt's block-scaled GEMM as a callable: ``a`` [M, K] and ``b`` [N, K] e4m3, ``sa_group`` fp32
    [M, ceil(K/128)] (1x128 groups), ``sb_block`` fp32 [ceil(N/128), ceil(K/128)] (128x128 blocks), through
    ``torch.nn.functional.scaled_mm`` BlockWise1x128 x BlockWise128x128 (``scale_a`` made column-major
    once, here); returns ``[M, N]`` in ``out_dtype``."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType

    sa_cm = column_major(sa_group)
    return lambda: F.scaled_mm(a, b.t(), sa_cm, ScalingType.BlockWise1x128, sb_block.t(),
                               ScalingType.BlockWise128x128, output_dtype=out_dtype)


def rotation_copies(bytes_per_copy: int, rotate_bytes: int, max_copies: int = 512) -> int:
    """How many copies of an operand set to cycle through so that the copies together span at least
    ``rotate_bytes`` (so no call finds its weight in L2): at least 2, at most ``max_copies``."""
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy: expected a positive byte count, got {bytes_per_copy}")
    return max(2, min(max_copies, math.ceil(rotate_bytes / bytes_per_copy)))
