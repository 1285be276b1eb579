"""A model of the sm90 FP8 tensor core's accumulation and the calc_diff floor it implies for small outputs
(docs/design.md section 7).

Model: a k32 wgmma step adds 32 exact FP8 products to the accumulator after aligning all 33 terms to the
largest exponent among them and truncating each toward zero to FRACTION_BITS bits below it (the "about 14
bits" of FP8 accumulation on Hopper); the step's sum is then an fp32. The kernel promotes every 128 of K:
``fin = fma(partial, scale_a * scale_b, fin)`` in fp32. With FRACTION_BITS = 13 the model's calc_diff
against fp64 is 7.4-7.9e-9 on 64 x 256 outputs (K 1040 / 4096, per-tensor or block scales), where cuBLASLt
with FP32 promotion measures 7.9e-9 on an H200: the 1e-8 floor of the GPU tests. numpy, CPU only.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from helpers import KERNEL_FLOOR

#: Fraction bits the model keeps below the largest term of a k32 step.
FRACTION_BITS = 13
#: Products per wgmma step and per promotion (the kernel's k-block).
STEP_K = 32
BLOCK_K = 128
#: Spread of calc_diff over n outputs about the tensor-core mean: floor = KERNEL_FLOOR (1 + FLOOR_SPREAD / sqrt(n))
#: (covers 2.6x the mean, the largest of 600 draws of the model at n = 72 with block scales).
FLOOR_SPREAD = 16.0


def block_floor(n: int) -> float:
    """The tensor-core floor of calc_diff for an output of ``n`` values (docs/design.md section 7)."""
    return KERNEL_FLOOR * (1 + FLOOR_SPREAD / math.sqrt(n))


def _aligned_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over the last axis after aligning to the largest exponent and truncating to FRACTION_BITS."""
    mx = np.abs(terms).max(axis=-1, keepdims=True)
    q = np.exp2(np.floor(np.log2(np.where(mx > 0, mx, 1.0))) - FRACTION_BITS)
    return (np.trunc(terms / q) * q).sum(-1)


def model_gemm(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a`` [M, K] and ``b`` [N, K] (FP8 values as float64), ``sa`` [M, ceil(K/128)], ``sb``
    [ceil(N/128), ceil(K/128)]: (the modelled kernel's fp32 output, the fp64 reference), both [M, N]."""
    m, k = a.shape
    n = b.shape[0]
    kb_n = -(-k // BLOCK_K)
    ap = np.zeros((m, kb_n * BLOCK_K))
    bp = np.zeros((n, kb_n * BLOCK_K))
    ap[:, :k], bp[:, :k] = a, b
    wb = np.arange(n) // BLOCK_K
    fin = np.zeros((m, n), dtype=np.float32)
    ref = np.zeros((m, n))
    for kb in range(kb_n):
        cols = slice(kb * BLOCK_K, (kb + 1) * BLOCK_K)
        prod = ap[:, None, cols] * bp[None, :, cols]  # exact
        acc = np.zeros((m, n))
        for st in range(BLOCK_K // STEP_K):
            terms = np.concatenate([acc[..., None], prod[..., st * STEP_K:(st + 1) * STEP_K]], axis=-1)
            acc = _aligned_sum(terms).astype(np.float32).astype(np.float64)
        s = (sa[:, kb, None].astype(np.float32) * sb[wb, kb][None, :].astype(np.float32)).astype(np.float64)
        fin = (acc * s + fin).astype(np.float32)  # FFMA: one rounding
        ref += prod.sum(-1) * sa[:, kb, None] * sb[wb, kb][None, :]
    return fin.astype(np.float64), ref


def model_calc_diff(m: int, n: int, k: int, block: bool, seed: int) -> float:
    """calc_diff of the modelled kernel against fp64 on the block GPU tests' inputs (FP8 e4m3 of 2 N(0, 1);
    with ``block``, scales 2^U(-2, 2) per 1x128 group and per 128x128 block; else all scales 1)."""
    g = torch.Generator().manual_seed(seed)

    def fp8(rows):
        x = (torch.randn(rows, k, generator=g, dtype=torch.float64) * 2.0).clamp(-448, 448)
        return x.float().to(torch.float8_e4m3fn).double().numpy()

    a, b = fp8(m), fp8(n)
    kb_n, nb_n = -(-k // BLOCK_K), -(-n // BLOCK_K)
    if block:
        sa = torch.exp2(torch.rand(m, kb_n, generator=g) * 4 - 2).double().numpy()
        sb = torch.exp2(torch.rand(nb_n, kb_n, generator=g) * 4 - 2).double().numpy()
    else:
        sa, sb = np.ones((m, kb_n)), np.ones((nb_n, kb_n))
    x, y = model_gemm(a, b, sa, sb)
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
