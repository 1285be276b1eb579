"""fp8_gemm on the emulated backend against fp64 math on the dequantized operands (docs/design.md section 7).

Bar: calc_diff(out, ref) <= 1.05 x calc_diff(ref rounded to out_dtype, ref) + 1e-12.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import calc_diff, gemm_ref64, random_fp8, random_scale, rounding_bar, scale_shape_for

from fp8_linear import fp8_gemm
from fp8_linear import settings

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT = (torch.bfloat16, torch.float16, torch.float32)
#: (M, N, K): awkward sizes of docs/design.md section 7, kept small enough for a 2-core CPU.
SHAPES = [(1, 72, 48), (7, 72, 1040), (64, 200, 128), (127, 4104, 48), (3, 16, 16400), (130, 257, 300)]
#: scale_a kinds x scale_b kinds that fp8_gemm accepts.
SCALE_PAIRS = [(a, b) for a in ("tensor", "row", "group") for b in ("tensor", "row", "block")]


@pytest.fixture(autouse=True)
def _emulated(monkeypatch):
    monkeypatch.setenv("FP8_LINEAR_BACKEND", "emulated")
    settings.reload()


def _problem(m, n, k, fa, fb, ka, kb, bias):
    a, b = random_fp8((m, k), fa), random_fp8((n, k), fb)
    sa, sb = random_scale(scale_shape_for(ka, m, k)), random_scale(scale_shape_for(kb, n, k))
    bias_t = torch.randn(n) if bias else None
    return a, b, sa, sb, bias_t


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("ka,kb", SCALE_PAIRS)
def test_every_scale_kind_meets_rounding_bar(m, n, k, ka, kb):
    fa, fb = FP8[(m + n) % 2], FP8[(m + k) % 2]  # spread the formats over the sweep
    a, b, sa, sb, bias = _problem(m, n, k, fa, fb, ka, kb, bias=(n % 2 == 0))
    ref = gemm_ref64(a, b, sa, sb, bias)
    for out_dtype in OUT:
        out = fp8_gemm(a, b, sa, sb, bias, out_dtype=out_dtype)
        assert out.shape == (m, n) and out.dtype == out_dtype
        assert calc_diff(out, ref) <= rounding_bar(ref, out_dtype)


@pytest.mark.parametrize("fa,fb", list(itertools.product(FP8, FP8)))
@pytest.mark.parametrize("bias", [False, True])
def test_both_formats_every_combination(fa, fb, bias):
    a, b, sa, sb, bias_t = _problem(33, 96, 272, fa, fb, "row", "row", bias)
    ref = gemm_ref64(a, b, sa, sb, bias_t)
    out = fp8_gemm(a, b, sa, sb, bias_t, out_dtype=torch.float32)
    assert calc_diff(out, ref) <= rounding_bar(ref, torch.float32)


def test_bias_of_half_dtypes_added_in_fp32():
    a, b, sa, sb, _ = _problem(16, 64, 96, FP8[0], FP8[0], "tensor", "row", False)
    for bdt in (torch.bfloat16, torch.float16):
        bias = torch.randn(64).to(bdt)
        ref = gemm_ref64(a, b, sa, sb, bias)
        assert calc_diff(fp8_gemm(a, b, sa, sb, bias, torch.float32), ref) <= rounding_bar(ref, torch.float32)


def test_repeated_runs_are_bitwise_identical():
    a, b, sa, sb, bias = _problem(127, 72, 1040, FP8[0], FP8[0], "group", "block", True)
    first = fp8_gemm(a, b, sa, sb, bias)
    for _ in range(3):
        assert torch.equal(fp8_gemm(a, b, sa, sb, bias).view(torch.int16), first.view(torch.int16))


def test_strided_inputs_give_the_contiguous_result():
    a_big, b_big = random_fp8((64, 2 * 96), FP8[0]), random_fp8((2 * 48, 96), FP8[0])
    a, b = a_big[:, ::2], b_big[::2]  # non-contiguous K, strided rows
    sa, sb = random_scale((64, 1)), random_scale((48, 1))
    assert not a.is_contiguous() and not b.is_contiguous()
    out = fp8_gemm(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.equal(out, fp8_gemm(a.contiguous(), b.contiguous(), sa, sb, out_dtype=torch.float32))
    ref = gemm_ref64(a.contiguous(), b.contiguous(), sa, sb)
    assert calc_diff(out, ref) <= rounding_bar(ref, torch.float32)
    # A transposed view [K, M].t() is accepted too.
    at = a.contiguous().t().contiguous().t()
    assert torch.equal(fp8_gemm(at, b, sa, sb, out_dtype=torch.float32), out)


@pytest.mark.parametrize("bias", [False, True])
def test_m_zero_gives_empty_output(bias):
    b, sb = random_fp8((72, 48), FP8[0]), random_scale((72, 1))
    a = torch.empty(0, 48, dtype=FP8[0])
    out = fp8_gemm(a, b, torch.ones(1), sb, torch.randn(72) if bias else None, out_dtype=torch.float16)
    assert out.shape == (0, 72) and out.dtype == torch.float16
    out = fp8_gemm(a, b, torch.ones(0, 1), sb)  # per-token scales of an empty batch
    assert out.shape == (0, 72)
