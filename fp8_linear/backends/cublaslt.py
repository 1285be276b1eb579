"""The ``cublaslt`` backend: ``torch._scaled_mm`` (cuBLASLt), compute capability >= 8.9."""

from __future__ import annotations

import torch

from .base import SCALE_ROW, SCALE_TENSOR, Backend, GemmProblem

#: First compute capability with FP8 tensor cores (Ada).
MIN_CAPABILITY = (8, 9)
#: cuBLASLt FP8 needs leading dimensions that are multiples of 16 bytes.
ALIGN = 16


class CublasLtBackend(Backend):
    """Per-tensor or row-wise scales through ``torch._scaled_mm``."""

    name = "cublaslt"

    def supports(self, device: torch.device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"needs a CUDA device, got {device.type}"
        if not hasattr(torch, "_scaled_mm"):
            return False, "this torch has no torch._scaled_mm"
        cc = torch.cuda.get_device_capability(device)
        if cc < MIN_CAPABILITY:
            return False, f"needs compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, device has {cc[0]}.{cc[1]}"
        return True, f"compute capability {cc[0]}.{cc[1]}"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        p = problem
        if p.scale_a_kind not in (SCALE_TENSOR, SCALE_ROW) or p.scale_b_kind not in (SCALE_TENSOR, SCALE_ROW):
            return False, f"scales {p.scale_a_kind}/{p.scale_b_kind} are not per-tensor or row-wise"
        if p.a.dtype == torch.float8_e5m2 and p.b.dtype == torch.float8_e5m2:
            return False, "cuBLASLt has no e5m2 x e5m2 FP8 GEMM"
        if p.k % ALIGN or p.n % ALIGN:
            return False, f"K={p.k} and N={p.n} must be multiples of {ALIGN}"
        if p.m == 0:
            return False, "M=0"
        if p.a.data_ptr() % ALIGN or p.b.data_ptr() % ALIGN:
            return False, f"a and b data pointers must be {ALIGN}-byte aligned (a view at an odd offset)"
        return True, "per-tensor / row-wise scales, 16-aligned K and N"

    def run(self, problem: GemmProblem) -> torch.Tensor:
        p = problem
        row = SCALE_ROW in (p.scale_a_kind, p.scale_b_kind)
        if row:
            # torch._scaled_mm takes both scales row-wise ([M,1] and [1,N]) or both per-tensor;
            # a per-tensor side is broadcast.
            sa = p.scale_a.float().reshape(-1, 1).expand(p.m, 1).contiguous()
            sb = p.scale_b.float().reshape(1, -1).expand(1, p.n).contiguous()
        else:
            sa, sb = p.scale_a.float().reshape(()), p.scale_b.float().reshape(())
        # Fuse the bias only when that loses nothing: cuBLASLt takes a bf16/fp16 bias of the output
        # dtype. Otherwise multiply into fp32, add the bias in fp32, and round once at the end.
        fuse = p.bias is not None and p.bias.dtype == p.out_dtype and p.out_dtype in FUSED_BIAS_DTYPES
        want = p.out_dtype if p.bias is None or fuse else torch.float32
        out = _scaled_mm(p, sa, sb, p.bias if fuse else None, want, row)
        if p.bias is not None and not fuse:
            out = out.float() + p.bias.float()
        return out.to(p.out_dtype)


#: Bias dtypes cuBLASLt's FP8 epilogue adds (it refuses a bias with fp32 output).
FUSED_BIAS_DTYPES = (torch.bfloat16, torch.float16)
#: Output dtype that every torch._scaled_mm build writes for row-wise scales.
ROWWISE_SAFE_DTYPE = torch.bfloat16
#: (device, out_dtype, fused bias) combinations of row-wise scales this torch refused.
_rowwise_refused: set[tuple[str, torch.dtype, bool]] = set()


def _scaled_mm(p: GemmProblem, sa, sb, bias, out_dtype: torch.dtype, row: bool) -> torch.Tensor:
    """``torch._scaled_mm`` in ``out_dtype``. Older torch / cuBLAS builds write row-wise results in
    bf16 only: such a refusal is remembered per device and the product is written in bf16 instead
    (the bias, if any, then added in fp32 afterwards)."""
    key = (str(p.device), out_dtype, bias is not None)
    if not row or out_dtype == ROWWISE_SAFE_DTYPE or key not in _rowwise_refused:
        try:
            return torch._scaled_mm(p.a, p.b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            if not row or out_dtype == ROWWISE_SAFE_DTYPE:
                raise
            _rowwise_refused.add(key)
    out = torch._scaled_mm(p.a, p.b.t(), scale_a=sa, scale_b=sb, out_dtype=ROWWISE_SAFE_DTYPE)
    return out if bias is None else out.float() + bias.float()
