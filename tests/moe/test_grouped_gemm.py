"""``grouped_fp8_gemm`` against fp64 math on the dequantized inputs (docs/design.md section 7), expert by expert.

Every case mixes experts with 0, 1 and many rows; the bar per expert-grouped output is the dense one:
``calc_diff <= 1.05 x (rounding the fp64 result to the output dtype) + floor``.
"""

from __future__ import annotations

import math

import pytest
import torch

from fp8_linear import ScaleError, ShapeError, fp8_gemm
from fp8_linear.grouped_gemm import (
    GroupedBackend, grouped_backends, grouped_candidates, grouped_fp8_gemm, grouped_fp8_gemm_unchecked,
    make_grouped_problem, offsets_from_counts, register_grouped_backend, unregister_grouped_backend,
)
from helpers import BLOCK, EMULATED_FLOOR, KERNEL_FLOOR, calc_diff, dequant64, random_fp8, random_scale, rounding_bar

FP8 = torch.float8_e4m3fn
#: Rows per expert: empty experts, single-row experts and many-row experts in one call.
COUNTS = (0, 1, 37, 0, 5, 130, 1, 0)


def _scale_b(kind: str, e: int, n: int, k: int, device="cpu") -> torch.Tensor:
    shape = {"tensor": (e,), "channel": (e, n, 1), "block": (e, math.ceil(n / BLOCK), math.ceil(k / BLOCK))}[kind]
    return random_scale(shape, device)


def _scale_a(kind: str, m: int, k: int, device="cpu") -> torch.Tensor:
    shape = {"tensor": (1,), "row": (m, 1), "group": (m, math.ceil(k / BLOCK))}[kind]
    return random_scale(shape, device)


def _expert_scale(sb: torch.Tensor, kind: str, e: int, n: int) -> tuple[torch.Tensor, str]:
    if kind == "tensor":
        return sb[e].reshape(1), "tensor"
    if kind == "channel":
        return sb[e].reshape(n, 1), "row"
    return sb[e], "block"


def reference64(a, b, sa, sb, counts, a_kind, b_kind, bias=None) -> torch.Tensor:
    """fp64 ``a[rows of e] @ b[e]^T`` per expert, zeros for rows past the last expert (independent of the package)."""
    m, n = a.shape[0], b.shape[1]
    out = torch.zeros(m, n, dtype=torch.float64)
    start = 0
    for e, c in enumerate(counts):
        if c:
            rows = slice(start, start + c)
            sa_e = sa if a_kind == "tensor" else sa[rows]
            kind_a = {"tensor": "tensor", "row": "row", "group": "group"}[a_kind]
            sb_e, kind_b = _expert_scale(sb, b_kind, e, n)
            out[rows] = dequant64(a[rows].cpu(), sa_e.cpu(), kind_a) @ dequant64(b[e].cpu(), sb_e.cpu(), kind_b).t()
            if bias is not None:
                out[rows] += bias[e].double().cpu()
        start += c
    return out


def _case(counts, n, k, a_kind, b_kind, device="cpu", tail=0, fmt=FP8):
    e, m = len(counts), sum(counts) + tail
    a = random_fp8((m, k), fmt, device)
    b = random_fp8((e, n, k), fmt, device)
    sa, sb = _scale_a(a_kind, m, k, device), _scale_b(b_kind, e, n, k, device)
    offsets = offsets_from_counts(torch.tensor(counts, device=device))
    return a, b, sa, sb, offsets


@pytest.mark.parametrize("a_kind,b_kind", [("tensor", "tensor"), ("row", "tensor"), ("row", "channel"),
                                           ("tensor", "channel"), ("group", "block"), ("row", "block")])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_matches_fp64_with_empty_single_and_many_row_experts(a_kind, b_kind, out_dtype):
    n, k = 72, 1040  # N not a multiple of 16; K with a ragged last 1x128 group / 128x128 block
    a, b, sa, sb, offsets = _case(COUNTS, n, k, a_kind, b_kind)
    bias = torch.randn(len(COUNTS), n)
    out = grouped_fp8_gemm(a, b, sa, sb, offsets, bias=bias, out_dtype=out_dtype)
    ref = reference64(a, b, sa, sb, COUNTS, a_kind, b_kind, bias)
    assert out.shape == (sum(COUNTS), n) and out.dtype == out_dtype
    assert calc_diff(out, ref) <= rounding_bar(ref, out_dtype, EMULATED_FLOOR)


