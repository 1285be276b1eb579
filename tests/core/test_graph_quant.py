"""The traced activation quantization (fp8_linear.graph_quant) against the package's quantization.

What ``FP8Linear`` computes inside a ``torch.compile`` graph must be bit for bit what it computes
eagerly: the FP8 bits (NaN positions compared as NaN-ness) and the per-token scales, for both
formats, inputs with inf / NaN / all-zero rows / saturating values, and quotients that sit on a
rounding boundary of fp32 (where an approximate or reciprocal division differs from IEEE division).
CPU: eager torch ops and inductor's C++ code against quantize_unchecked / dynamic_quantize. GPU:
inductor's Triton code against our CUDA kernel (the sm90 backend's eager path) and the fused Triton
kernel.
"""

from __future__ import annotations

import pytest
import torch

from fp8_linear import graph_quant
from fp8_linear.formats import MIN_SCALE, fmt_max
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _inputs(rows: int, k: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 7919 + k)
    x = torch.randn(rows, k, generator=g, dtype=torch.float32) * 3
    x[0, 0] = float("inf")
    x[-1, -1] = float("nan")
    if rows > 2:
        x[1] = 0
        x[2, : min(k, 5)] *= 1e4  # saturates under a static scale
    return x.to(dtype).to(device)


def _boundary_inputs(scale: float, n: int = 4096) -> torch.Tensor:
    """fp32 values whose quotient by ``scale`` is near an fp32 rounding boundary (one ulp steps around
    ``q * scale`` for FP8-grid quotients ``q``): where ``x * (1 / scale)`` and ``x / scale`` differ."""
    q = torch.linspace(-440, 440, n, dtype=torch.float64)
    base = (q * scale).to(torch.float32)
    steps = torch.arange(-3, 4, dtype=torch.int32)
    bits = base.view(torch.int32)[:, None] + steps[None, :]
    return bits.view(torch.float32).reshape(1, -1)


def _same(q1: torch.Tensor, q2: torch.Tensor) -> bool:
    a, b = q1.float().cpu(), q2.float().cpu()
    nan = torch.isnan(a)
    return (torch.equal(nan, torch.isnan(b))
            and torch.equal(q1.cpu().view(torch.uint8)[~nan], q2.cpu().view(torch.uint8)[~nan]))


def test_exact_div_is_ieee_fp32_division():
    """Both quotient forms are torch.div's IEEE fp32 quotient (random operands; the boundary cases below)."""
    a = torch.randn(100_000, dtype=torch.float32) * 1e3
    b = torch.rand(100_000, dtype=torch.float32) + 1e-3
    assert torch.equal(graph_quant.exact_div(a, b), torch.div(a, b))
    assert torch.equal(graph_quant.scaled_quotient(a, b), torch.div(a, b))


@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,k", [(1, 16), (7, 48), (33, 1040)])
def test_eager_matches_package_quantization(fp8, dtype, rows, k):
    x = _inputs(rows, k, dtype)
    s = torch.tensor([0.0123])
    assert _same(graph_quant.quantize_static(x, s, fp8), quantize_unchecked(x, fp8, s))
    q, scale = graph_quant.quantize_per_token(x, fp8)
    q_ref, scale_ref = dynamic_quantize(x, fp8, "token")
    assert torch.equal(scale, scale_ref) and _same(q, q_ref)


@pytest.mark.parametrize("fp8", FORMATS)
def test_rounding_boundaries_and_all_zero_rows(fp8):
    scale = 0.0123
    x = _boundary_inputs(scale)
    s = torch.tensor([scale])
    assert _same(graph_quant.quantize_static(x, s, fp8), quantize_unchecked(x, fp8, s))
    z = torch.zeros(2, 64)
    q, sc = graph_quant.quantize_per_token(z, fp8)
    assert torch.equal(sc, torch.full((2, 1), MIN_SCALE)) and not q.float().any()


@pytest.mark.slow
@pytest.mark.parametrize("fp8", FORMATS)
def test_compiled_cpu_matches_eager(fp8):
    torch._dynamo.reset()
    x = torch.cat([_inputs(5, 4096, torch.float32), _boundary_inputs(0.0123)[:, :4096]])
    s = torch.tensor([0.0123])
    static = torch.compile(graph_quant.quantize_static, fullgraph=True, dynamic=False)
    token = torch.compile(graph_quant.quantize_per_token, fullgraph=True, dynamic=False)
    assert _same(static(x, s, fp8), quantize_unchecked(x, fp8, s))
    q, scale = token(x, fp8)
    q_ref, scale_ref = dynamic_quantize(x, fp8, "token")
    assert torch.equal(scale, scale_ref) and _same(q, q_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,k", [(1, 4096), (16, 14336), (129, 1040)])
def test_compiled_gpu_matches_our_kernel(fp8, dtype, rows, k):
    """Inductor's Triton code (fp64 reciprocal product) against the sm90 extension's act_quant (``__fdiv_rn``)."""
    from fp8_linear.backends import sm90

    torch._dynamo.reset()  # one compile per parametrization: stay under dynamo's recompile limit
    ok, why = sm90.Sm90Backend().supports(torch.device("cuda"))
    if not ok:
        pytest.skip(why)
    ext = sm90.extension()
    code = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}[fp8]
    scale = 0.0123
    x = _inputs(rows, k, dtype, "cuda")
    if dtype == torch.float32:
        b = _boundary_inputs(scale).cuda()[:, : k]
        x[0, : b.shape[1]] = b[0]
    s = torch.tensor([scale], device="cuda")
    static = torch.compile(graph_quant.quantize_static, fullgraph=True, dynamic=False)
    token = torch.compile(graph_quant.quantize_per_token, fullgraph=True, dynamic=False)
    q_k, _ = ext.act_quant(x, code, 0, s, fmt_max(fp8), MIN_SCALE)
    assert _same(static(x, s, fp8), q_k)
    q_k, s_k = ext.act_quant(x, code, 1, None, fmt_max(fp8), MIN_SCALE)
    q, sc = token(x, fp8)
    assert torch.equal(sc.reshape(-1), s_k.reshape(-1)) and _same(q, q_k)
