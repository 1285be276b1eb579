"""Inputs that are unusual but valid: strided / non-contiguous tensors give the contiguous result,
and empty batches (M = 0) give sensible empty outputs, across the core public API."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8_linear import PRESETS, FP8Linear, dequantize_fp8, fp8_gemm, quantize_fp8

GRANULARITIES = ["tensor", "channel", "token", "group", "block"]


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantize_strided_equals_contiguous(granularity):
    base = torch.randn(300, 2 * 260)
    for x in (base[:, ::2], base.t()[:260, :300].t(), base[1::3, 5:265]):
        assert not x.is_contiguous()
        q, s = quantize_fp8(x, "e4m3", granularity)
        qc, sc = quantize_fp8(x.contiguous(), "e4m3", granularity)
        assert torch.equal(s, sc) and torch.equal(q.view(torch.uint8), qc.view(torch.uint8))
        assert torch.equal(dequantize_fp8(q, s), dequantize_fp8(qc, sc))


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_quantize_empty_rows(granularity):
    x = torch.empty(0, 300)
    q, s = quantize_fp8(x, "e4m3", granularity)
    assert q.shape == (0, 300) and q.dtype == torch.float8_e4m3fn
    expected = {"tensor": (1,), "channel": (0, 1), "token": (0, 1), "group": (0, 3), "block": (0, 3)}[granularity]
    assert tuple(s.shape) == expected and torch.isfinite(s).all() and (s > 0).all()
    assert dequantize_fp8(q, s).shape == (0, 300)


def test_quantize_scalar_and_1d():
    q, s = quantize_fp8(torch.tensor(3.0))
    assert q.shape == () and q.float().item() == 448.0 and s.item() == pytest.approx(3 / 448)
    q, s = quantize_fp8(torch.randn(300), granularity="group")
    assert q.shape == (300,) and tuple(s.shape) == (3,)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_linear_empty_and_strided_batches(preset):
    mod = FP8Linear.from_linear(nn.Linear(256, 40), preset, input_amax=3.0)
    assert mod(torch.empty(0, 256)).shape == (0, 40)
    assert mod(torch.empty(3, 0, 256, dtype=torch.float16)).shape == (3, 0, 40)
    x = torch.randn(6, 2 * 256)[:, ::2]
    assert torch.equal(mod(x), mod(x.contiguous()))


def test_gemm_expanded_scale_views():
    a = (torch.randn(8, 64) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(32, 64) * 4).to(torch.float8_e4m3fn)
    sa = torch.full((1, 1), 0.5).expand(8, 1)  # a stride-0 per-token scale
    out = fp8_gemm(a, b, sa, torch.ones(1), out_dtype=torch.float32)
    assert torch.equal(out, fp8_gemm(a, b, torch.full((8, 1), 0.5), torch.ones(1), out_dtype=torch.float32))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_nan_activation_stays_in_its_own_row(preset):
    mod = FP8Linear.from_linear(nn.Linear(256, 40), preset, input_amax=3.0)
    x = torch.randn(5, 256)
    clean = mod(x)
    x[2, 17] = float("nan")
    out = mod(x)
    assert torch.isnan(out[2]).all()
    rows = [0, 1, 3, 4]  # static scales are fixed, dynamic ones per token / group: other rows untouched
    assert torch.equal(out[rows], clean[rows])