def test_rows_past_the_last_offset_are_zero_and_e5m2_works():
    a, b, sa, sb, offsets = _case((3, 0, 4), 48, 64, "row", "channel", tail=5, fmt=torch.float8_e5m2)
    out = grouped_fp8_gemm(a, b, sa, sb, offsets, out_dtype=torch.float32)
    assert torch.equal(out[7:], torch.zeros(5, 48))
    ref = reference64(a, b, sa, sb, (3, 0, 4), "row", "channel")
    assert calc_diff(out[:7], ref[:7]) <= rounding_bar(ref[:7], torch.float32)


def test_each_expert_equals_the_dense_gemm_bitwise():
    a, b, sa, sb, offsets = _case(COUNTS, 64, 256, "row", "channel")
    out = grouped_fp8_gemm(a, b, sa, sb, offsets)
    start = 0
    for e, c in enumerate(COUNTS):
        if c:
            dense = fp8_gemm(a[start:start + c], b[e], sa[start:start + c], sb[e].reshape(-1, 1))
            assert torch.equal(out[start:start + c], dense), f"expert {e}"
        start += c


def test_no_tokens_at_all_and_one_expert():
    a, b, sa, sb, offsets = _case((0, 0, 0), 32, 48, "row", "tensor")
    assert grouped_fp8_gemm(a, b, sa, sb, offsets).shape == (0, 32)
    a, b, sa, sb, offsets = _case((9,), 32, 48, "tensor", "tensor")
    ref = reference64(a, b, sa, sb, (9,), "tensor", "tensor")
    assert calc_diff(grouped_fp8_gemm(a, b, sa, sb, offsets), ref) <= rounding_bar(ref, torch.bfloat16)


def test_deterministic_run_to_run():
    a, b, sa, sb, offsets = _case(COUNTS, 72, 300, "group", "block")
    assert torch.equal(grouped_fp8_gemm(a, b, sa, sb, offsets), grouped_fp8_gemm(a, b, sa, sb, offsets))


def test_strided_expert_view_of_a_fused_weight():
    """``gate_up_proj[:, :I]`` (a view whose experts are apart in memory) is a valid ``b``."""
    a, fused, sa, _, offsets = _case((4, 0, 6), 64, 96, "row", "tensor")
    view = fused[:, :32]
    sb = random_scale((3,))
    out = grouped_fp8_gemm(a, view, sa, sb, offsets)
    ref = reference64(a, view.contiguous(), sa, sb, (4, 0, 6), "row", "tensor")
    assert calc_diff(out, ref) <= rounding_bar(ref, torch.bfloat16)


def test_traces_under_torch_compile_fullgraph():
    a, b, sa, sb, offsets = _case((2, 3, 0), 32, 64, "row", "channel")
    fn = torch.compile(grouped_fp8_gemm_unchecked, fullgraph=True, backend="eager")
    assert torch.equal(fn(a, b, sa, sb, offsets), grouped_fp8_gemm(a, b, sa, sb, offsets))


class _Counting(GroupedBackend):
    """A backend slotted in front (as a grouped kernel would be): runs the problem the fp64 way."""

    name = "test_slot"

    def __init__(self):
        self.calls = 0

    def supports(self, device):
        return True, "test"

    def can_run(self, problem):
        return problem.scale_b_kind == "tensor", "per-tensor only"

    def run(self, p):
        self.calls += 1
        counts = torch.diff(p.offsets, prepend=p.offsets.new_zeros(1)).tolist()
        return reference64(p.a, p.b, p.scale_a, p.scale_b, counts, p.scale_a_kind, p.scale_b_kind).to(p.out_dtype)


def test_a_registered_backend_runs_first_where_it_can():
    slot = _Counting()
    register_grouped_backend(slot)
    try:
        assert grouped_backends()[0] is slot
        a, b, sa, sb, offsets = _case((3, 4), 32, 64, "row", "tensor")
        grouped_fp8_gemm(a, b, sa, sb, offsets)
        assert slot.calls == 1
        a, b, sa, sb, offsets = _case((3, 4), 32, 64, "row", "channel")
        p = make_grouped_problem(a, b, sa, sb, offsets)
        verdicts = grouped_candidates(p)
        assert verdicts[0] == ("test_slot", False, "per-tensor only") and verdicts[-1][:2] == ("per_expert", True)
        grouped_fp8_gemm(a, b, sa, sb, offsets)
        assert slot.calls == 1
    finally:
        unregister_grouped_backend(slot.name)
    assert grouped_backends()[0] is not slot
    with pytest.raises(KeyError, match="test_slot"):
        unregister_grouped_backend(slot.name)
    with pytest.raises(TypeError, match="backend"):
        register_grouped_backend(object())


class _Refusing(GroupedBackend):
    """A backend whose library refuses at run time what ``can_run`` accepted."""

    name = "test_refusing"

    def __init__(self):
        self.calls = 0

    def supports(self, device):
        return True, "test"

    def can_run(self, problem):
        return True, "says yes"

    def run(self, p):
        self.calls += 1
        raise RuntimeError("unsupported case")


