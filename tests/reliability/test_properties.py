"""Property tests (hypothesis): quantize/dequantize bounds, saturation, monotonicity, and
fp8_gemm against the fp64 reference over random shapes, scale kinds and formats (emulated in CI,
the default GPU backend when marked ``gpu``)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import KERNEL_FLOOR, calc_diff, expand64, gemm_ref64, random_fp8, random_scale, rounding_bar, scale_shape_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8_linear import fmt_max, fp8_gemm, quantize_fp8
from fp8_linear.backends import BACKEND_ENV, candidates
from fp8_linear.formats import FORMATS
from fp8_linear.gemm import make_problem

#: Examples per property: enough to find edge cases, cheap enough for CI on 2 cores.
EXAMPLES = 200
GEMM_EXAMPLES = 100
PROPS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GEMM_PROPS = settings(max_examples=GEMM_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
#: fp32 division x/scale rounds once before the FP8 rounding: allow that much past half an ulp.
FP32_SLACK = 2.0**-20
#: Smallest M and N of a random GEMM with fp32 output (see :func:`gemm_problems`).
MIN_FP32_SIDE = 4

fmts = st.sampled_from(list(FORMATS))
finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
scales = st.floats(min_value=2.0**-26, max_value=2.0**13, allow_nan=False, width=32)


def _half_ulp(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the FP8 spacing at fp64 ``y`` (the subnormal spacing below the smallest normal)."""
    emin = math.log2(torch.finfo(dtype).smallest_normal)
    e = torch.floor(torch.log2(y.abs().clamp(min=2.0**emin)))
    return torch.exp2(e - MANTISSA[dtype]) / 2


