"""The per-expert ``torch._scaled_mm`` loop of ``benchmarks/moe_loop.py`` (the grouped GEMM's 1.3x peer),
on a CPU: which experts it calls, the operand and scale layouts torch takes, 16-byte aligned scale pointers
(cuBLASLt's outer-vector scaling refuses others), and its result against fp64 math on the dequantized
inputs. The GPU run of the same loop is ``python -m benchmarks.moe_bench --skip-model``."""

from __future__ import annotations

import pytest
import torch

from benchmarks.moe_loop import BLOCK_M_ALIGN, SCALE_ALIGN, ScaledMMLoop, aligned, expert_spans, loop_plan
from fp8_linear.grouped_gemm import grouped_fp8_gemm, offsets_from_counts
from fp8_linear.backends.cublaslt import aligned_scale
from helpers import KERNEL_FLOOR, calc_diff, random_fp8, random_scale, rounding_bar
from test_grouped_gemm import COUNTS, _scale_a, _scale_b, reference64

FP8 = torch.float8_e4m3fn
#: Rows of no expert after the last one (expert-parallel sentinels): the loop leaves them zero.
TAIL = 3


def _operands(kind: str, counts=COUNTS, n=48, k=272):
    e, m = len(counts), sum(counts) + TAIL
    a, b = random_fp8((m, k), FP8), random_fp8((e, n, k), FP8)
    sa = random_scale((e,)) if kind == "tensor" else _scale_a("row" if kind == "channel" else "group", m, k)
    sb = _scale_b(kind, e, n, k)
    ends = torch.cumsum(torch.tensor(counts), 0).tolist()
    return a, b, sa, sb, ends


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_expert_spans_skip_experts_without_rows():
    assert expert_spans([0, 1, 38, 38, 43]) == [(1, 0, 1), (2, 1, 38), (4, 38, 43)]
    assert expert_spans([0, 0]) == []
    with pytest.raises(ValueError, match="non-decreasing"):
        expert_spans([4, 2])


def test_the_routing_has_experts_whose_scale_rows_start_unaligned():
    """What broke the loop on the H200: slices of one [M, 1] scale tensor at odd row offsets."""
    _, _, sa, _, ends = _operands("channel")
    starts = [s for _, s, _ in expert_spans(ends)]
    assert any(not aligned(sa[s:]) for s in starts), "the case must contain the failure it guards against"


@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_plan_calls_every_expert_with_rows_in_torchs_layouts_with_aligned_scales(kind):
    a, b, sa, sb, ends = _operands(kind)
    e, n, k = b.shape
    out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16)
    calls = loop_plan(a, b, sa, sb, ends, kind, out)
    assert [(c.expert, c.start, c.end) for c in calls] == expert_spans(ends)
    assert len(calls) == sum(1 for c in COUNTS if c)
    for c in calls:
        rows = c.end - c.start
        assert c.b.shape == (k, n) and c.b.stride() == (1, k), "mat2 must be the expert's weight column-major"
        assert c.b.data_ptr() == b[c.expert].data_ptr(), "the weight is a view, not a copy"
        assert c.scale_a.dtype == c.scale_b.dtype == torch.float32
        assert aligned(c.scale_a) and aligned(c.scale_b) and aligned(c.a), f"expert {c.expert}: unaligned pointer"
        if kind == "tensor":
            assert c.scale_a.dim() == 0 and float(c.scale_a) == float(sa[c.expert])
            assert c.scale_b.dim() == 0 and float(c.scale_b) == float(sb[c.expert])
        elif kind == "channel":
            assert c.scale_a.shape == (rows, 1) and c.scale_a.is_contiguous() and torch.equal(c.scale_a, sa[c.start:c.end])
            assert c.scale_b.shape == (1, n) and c.scale_b.is_contiguous() and torch.equal(c.scale_b[0], sb[c.expert, :, 0])
        if kind != "block":
            assert _same_bits(c.a, a[c.start:c.end]) and c.out.data_ptr() == out[c.start].data_ptr()
            continue
        padded = -(-rows // BLOCK_M_ALIGN) * BLOCK_M_ALIGN
        assert c.a.shape == (padded, k) and _same_bits(c.a[:rows], a[c.start:c.end])
        assert not c.a[rows:].float().any(), "padding rows must be zero"
        assert c.scale_a.shape == (padded, sa.shape[1]) and c.scale_a.stride() == (1, padded), "scale_a column-major"
        assert torch.equal(c.scale_a[:rows], sa[c.start:c.end]) and bool((c.scale_a[rows:] == 1).all())
        kb = sb.shape[2]
        assert torch.equal(c.scale_b.t()[:, :kb], sb[c.expert]), "scale_b: our [Nb, Kb] blocks, transposed"


@pytest.mark.parametrize("kind", ["tensor", "channel"])
def test_loop_through_torch_scaled_mm_matches_fp64_and_the_grouped_gemm(kind):
    a, b, sa, sb, ends = _operands(kind, n=48, k=64)
    loop = ScaledMMLoop(a, b, sa, sb, ends, kind)
    out = loop()
    assert loop.mode == "out=", "torch._scaled_mm writes the rows in place"
    assert out is loop.result() and out.shape == (a.shape[0], b.shape[1])
    assert not out[-TAIL:].float().any(), "rows past the last expert stay zero"
    owner = torch.repeat_interleave(torch.arange(len(COUNTS)), torch.tensor(COUNTS))
    rows_a = sa[owner].unsqueeze(-1) if kind == "tensor" else sa[: owner.numel()]
    rows_a = torch.cat([rows_a, torch.ones(TAIL, 1)])  # the grouped call's per-row scales (the tail is no expert's)
    ref = reference64(a, b, rows_a, sb, COUNTS, "row", kind)
    assert calc_diff(out, ref) <= rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)
    grouped = grouped_fp8_gemm(a, b, rows_a, sb, offsets_from_counts(torch.tensor(COUNTS)))
    assert calc_diff(out, grouped) <= 2 * rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)