def test_a_backend_refusing_at_run_time_falls_back_once_and_is_remembered(caplog):
    slot = _Refusing()
    register_grouped_backend(slot)
    try:
        a, b, sa, sb, offsets = _case((3, 0, 4), 32, 64, "row", "channel")
        ref = reference64(a, b, sa, sb, (3, 0, 4), "row", "channel")
        with caplog.at_level("WARNING", logger="fp8_linear"):
            first = grouped_fp8_gemm(a, b, sa, sb, offsets)
        assert "test_refusing refused" in caplog.text and "unsupported case" in caplog.text
        assert torch.equal(first, grouped_fp8_gemm(a, b, sa, sb, offsets)) and slot.calls == 1
        assert calc_diff(first, ref) <= rounding_bar(ref, torch.bfloat16)
    finally:
        unregister_grouped_backend(slot.name)


@pytest.mark.parametrize("change,err,match", [
    (dict(offsets=torch.tensor([3, 2, 7], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(offsets=torch.tensor([3, 5, 9], dtype=torch.int32)), ValueError, "within"),
    (dict(offsets=torch.tensor([3, 7], dtype=torch.int32)), ShapeError, "offsets: expected shape"),
    (dict(offsets=torch.tensor([3.0, 5.0, 7.0])), TypeError, "offsets: expected dtype"),
    (dict(scale_b=torch.ones(3, 5)), ScaleError, "scale_b: expected shape"),
    (dict(scale_b=torch.tensor([1.0, 0.0, 1.0])), ScaleError, "scale_b: expected finite positive"),
    (dict(scale_a=torch.full((7, 1), float("nan"))), ScaleError, "scale_a: expected finite positive"),
    (dict(scale_a=torch.ones(6, 1)), ScaleError, "scale_a: expected shape"),
    (dict(b=torch.zeros(3, 32, 48, dtype=FP8)), ShapeError, "b: expected K=64"),
    (dict(b=torch.zeros(32, 64, dtype=FP8)), ShapeError, "b: expected a 3-D"),
    (dict(a=torch.zeros(7, 64)), TypeError, "a: expected dtype"),
    (dict(bias=torch.zeros(32)), ShapeError, "bias: expected shape"),
    (dict(out_dtype=torch.int32), TypeError, "out_dtype"),
])
def test_bad_inputs_raise_typed_errors_naming_the_argument(change, err, match):
    a, b, sa, sb, offsets = _case((3, 0, 4), 32, 64, "row", "tensor")
    args = dict(a=a, b=b, scale_a=sa, scale_b=sb, offsets=offsets)
    args.update(change)
    with pytest.raises(err, match=match):
        grouped_fp8_gemm(**args)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("a_kind,b_kind", [("row", "channel"), ("tensor", "tensor"), ("row", "tensor")])
@pytest.mark.parametrize("counts", [COUNTS, (1,) * 8, (0, 0, 512, 0)])
def test_gpu_grouped_backends_match_fp64(a_kind, b_kind, counts):
    from fp8_linear.moe.grouped_backends import PER_EXPERT, TORCH_GROUPED

    n, k = 256, 512
    a, b, sa, sb, offsets = _case(counts, n, k, a_kind, b_kind, device="cuda")
    ref = reference64(a, b, sa, sb, counts, a_kind, b_kind)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    for backend in (TORCH_GROUPED, PER_EXPERT):
        ok, why = backend.supports(a.device)
        if not ok:
            continue
        assert backend.can_run(p)[0]
        out = backend.run(p)
        assert calc_diff(out.cpu(), ref) <= rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR), backend.name


@pytest.mark.gpu
def test_gpu_torch_grouped_zeroes_the_sentinel_tail_and_adds_bias():
    from fp8_linear.moe.grouped_backends import TORCH_GROUPED

    if not TORCH_GROUPED.supports(torch.device("cuda"))[0]:
        pytest.skip(TORCH_GROUPED.supports(torch.device("cuda"))[1])
    counts = (5, 0, 3)
    a, b, sa, sb, offsets = _case(counts, 64, 128, "row", "channel", device="cuda", tail=4)
    bias = torch.randn(3, 64, device="cuda")
    out = TORCH_GROUPED.run(make_grouped_problem(a, b, sa, sb, offsets, bias=bias))
    ref = reference64(a, b, sa, sb, counts, "row", "channel", bias)
    assert torch.equal(out[8:].cpu(), torch.zeros(4, 64, dtype=torch.bfloat16))
    assert calc_diff(out.cpu(), ref) <= rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)
