"""Speed paths of the emulated backend and of quantize.py must leave results bitwise unchanged:
the weight cache used during evaluation, and the CPU fast path of compute_amax."""

from __future__ import annotations

import pytest
import torch

from fp8_linear import FP8Linear
from fp8_linear.backends import emulated
from fp8_linear.quantize import compute_amax, expand_scale

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]


@pytest.fixture(autouse=True)
def _force_emulated(monkeypatch):
    monkeypatch.setenv("FP8_LINEAR_BACKEND", "emulated")


def _layer(scheme, n_in=200, n_out=136, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(n_in, n_out)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g) * 0.1)
        lin.bias.copy_(torch.randn(n_out, generator=g))
    return FP8Linear.from_linear(lin, scheme, input_amax=4.0)


@pytest.mark.parametrize("scheme", PRESETS)
def test_weight_cache_is_bitwise_identical(scheme):
    mod = _layer(scheme)
    xs = [torch.randn(37, 200) * 2 for _ in range(3)]
    ref = [mod(x) for x in xs]
    with torch.inference_mode(), emulated.weight_cache():
        got = [mod(x) for x in xs]
        assert len(emulated._cache) == 1  # one dequantized weight, reused
    assert emulated._cache is None
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


def test_weight_cache_sees_in_place_updates_and_budget():
    mod = _layer("fp8-channel")
    x = torch.randn(9, 200)
    with torch.no_grad(), emulated.weight_cache():
        y0 = mod(x)
        mod.weight_scale.mul_(2.0)  # in place: the cached operand is stale and must not be used
        y1 = mod(x)
        mod.weight.copy_(torch.zeros_like(mod.weight))
        y2 = mod(x)
    assert torch.allclose(y1 - mod.bias, 2 * (y0 - mod.bias), rtol=1e-5, atol=1e-5)
    assert torch.equal(y2, mod.bias.expand_as(y2))
    with torch.no_grad(), emulated.weight_cache(max_bytes=0):
        assert torch.equal(mod(x), y2) and emulated._cache == {}


def _amax_reference(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """Independent: amax over the finite |x| per cell, via an explicit loop over cells in fp64."""
    a = x.double().abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    if granularity == "tensor":
        return a.max().reshape(1).float()
    if granularity in ("channel", "token"):
        return a.amax(-1, keepdim=True).float()
    if granularity == "group":
        return torch.stack([c.amax(-1) for c in a.split(128, dim=-1)], dim=-1).float()
    rows = [torch.stack([blk.max() for blk in r.split(128, dim=1)]) for r in a.split(128, dim=0)]
    return torch.stack(rows).float()


@pytest.mark.parametrize("granularity", ["tensor", "channel", "token", "group", "block"])
@pytest.mark.parametrize("poison", [None, "nan", "inf", "huge64"])
def test_compute_amax_fast_path_bitwise(granularity, poison):
    g = torch.Generator().manual_seed(3)
    dtype = torch.float64 if poison == "huge64" else torch.float32
    x = (torch.randn(130, 300, generator=g) * 5).to(dtype)
    if poison == "nan":
        x[4, 7] = float("nan")
    elif poison == "inf":
        x[129, 299] = -float("inf")
    elif poison == "huge64":
        x[0, 0] = 1e300  # finite in fp64, inf once cast to the fp32 scale dtype: same either way
    got = compute_amax(x, granularity)
    ref = _amax_reference(x, granularity)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.equal(got, ref)
    assert expand_scale(got, x.shape).shape == x.shape


@pytest.mark.parametrize("shape,granularity", [((7, 576), "group"), ((3, 5, 300), "group"), ((4, 128), "group"),
                                               ((9, 100), "group"), ((576, 1536), "block"), ((130, 300), "block"),
                                               ((257, 129), "block"), ((6, 40), "token"), ((6, 40), "tensor")])
@pytest.mark.parametrize("divide", [False, True])
def test_scale_in_place_is_bitwise_the_expanded_product(shape, granularity, divide):
    from fp8_linear.quantize import dequantize_fp8, quantize_unchecked, scale_, scale_from_amax

    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)) * 7
    s = scale_from_amax(compute_amax(x, granularity), torch.float8_e4m3fn)
    e = expand_scale(s, x.shape)
    ref = x / e if divide else x * e
    assert torch.equal(scale_(x.clone(), s, divide=divide), ref)
    q = quantize_unchecked(x, torch.float8_e4m3fn, s)
    q_ref = torch.clamp(x / e, -448.0, 448.0).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(dequantize_fp8(q, s), q.float() * e)


def test_fp8_to_float32_every_bit_pattern():
    from fp8_linear.quantize import fp8_to_float32

    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        q = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
        got, ref = fp8_to_float32(q), q.to(torch.float32)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert torch.equal(got.isnan(), ref.isnan())
        keep = ~ref.isnan()
        assert torch.equal(got.view(torch.int32)[keep], ref.view(torch.int32)[keep])  # signed zeros too
        assert torch.equal(fp8_to_float32(q.t()).nan_to_num(7.0), ref.t().nan_to_num(7.0))  # strided input