def test_plan_rejects_an_unknown_kind_and_a_wrong_number_of_ends():
    a, b, sa, sb, ends = _operands("channel")
    with pytest.raises(ValueError, match="kind"):
        loop_plan(a, b, sa, sb, ends, "row")
    with pytest.raises(ValueError, match="cumulative row ends"):
        loop_plan(a, b, sa, sb, ends[:-1], "channel")


def test_per_expert_scale_rows_reach_cublaslt_aligned():
    """The grouped fallback slices the same [M, 1] scales per expert; the cuBLASLt backend it reaches copies a
    slice that is unaligned and keeps an aligned one a view."""
    sa = random_scale((40, 1))
    for start in range(9):
        rows = aligned_scale(sa[start:start + 5])
        assert rows.data_ptr() % SCALE_ALIGN == 0 and torch.equal(rows, sa[start:start + 5])
        if sa[start:].data_ptr() % SCALE_ALIGN == 0:
            assert rows.data_ptr() == sa[start:].data_ptr(), "an aligned slice stays a view"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_gpu_loop_runs_with_experts_at_unaligned_rows_and_matches_fp64(kind):
    """On the device: cuBLASLt takes every call (experts starting at rows 1, 38, 43, 173), the rows are the
    fp64 result's within the kernel bar, and the grouped GEMM's within twice that."""
    a, b, sa, sb, ends = (t.cuda() if isinstance(t, torch.Tensor) else t for t in _operands(kind, n=256, k=512))
    layout = "padded"
    if kind == "block":
        from fp8_linear.backends.cublaslt import _block_layout

        ok, why, layout = _block_layout(a.device)
        if not ok:
            pytest.skip(f"this torch / cuBLAS runs no block-scaled scaled_mm: {why}")
    loop = ScaledMMLoop(a, b, sa, sb, ends, kind, block_layout=layout)
    loop()
    out = loop.result()
    assert kind == "block" or loop.mode == "out="
    owner = torch.repeat_interleave(torch.arange(len(COUNTS)), torch.tensor(COUNTS)).cuda()
    if kind == "tensor":
        rows_a = torch.cat([sa[owner].unsqueeze(-1), torch.ones(TAIL, 1, device="cuda")])
    else:
        rows_a = sa
    ref = reference64(a, b, rows_a, sb, COUNTS, {"tensor": "row", "channel": "row", "block": "group"}[kind], kind)
    bar = rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)
    assert calc_diff(out.cpu(), ref) <= bar
    assert not out[-TAIL:].float().any()
    grouped = grouped_fp8_gemm(a, b, rows_a, sb, offsets_from_counts(torch.tensor(COUNTS, device="cuda")))
    assert calc_diff(out, grouped) <= 2 * bar
