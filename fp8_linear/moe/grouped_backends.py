"""The built-in backends of :func:`fp8_linear.grouped_fp8_gemm` (contract: ``fp8_linear/grouped_gemm.py``).

- ``sm90_grouped``: our grouped Hopper kernel (``fp8_linear/moe/sm90_grouped.py``): one launch, no
  host sync, fp8 (e4m3 / e5m2), per-tensor / per-token x per-expert / per-channel scales, any output.
- ``torch_grouped``: ``torch._scaled_grouped_mm``, PyTorch's grouped FP8 GEMM (one launch for all
  experts; Hopper and Blackwell; e4m3 x e4m3, per-tensor / per-row scales, bf16 output, FP32
  accumulation with ``use_fast_accum=False``).
- ``per_expert``: one dense GEMM per expert that has rows, through the dense dispatcher
  (:func:`fp8_linear.gemm.run_problem`: sm90 -> cuBLASLt -> emulated). Takes every problem; on a
  CPU it is the emulated reference, on a GPU the per-expert ``torch._scaled_mm`` loop.

Any other backend goes in front of them with :func:`fp8_linear.grouped_gemm.register_grouped_backend`.
"""

from __future__ import annotations

import torch

from ..gemm import make_problem, run_problem
from ..grouped_gemm import A_ROW, A_TENSOR, B_CHANNEL, B_TENSOR, GroupedBackend, GroupedProblem
from .sm90_grouped import SM90_GROUPED

#: Compute capability majors on which torch ships ``_scaled_grouped_mm`` kernels (sm90, sm100).
TORCH_GROUPED_MAJORS = (9, 10)
#: Byte alignment of row strides and base pointers the grouped CUTLASS kernels need.
ALIGN = 16


class PerExpertBackend(GroupedBackend):
    """A loop over experts, each a dense :class:`~fp8_linear.backends.base.GemmProblem` (one host sync
    to read the offsets)."""

    name = "per_expert"

    def supports(self, device):
        return True, "runs anywhere (one dense GEMM per expert)"

    def can_run(self, problem):
        return True, "takes every problem"

    def run(self, p: GroupedProblem) -> torch.Tensor:
        out = torch.zeros((p.m, p.n), dtype=p.out_dtype, device=p.device)
        start = 0
        for e, end in enumerate(p.offsets.tolist()):
            if end <= start:
                continue
            sa = p.scale_a if p.scale_a_kind == A_TENSOR else p.scale_a[start:end]  # aligned by cublaslt where needed
            bias = None if p.bias is None else p.bias[e]
            dense = make_problem(p.a[start:end], p.b[e], sa, p.expert_scale_b(e), bias, p.out_dtype, check_values=False)
            out[start:end] = run_problem(dense)
            start = end
        return out


class TorchGroupedBackend(GroupedBackend):
    """``torch._scaled_grouped_mm`` with row-wise scales (per-tensor ones broadcast)."""

    name = "torch_grouped"

    def supports(self, device):
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"needs a CUDA device, got {device.type}"
        if not hasattr(torch, "_scaled_grouped_mm"):
            return False, "this torch has no torch._scaled_grouped_mm"
        cc = torch.cuda.get_device_capability(device)
        if cc[0] not in TORCH_GROUPED_MAJORS:
            return False, f"torch's grouped FP8 kernels need compute capability 9.x or 10.x, device has {cc[0]}.{cc[1]}"
        return True, f"compute capability {cc[0]}.{cc[1]}"

    def can_run(self, p: GroupedProblem):
        if p.a.dtype != torch.float8_e4m3fn or p.b.dtype != torch.float8_e4m3fn:
            return False, f"needs e4m3 x e4m3, got {p.a.dtype} x {p.b.dtype}"
        if p.out_dtype != torch.bfloat16:
            return False, f"writes bf16 only, asked for {p.out_dtype}"
        if p.scale_a_kind not in (A_TENSOR, A_ROW) or p.scale_b_kind not in (B_TENSOR, B_CHANNEL):
            return False, f"scales {p.scale_a_kind}/{p.scale_b_kind} are not per-tensor or per-row"
        if p.k % ALIGN or p.n % ALIGN:
            return False, f"K={p.k} and N={p.n} must be multiples of {ALIGN}"
        if p.b.stride(0) % ALIGN or p.a.data_ptr() % ALIGN or p.b.data_ptr() % ALIGN:
            return False, f"a and b must start {ALIGN}-byte aligned with {ALIGN}-byte expert strides"
        return True, "e4m3, per-tensor / per-row scales, bf16 out, 16-aligned K and N"

    def run(self, p: GroupedProblem) -> torch.Tensor:
        e, m, n = p.num_experts, p.m, p.n
        sa = p.scale_a.expand(m) if p.scale_a_kind == A_TENSOR else p.scale_a.reshape(m)
        sb = p.scale_b.reshape(e, 1).expand(e, n) if p.scale_b_kind == B_TENSOR else p.scale_b
        offs = p.offsets.to(torch.int32)
        out = torch._scaled_grouped_mm(p.a, p.b.transpose(-2, -1), sa.contiguous(), sb.contiguous(), offs=offs,
                                       out_dtype=torch.bfloat16, use_fast_accum=False)
        rows = torch.arange(m, device=p.device, dtype=torch.int32)
        if p.bias is not None:
            owner = torch.searchsorted(offs, rows, right=True).clamp_(max=e - 1)
            out = (out.float() + p.bias[owner].float()).to(torch.bfloat16)
        # rows past offsets[-1] are left unwritten by the kernel: zero them (no host sync)
        return out.masked_fill_((rows >= offs[-1]).unsqueeze(-1), 0)


PER_EXPERT = PerExpertBackend()
TORCH_GROUPED = TorchGroupedBackend()
#: The built-in order after any registered backend.
BUILTIN_BACKENDS = (SM90_GROUPED, TORCH_GROUPED, PER_EXPERT)
