"""GPU tests of the extension's row activation quantization (``act_quant`` modes 0 = static per-tensor and
1 = per-token; ``kernels/csrc/act_quant.cu`` ``quant_rows_kernel``) against the CPU path
(``fp8_linear.quantize``: torch ops, fp32 IEEE division, RNE cast) and the Triton path, bit for bit.

The shapes cover every launch plan of the row kernel: K below one warp's 8-element slots, K not a
multiple of 8 (the scalar path) or of 16, rows spread over several CTAs (static, K > 2048), per-token
rows held in registers (up to K = 32768) and longer rows (two passes), at M = 1, 7, 16 and 129; the
inputs put inf / NaN / saturating values and each row's amax at span boundaries and in the last span.
"""

from __future__ import annotations

import pytest
import torch

from fp8_linear import settings
from fp8_linear.formats import MIN_SCALE, fmt_max
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs a CUDA device of compute capability 9.0")]

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
MODE_STATIC, MODE_TOKEN = 0, 1  # kernels/include/act_quant.h
#: Elements of one CTA span at one slot a thread (256 threads x 8): the static row kernel's unit.
SPAN = 2048
#: K of the two-pass per-token path for 16-bit inputs (16 slots x 2048 elements).
RESIDENT_MAX_K = 16 * SPAN
KS = [1, 7, 100, 200, 1000, 2056, 4095, 8192, 16400, 18944, 28672, RESIDENT_MAX_K + 8]
MS = [1, 7, 16, 129]
STATIC_SCALE = 0.0123


@pytest.fixture(autouse=True)
def _fused_quant_on(monkeypatch):
    """The Triton reference path on (FP8_LINEAR_FUSED_QUANT unset), whatever the environment says."""
    monkeypatch.delenv("FP8_LINEAR_FUSED_QUANT", raising=False)
    settings.reload()
    yield
    settings.reload()


def _ext():
    from fp8_linear.backends.sm90 import extension

    return extension()


def _hard_rows(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[rows, k] of N(0, 3^2) with the cases the row kernel must get right: +-inf and NaN (not counted in
    the amax), an all-zero row (MIN_SCALE), an all-NaN row, values that saturate under the static scale,
    and row maxima placed at span boundaries and in the last span (a per-token amax over all spans)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 3
    for r in range(rows):  # the row's largest finite |x| in its last span, or just before a span boundary
        x[r, (k - 1 - r) % k if r % 2 else min(k - 1, SPAN * (r % 5 + 1) - 1)] = -40.0 - r if r % 3 else 40.0 + r
    x[0, 0] = float("inf")
    x[0, -1] = float("-inf")
    x[-1, -1] = float("nan")
    if rows > 2:
        x[1] = 0
        x[2, : min(k, 5)] *= 1e4
    if rows > 3:
        x[3] = float("nan")
    return x.to(dtype)


def _same_fp8(q1: torch.Tensor, q2: torch.Tensor) -> bool:
    """Same FP8 bits, NaN positions compared as NaN-ness (the CPU cast keeps NaN's sign bit)."""
    a, b = q1.float(), q2.float()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(q1.view(torch.uint8)[~nan], q2.view(torch.uint8)[~nan])


def _check_rows(x: torch.Tensor, fp8: torch.dtype) -> None:
    """act_quant static and per-token on CUDA `x` against the CPU path (bits, scales) and Triton (bytes)."""
    ext, code, m = _ext(), 0 if fp8 == E4 else 1, fmt_max(fp8)
    static = torch.tensor([STATIC_SCALE], device="cuda")
    ours = {
        "static": ext.act_quant(x, code, MODE_STATIC, static, m, MIN_SCALE),
        "token": ext.act_quant(x, code, MODE_TOKEN, None, m, MIN_SCALE),
    }
    xc, sc = x.cpu(), static.cpu()
    cpu = {"static": (quantize_unchecked(xc, fp8, sc), sc), "token": dynamic_quantize(xc, fp8, "token")}
    triton = {"static": quantize_unchecked(x, fp8, static), "token": dynamic_quantize(x, fp8, "token")[0]}
    shape = f"M={x.shape[0]} K={x.shape[1]} {x.dtype} {fp8}"
    for mode, (q, s) in ours.items():
        assert q.dtype == fp8 and q.shape == x.shape, f"{mode} {shape}"
        assert _same_fp8(q.cpu(), cpu[mode][0]), f"{mode} {shape}: FP8 bits differ from the CPU path"
        same_scales = torch.equal(s.cpu().reshape(-1), cpu[mode][1].reshape(-1))
        assert same_scales, f"{mode} {shape}: scales differ from the CPU path"
        same_bytes = torch.equal(q.view(torch.uint8), triton[mode].view(torch.uint8))
        assert same_bytes, f"{mode} {shape}: bytes differ from Triton"


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", MS)
def test_rows_bitwise_over_awkward_shapes(m, k):
    _check_rows(_hard_rows(m, k, torch.bfloat16, seed=m * 100003 + k).cuda(), E4)


@pytest.mark.parametrize("fp8", [E4, E5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(1, 18944), (16, 8200), (7, 100), (129, 4104), (3, 12000), (2, RESIDENT_MAX_K + 8)])
def test_rows_bitwise_over_dtypes_and_formats(fp8, dtype, m, k):
    """fp16 / fp32 inputs and e5m2 (fp32 rows of K > 8192 take the two-pass per-token path)."""
    _check_rows(_hard_rows(m, k, dtype, seed=k).cuda(), fp8)


@pytest.mark.parametrize("k", [18944, 4096, 1000])
@pytest.mark.parametrize("m", [1, 16])
def test_unaligned_and_strided_rows_match_contiguous(m, k):
    """Rows that start off 16-byte alignment or sit `k + 24` apart (the scalar path, or the vector path
    with a row stride) give the bytes and scales of the same values contiguous."""
    ext, mx = _ext(), fmt_max(E4)
    wide = _hard_rows(m, k + 24, torch.bfloat16, seed=k).cuda()
    static = torch.tensor([STATIC_SCALE], device="cuda")
    for x in (wide[:, :k], wide[:, 3 : k + 3]):
        for mode, scale in ((MODE_STATIC, static), (MODE_TOKEN, None)):
            q1, s1 = ext.act_quant(x, 0, mode, scale, mx, MIN_SCALE)
            q2, s2 = ext.act_quant(x.contiguous(), 0, mode, scale, mx, MIN_SCALE)
            assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)), f"mode {mode} M={m} K={k}"
            assert torch.equal(s1, s2), f"mode {mode} M={m} K={k}"
    _check_rows(wide[:, 3 : k + 3], E4)


def test_repeats_are_bitwise_equal():
    """Two launches on the same input give the same bytes and scales (no order-dependent reduction)."""
    ext, mx = _ext(), fmt_max(E4)
    x = _hard_rows(16, 28672, torch.bfloat16, seed=7).cuda()
    a = ext.act_quant(x, 0, MODE_TOKEN, None, mx, MIN_SCALE)
    b = ext.act_quant(x, 0, MODE_TOKEN, None, mx, MIN_SCALE)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
