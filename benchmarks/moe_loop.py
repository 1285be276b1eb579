"""The per-expert ``torch._scaled_mm`` loop: the peer of the grouped FP8 GEMM's 1.3x bar (docs/moe.md).

One dense FP8 GEMM per expert that has rows, on the same FP8 operands and scales as the grouped call.
Everything a loop can prepare ahead is prepared outside the timed calls (which favours the loop): the
offsets read on the host once, experts without rows dropped, each expert's scales as its own tensor in
the layout ``torch._scaled_mm`` takes, and the output rows written in place (``out=``).

Why each expert's scales are copies: on compute capability 9.0 with cuBLAS >= 12.9, torch (since
pytorch/pytorch#157905) runs row-wise scales through cuBLASLt's outer-vector scaling, which needs 16-byte
aligned scale pointers. torch does not check, and cuBLASLt answers ``CUBLAS_STATUS_NOT_SUPPORTED``
(pytorch/pytorch#159957). A row slice ``scale_a[s:t]`` of one ``[M, 1]`` fp32 tensor starts ``4 * s``
bytes in, so every expert whose first row is not a multiple of 4 failed: the loop's error on the H200 (torch 2.11, CUDA 13), for the
bare call and for the package's cuBLASLt call alike (``.contiguous()`` of a contiguous slice is the slice).

Scale kinds (``kind``), the grouped contract's shapes on the way in:

========== =================================== =============================== ==================================
kind       ``scale_a``                         ``scale_b``                     per-expert call
========== =================================== =============================== ==================================
tensor     fp32 ``[E]``: one static activation fp32 ``[E]``                    tensorwise: 0-dim x 0-dim
           scale per expert
channel    fp32 ``[M, 1]`` per token           fp32 ``[E, N, 1]`` per channel  row-wise: ``[rows, 1]`` x ``[1, N]``
block      fp32 ``[M, ceil(K/128)]`` groups    fp32 ``[E, ceil(N/128),         ``scaled_mm`` BlockWise1x128 x
                                               ceil(K/128)]``                  BlockWise128x128
========== =================================== =============================== ==================================

Block calls take the package's cuBLASLt layouts (``fp8_linear.backends.cublaslt``): tokens padded with
zero rows to a multiple of :data:`BLOCK_M_ALIGN` (cuBLASLt refuses M = 1 there; the column-major
``scale_a``'s leading dimension is the row count), ``scale_b`` in the layout the device's probe found;
their outputs are one buffer per expert (``scaled_mm`` has no ``out=``), not gathered into one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8_linear.backends.cublaslt import SCALE_ALIGN_BYTES as SCALE_ALIGN  # cuBLASLt's scale-pointer alignment
#: Block calls: rows padded to a multiple of this (as ``fp8_linear.backends.cublaslt.BLOCK_M_ALIGN``).
BLOCK_M_ALIGN = 4
KINDS = ("tensor", "channel", "block")


def aligned(t: torch.Tensor) -> bool:
    """Whether ``t`` starts on a :data:`SCALE_ALIGN`-byte boundary."""
    return t.data_ptr() % SCALE_ALIGN == 0


def own_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a fresh contiguous allocation (the allocators start every allocation 64-byte aligned or more)."""
    return t.contiguous().clone()


@dataclass
class ExpertCall:
    """One expert's dense GEMM: rows ``start:end`` of the sorted tokens.

    a: FP8 ``[rows, K]`` (block: ``[round_up(rows, 4), K]``, zero rows appended); b: FP8 ``[K, N]``
    column-major (the expert's ``[N, K]`` transposed, no copy); scale_a / scale_b: fp32 in the layouts of
    the module table; out: ``[rows, N]`` view of the loop's output (block: None, written per call).
    """

    expert: int
    start: int
    end: int
    a: torch.Tensor
    b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out: torch.Tensor | None


def expert_spans(ends: list[int]) -> list[tuple[int, int, int]]:
    """``(expert, start, end)`` of every expert with rows, from the cumulative row ends (``offsets`` on the host)."""
    spans, start = [], 0
    for e, end in enumerate(ends):
        if end < start:
            raise ValueError(f"ends: expected non-decreasing cumulative row ends, got {end} after {start} at expert {e}")
        if end > start:
            spans.append((e, start, end))
        start = end
    return spans


def _block_scale_b(sb: torch.Tensor, layout: str) -> torch.Tensor:
    from fp8_linear.backends.cublaslt import _block_scale_b as package_layout

    return package_layout(own_copy(sb), layout)


