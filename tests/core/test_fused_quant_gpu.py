"""The fused CUDA activation quantization (fp8_linear/kernels/quant_triton.py) against the torch ops on the CPU.

The reference is the torch path on the CPU (IEEE division, as the contract says); torch's CUDA ops
divide by a Python scalar through a reciprocal and can differ from it by one ulp in the scale.
Both must give the same FP8 bits and the same scales (NaN positions compared as NaN-ness), for
static per-tensor, dynamic per-token and dynamic 1x128 groups, both formats, awkward K, inputs
with inf / NaN / all-zero rows, and a row-strided input.
"""

from __future__ import annotations

import pytest
import torch

from fp8_linear.kernels import quant_triton
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked
from fp8_linear import settings

pytestmark = pytest.mark.gpu

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _inputs(rows, k, dtype):
    g = torch.Generator(device="cuda").manual_seed(rows * 7919 + k)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.float32) * 3
    x[0, 0] = float("inf")
    x[-1, -1] = float("nan")
    if rows > 2:
        x[1] = 0
        x[2, : min(k, 5)] *= 1e4  # saturates under a static scale
    return x.to(dtype)


def _same(q1, q2):
    a, b = q1.float(), q2.float()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(q1.view(torch.uint8)[~nan], q2.view(torch.uint8)[~nan])


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,k", [(1, 16), (7, 48), (64, 1040), (129, 4096), (3, 16400)])
def test_fused_matches_torch_ops(monkeypatch, fp8, dtype, rows, k):
    monkeypatch.setenv(quant_triton.ENV_DISABLE, "1")
    settings.reload()
    x = _inputs(rows, k, dtype)
    assert quant_triton.available(x)[0], quant_triton.available(x)
    static = torch.tensor([0.0123], device="cuda")
    fused = {
        "static": (quantize_unchecked(x, fp8, static), static),
        "token": dynamic_quantize(x, fp8, "token"),
        "group": dynamic_quantize(x, fp8, "group"),
    }
    xc, sc = x.cpu(), static.cpu()
    ref = {
        "static": (quantize_unchecked(xc, fp8, sc), sc),
        "token": dynamic_quantize(xc, fp8, "token"),
        "group": dynamic_quantize(xc, fp8, "group"),
    }
    for mode in fused:
        assert _same(fused[mode][0].cpu(), ref[mode][0]), mode
        assert torch.equal(fused[mode][1].cpu(), ref[mode][1]), mode


def test_row_strided_input_matches_contiguous(monkeypatch):
    monkeypatch.setenv(quant_triton.ENV_DISABLE, "1")
    settings.reload()
    x = torch.randn(32, 2 * 512, device="cuda", dtype=torch.bfloat16)[:, :512]
    assert x.stride() == (1024, 1)
    q1, s1 = dynamic_quantize(x, torch.float8_e4m3fn, "token")
    q2, s2 = dynamic_quantize(x.contiguous(), torch.float8_e4m3fn, "token")
    assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s1, s2)
