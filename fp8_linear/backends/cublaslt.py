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
            # a per-tensor side is broadcast. Row-wise cuBLASLt writes bf16 only.
            sa = p.scale_a.float().reshape(-1, 1).expand(p.m, 1).contiguous()
            sb = p.scale_b.float().reshape(1, -1).expand(1, p.n).contiguous()
            mm_dtype = torch.bfloat16
        else:
            sa, sb = p.scale_a.float().reshape(()), p.scale_b.float().reshape(())
            mm_dtype = p.out_dtype
        fused_bias = p.bias is not None and not row and mm_dtype != torch.float32
        out = torch._scaled_mm(
            p.a, p.b.t(), scale_a=sa, scale_b=sb,
            bias=p.bias.to(mm_dtype) if fused_bias else None, out_dtype=mm_dtype,
        )
        if p.bias is not None and not fused_bias:
            out = out.float() + p.bias.float()
        return out.to(p.out_dtype)