def loop_plan(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, ends: list[int],
              kind: str, out: torch.Tensor | None = None, block_layout: str = "padded") -> list[ExpertCall]:
    """The calls of the loop: ``a`` ``[M, K]`` FP8 sorted by expert, ``b`` ``[E, N, K]`` FP8, scales of
    ``kind`` (module table), ``ends`` the experts' cumulative row ends (host ints), ``out`` ``[M, N]`` the
    output the tensor / channel calls write into (block: unused), ``block_layout`` the ``scale_b`` layout
    of block calls (``fp8_linear.backends.cublaslt.BLOCK_B_LAYOUTS``). ``ValueError`` for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    e, n, k = b.shape
    if len(ends) != e:
        raise ValueError(f"ends: expected {e} cumulative row ends (one per expert), got {len(ends)}")
    calls = []
    for x, s, t in expert_spans(ends):
        bt = b[x].t()  # [K, N] column-major: the layout torch._scaled_mm wants for mat2
        if kind == "tensor":
            sa, sb = own_copy(scale_a[x].reshape(())), own_copy(scale_b[x].reshape(()))
        elif kind == "channel":
            sa, sb = own_copy(scale_a[s:t].reshape(t - s, 1)), own_copy(scale_b[x].reshape(1, n))
        else:
            rows = -(-(t - s) // BLOCK_M_ALIGN) * BLOCK_M_ALIGN
            ax = a.new_zeros((rows, k))
            ax[: t - s] = a[s:t]
            sax = scale_a.new_ones((rows, scale_a.shape[1]))
            sax[: t - s] = scale_a[s:t]
            calls.append(ExpertCall(x, s, t, ax, bt, sax.t().contiguous().t(), _block_scale_b(scale_b[x], block_layout), None))
            continue
        calls.append(ExpertCall(x, s, t, a[s:t], bt, sa, sb, None if out is None else out[s:t]))
    return calls


class ScaledMMLoop:
    """The loop as a callable: ``loop()`` runs every expert's GEMM and returns the ``[M, N]`` output
    (block: the list of per-expert outputs; :meth:`result` gathers them, outside any timing).

    Rows of no expert (past the last end) stay zero, as the grouped GEMM writes them. The tensor / channel
    calls write in place with ``out=``; where a torch refuses that, the loop falls back (once, for good)
    to assigning each result into its rows, and :attr:`mode` says which ran.
    """

    def __init__(self, a, b, scale_a, scale_b, ends: list[int], kind: str, out_dtype: torch.dtype = torch.bfloat16,
                 block_layout: str = "padded"):
        self.kind, self.out_dtype, self.m, self.n = kind, out_dtype, a.shape[0], b.shape[1]
        self.out = torch.zeros((self.m, self.n), dtype=out_dtype, device=a.device)
        self.calls = loop_plan(a, b, scale_a, scale_b, ends, kind, self.out, block_layout)
        self.mode = "scaled_mm block" if kind == "block" else "out="
        self.block_outs: list[torch.Tensor] = []

    def _block(self):
        from torch.nn.functional import ScalingType, scaled_mm

        self.block_outs = [scaled_mm(c.a, c.b, c.scale_a, ScalingType.BlockWise1x128, c.scale_b,
                                     ScalingType.BlockWise128x128, output_dtype=self.out_dtype) for c in self.calls]
        return self.block_outs

    def __call__(self):
        if self.kind == "block":
            return self._block()
        if self.mode == "out=":
            try:
                for c in self.calls:
                    torch._scaled_mm(c.a, c.b, scale_a=c.scale_a, scale_b=c.scale_b, out_dtype=self.out_dtype, out=c.out)
                return self.out
            except (RuntimeError, TypeError):
                self.mode = "assign"
        for c in self.calls:
            c.out.copy_(torch._scaled_mm(c.a, c.b, scale_a=c.scale_a, scale_b=c.scale_b, out_dtype=self.out_dtype))
        return self.out

    def result(self) -> torch.Tensor:
        """The ``[M, N]`` output of the last call (block outputs gathered into their rows)."""
        if self.kind != "block":
            return self.out
        out = torch.zeros((self.m, self.n), dtype=self.out_dtype, device=self.out.device)
        for c, y in zip(self.calls, self.block_outs):
            out[c.start:c.end] = y[: c.end - c.start]
        return out


__all__ = ["BLOCK_M_ALIGN", "ExpertCall", "KINDS", "SCALE_ALIGN", "ScaledMMLoop", "aligned", "expert_spans",
           "loop_plan", "own_copy"]