@st.composite
def tensors(draw, max_rows=6, max_cols=300):
    """A 2-D fp32 tensor from a seeded normal, magnitude and shape drawn by hypothesis."""
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    mag = 10.0 ** draw(st.integers(-6, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return torch.randn(rows, cols, generator=g) * mag


@PROPS
@given(x=tensors(), fmt=fmts, gran=st.sampled_from(["tensor", "channel", "token", "group", "block"]))
def test_round_trip_error_within_half_ulp(x, fmt, gran):
    dtype = FORMATS[fmt]
    q, s = quantize_fp8(x, fmt, gran)
    kind = {"tensor": "tensor", "channel": "row", "token": "row", "group": "group", "block": "block"}[gran]
    y = x.double() / expand64(s, tuple(x.shape), kind)  # the scaled value, in range by construction
    assert (y.abs() <= fmt_max(dtype) * (1 + FP32_SLACK)).all()
    err = (q.double() - y).abs()
    assert (err <= _half_ulp(y, dtype) * (1 + FP32_SLACK) + 1e-300).all()


@PROPS
@given(values=st.lists(finite32, min_size=1, max_size=64), scale=scales, fmt=fmts)
def test_elementwise_half_ulp_or_saturation(values, scale, fmt):
    dtype = FORMATS[fmt]
    x = torch.tensor(values, dtype=torch.float32)
    s = torch.tensor([scale], dtype=torch.float32)
    q, _ = quantize_fp8(x, fmt, scale=s)
    y = x.double() / s.double()
    m = fmt_max(dtype)
    inside = y.abs() <= m
    qd = q.double()
    assert (qd[~inside] == torch.sign(y[~inside]) * m).all(), "values past the range saturate at +-max"
    err = (qd[inside] - y[inside]).abs()
    assert (err <= _half_ulp(y[inside], dtype) * (1 + FP32_SLACK) + 1e-300).all()
    assert torch.isfinite(qd).all()


@PROPS
@given(x=tensors(), fmt=fmts, seed=st.integers(0, 2**31 - 1))
def test_stochastic_rounding_picks_a_neighbour(x, fmt, seed):
    dtype = FORMATS[fmt]
    q, s = quantize_fp8(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(seed))
    y = x.double() / s.double()
    # Strictly less than one ulp away (twice the half ulp), and never past the range.
    assert ((q.double() - y).abs() < 2 * _half_ulp(y, dtype) * (1 + FP32_SLACK) + 1e-300).all()
    assert (q.float().abs() <= fmt_max(dtype)).all()


@PROPS
@given(values=st.lists(st.floats(allow_nan=False, width=32), min_size=2, max_size=64), scale=scales, fmt=fmts)
def test_monotonic(values, scale, fmt):
    x = torch.tensor(sorted(values), dtype=torch.float32)
    q, _ = quantize_fp8(x, fmt, scale=torch.tensor([scale]))
    qf = q.float()
    assert (qf[1:] >= qf[:-1]).all()


@PROPS
@given(x=tensors(), fmt=fmts, big=st.floats(min_value=1.0001, max_value=1e30))
def test_saturation_at_format_max(x, fmt, big):
    m = fmt_max(FORMATS[fmt])
    _, s = quantize_fp8(x, fmt)
    x2 = x.clone()
    x2[0, 0] = x.abs().max() * big + 1  # push one element past the calibrated range
    q, _ = quantize_fp8(x2, fmt, scale=s)
    assert q.float().abs().max().item() == m
    assert q[0, 0].float().item() == m


@st.composite
def gemm_problems(draw, device="cpu", max_m=80, max_n=300, max_k=700):
    """Random (a, b, scale_a, scale_b, bias, out_dtype) over shapes, formats and scale kinds.

    fp32 outputs get at least :data:`MIN_FP32_SIDE` rows and columns: a lone fp32 dot product can
    cancel to far below its terms, and then fp32 accumulation error (inherent, not a bug) dominates a
    relative measure of one element; over 16+ elements calc_diff averages it out (measured worst
    case: 0.15 of the bar over 1500 random problems).
    """
    out_dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    lo = MIN_FP32_SIDE if out_dtype == torch.float32 else 1
    m, n, k = draw(st.integers(lo, max_m)), draw(st.integers(lo, max_n)), draw(st.integers(1, max_k))
    fa, fb = draw(st.sampled_from(list(FORMATS.values()))), draw(st.sampled_from(list(FORMATS.values())))
    ka, kb = draw(st.sampled_from(["tensor", "row", "group"])), draw(st.sampled_from(["tensor", "row", "block"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    a, b = random_fp8((m, k), fa, device, g), random_fp8((n, k), fb, device, g)
    sa = random_scale(scale_shape_for(ka, m, k), device, g)
    sb = random_scale(scale_shape_for(kb, n, k), device, g)
    bias = (torch.randn(n, generator=g) * 3).to(device) if draw(st.booleans()) else None
    return a, b, sa, sb, bias, out_dtype


@GEMM_PROPS
@given(problem=gemm_problems())
def test_fp8_gemm_emulated_matches_reference(monkeypatch, problem):
    monkeypatch.setenv(BACKEND_ENV, "emulated")
    a, b, sa, sb, bias, out_dtype = problem
    out = fp8_gemm(a, b, sa, sb, bias, out_dtype)
    ref = gemm_ref64(a, b, sa, sb, bias)
    assert out.shape == ref.shape and out.dtype == out_dtype
    assert calc_diff(out, ref) <= rounding_bar(ref, out_dtype)


gpu = pytest.mark.gpu


@gpu
@GEMM_PROPS
@given(problem=gemm_problems(device="cuda", max_m=300, max_n=600, max_k=2100))
def test_fp8_gemm_default_gpu_backend_matches_reference(monkeypatch, problem):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    a, b, sa, sb, bias, out_dtype = problem
    chosen = next(name for name, ok, _ in candidates(make_problem(a, b, sa, sb, bias, out_dtype)) if ok)
    out = fp8_gemm(a, b, sa, sb, bias, out_dtype)
    ref = gemm_ref64(a, b, sa, sb, bias)
    row = sa.numel() > 1 or sb.numel() > 1
    # Older torch builds write row-wise torch._scaled_mm results in bf16 only (the backend then converts).
    effective = torch.bfloat16 if chosen == "cublaslt" and row else out_dtype
    floor = KERNEL_FLOOR if chosen != "emulated" else 1e-12
    bar = max(rounding_bar(ref, effective, floor), rounding_bar(ref, out_dtype, floor))
    assert calc_diff(out, ref) <= bar, f"backend {chosen}"


@gpu
@PROPS
@given(x=tensors(max_rows=300, max_cols=1000), fmt=fmts, gran=st.sampled_from(["tensor", "channel", "token", "group", "block"]))
def test_quantize_on_gpu_bitwise_equals_cpu(x, fmt, gran):
    q_cpu, s_cpu = quantize_fp8(x, fmt, gran)
    q_gpu, s_gpu = quantize_fp8(x.cuda(), fmt, gran)
    assert torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
