"""The cublaslt backend's ``run`` (scale layout, bias handling, output dtype) on CPU.

torch ships a CPU ``torch._scaled_mm``; calling ``CublasLtBackend().run`` directly (bypassing
``supports``, which needs CUDA) checks the backend's own logic against the fp64 reference with the
tensor-core bar. The GPU itself is covered by ``test_gpu_cublaslt.py``."""

from __future__ import annotations

import pytest
import torch
from helpers import (KERNEL_FLOOR, calc_diff, cpu_scaled_mm_available, gemm_ref64, random_fp8, random_scale, rounding_bar,
                     scale_shape_for)

from fp8_linear.backends.cublaslt import CublasLtBackend
from fp8_linear.gemm import make_problem


needs_cpu_scaled_mm = pytest.mark.skipif(not cpu_scaled_mm_available(),
                                         reason="torch._scaled_mm does not run on this CPU (oneDNN FP8 needs AVX512-FP16)")


@needs_cpu_scaled_mm
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kinds", [("tensor", "tensor"), ("row", "row"), ("tensor", "row"), ("row", "tensor")])
def test_run_meets_kernel_bar(kinds, out_dtype, bias_dtype):
    m, n, k = 17, 64, 96
    a, b = random_fp8((m, k), torch.float8_e4m3fn), random_fp8((n, k), torch.float8_e4m3fn)
    sa, sb = random_scale(scale_shape_for(kinds[0], m, k)), random_scale(scale_shape_for(kinds[1], n, k))
    bias = torch.randn(n).to(bias_dtype) if bias_dtype else None
    p = make_problem(a, b, sa, sb, bias, out_dtype)
    assert CublasLtBackend().can_run(p)[0]
    out = CublasLtBackend().run(p)
    ref = gemm_ref64(a, b, sa, sb, bias)
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert calc_diff(out, ref) <= rounding_bar(ref, out_dtype, KERNEL_FLOOR)


@pytest.mark.parametrize("kb", [4, 5, 9])
def test_block_scale_b_layouts(kb):
    """The three ``scale_b`` layouts the block probe tries: same values, the shapes / strides torch asks for."""
    import fp8_linear.backends.cublaslt as cl

    sb = torch.rand(3, kb) + 0.5
    kb4 = -(-kb // 4) * 4
    padded, strided, contiguous = (cl._block_scale_b(sb, lay) for lay in cl.BLOCK_B_LAYOUTS)
    assert padded.shape == (kb4, 3) and padded.stride() == (1, kb4) and torch.equal(padded[:kb], sb.t())
    assert strided.shape == (kb, 3) and strided.stride() == (1, kb4) and torch.equal(strided, sb.t())
    assert contiguous.shape == (kb, 3) and contiguous.stride() == (1, kb) and torch.equal(contiguous, sb.t())


def test_pad_rows_keeps_values_and_fills():
    import fp8_linear.backends.cublaslt as cl

    a = random_fp8((1, 32), torch.float8_e4m3fn)
    s = random_scale((1, 1))
    pa, ps = cl._pad_rows(a, 4, 0.0), cl._pad_rows(s, 4, 1.0)
    assert pa.shape == (4, 32) and torch.equal(pa[:1].view(torch.uint8), a.view(torch.uint8)) and not pa[1:].float().any()
    assert ps.shape == (4, 1) and torch.equal(ps[:1], s) and torch.equal(ps[1:], torch.ones(3, 1))


def test_row_scales_are_handed_to_cublaslt_16_byte_aligned():
    """A row slice of a larger scale tensor (one expert's tokens) starts mid-vector; cuBLASLt needs its
    scale pointers 16-byte aligned, so such a slice is copied and an aligned one is passed as it is."""
    import fp8_linear.backends.cublaslt as C

    scales = torch.rand(64, 1)
    sliced = scales[1:9]
    assert sliced.data_ptr() % C.SCALE_ALIGN_BYTES != 0
    fixed = C.aligned_scale(sliced)
    assert fixed.data_ptr() % C.SCALE_ALIGN_BYTES == 0 and torch.equal(fixed, sliced)
    assert C.aligned_scale(scales) is scales
