"""The ``emulated`` backend: dequantize to fp32 and matmul. Any device; the numerical reference."""

from __future__ import annotations

import torch

from ..quantize import expand_scale
from .base import Backend, GemmProblem


class EmulatedBackend(Backend):
    """Dequantize both operands (exactly, in fp32) and multiply in fp32 (fp64 on request for tests)."""

    name = "emulated"

    def supports(self, device: torch.device) -> tuple[bool, str]:
        return True, "runs anywhere"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        return True, "takes every problem"

    def run(self, problem: GemmProblem) -> torch.Tensor:
        a = problem.a.to(torch.float32) * expand_scale(problem.scale_a, problem.a.shape)
        b = problem.b.to(torch.float32) * expand_scale(problem.scale_b, problem.b.shape)
        out = a @ b.t()
        if problem.bias is not None:
            out = out + problem.bias.to(torch.float32)
        return out.to(problem.out_dtype)
