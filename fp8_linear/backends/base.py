"""The GEMM backend interface (docs/design.md section 4).

A backend answers ``supports(device) -> (ok, reason)`` and ``can_run(problem) -> (ok, reason)``
and runs a validated :class:`GemmProblem`. The dispatcher (``fp8_linear.backends``) walks the
ordered list and takes the first backend that says yes to both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Scale kinds, read off the scale shapes by fp8_gemm's validation.
SCALE_TENSOR = "tensor"  # [1]
SCALE_ROW = "row"  # scale_a [M, 1] (per token) / scale_b [N, 1] (per channel)
SCALE_GROUP = "group"  # scale_a [M, ceil(K/128)] (1x128 groups)
SCALE_BLOCK = "block"  # scale_b [ceil(N/128), ceil(K/128)] (128x128 blocks)


@dataclass(frozen=True)
class GemmProblem:
    """A validated FP8 GEMM: ``out[m, n] = sum_k a[m, k] * b[n, k] * sa * sb + bias[n]``.

    a: ``[M, K]`` float8_e4m3fn / float8_e5m2, K-contiguous.
    b: ``[N, K]`` float8_e4m3fn / float8_e5m2, K-contiguous (the nn.Linear weight layout).
    scale_a: fp32, ``[1]`` or ``[M, 1]`` (or ``[M, ceil(K/128)]`` groups).
    scale_b: fp32, ``[1]`` or ``[N, 1]`` (or ``[ceil(N/128), ceil(K/128)]`` blocks).
    bias: ``None`` or ``[N]`` (any float dtype; added in fp32).
    out_dtype: torch.bfloat16, torch.float16 or torch.float32.
    """

    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    scale_a_kind: str
    scale_b_kind: str

    @property
    def m(self) -> int:
        return self.a.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[0]

    @property
    def k(self) -> int:
        return self.a.shape[1]

    @property
    def device(self) -> torch.device:
        return self.a.device


class Backend:
    """One way to run an FP8 GEMM. Subclasses set ``name`` and implement the three methods."""

    name: str = "?"

    def supports(self, device: torch.device) -> tuple[bool, str]:
        """Whether this backend can run at all on ``device`` (hardware, build), with the reason."""
        raise NotImplementedError

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        """Whether this backend can run ``problem`` (shapes, dtypes, scale kinds), with the reason."""
        raise NotImplementedError

    def run(self, problem: GemmProblem) -> torch.Tensor:
        """Compute ``problem``; returns a new ``[M, N]`` tensor of ``problem.out_dtype``."""
        raise NotImplementedError
