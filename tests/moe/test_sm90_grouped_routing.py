"""CPU tests of what the grouped sm90 backend accepts and refuses (``fp8_linear/moe/sm90_grouped.py``), of the
group-scale layout the grouped problem keeps, and of the sorted tokens' 1x128 quantization off sm90.

``can_run`` reads only shapes, dtypes, strides and alignment, so these run on CPU tensors; the kernel's
numerics are in test_sm90_grouped_gpu.py / test_sm90_grouped_block_gpu.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from fp8_linear.grouped_gemm import grouped_fp8_gemm, make_grouped_problem, select_grouped_backend
from fp8_linear.moe.sm90_grouped import MAX_EXPERTS, SM90_GROUPED, quantize_groups
from fp8_linear.ops import quantize_dynamic
from helpers import BLOCK, EMULATED_FLOOR, calc_diff, random_fp8, random_scale, rounding_bar
from test_grouped_gemm import COUNTS, _case, reference64

E4 = torch.float8_e4m3fn


def _problem(a_kind, b_kind, n=200, k=1040, counts=(3, 0, 4)):
    return make_grouped_problem(*_case(counts, n, k, a_kind, b_kind))


@pytest.mark.parametrize("a_kind", ["group", "row", "tensor"])
def test_block_weights_are_accepted_with_any_activation_scale(a_kind):
    ok, why = SM90_GROUPED.can_run(_problem(a_kind, "block"))
    assert ok and "128x128 weight blocks" in why


@pytest.mark.parametrize("b_kind", ["tensor", "channel"])
def test_groups_without_blocks_are_refused_with_the_reason(b_kind):
    ok, why = SM90_GROUPED.can_run(_problem("group", b_kind))
    assert not ok and f"group/{b_kind}" in why and "pair only with 128x128 weight blocks" in why


def test_block_problems_that_break_tma_or_the_expert_limit_are_refused():
    ok, why = SM90_GROUPED.can_run(_problem("group", "block", k=40))
    assert not ok and "K=40 is not a multiple of 16" in why
    e = MAX_EXPERTS + 1
    many = make_grouped_problem(random_fp8((4, 128), E4), random_fp8((e, 16, 128), E4), random_scale((4, 1)),
                                random_scale((e, 1, 1)), torch.full((e,), 4, dtype=torch.int32))
    ok, why = SM90_GROUPED.can_run(many)
    assert not ok and f"{e} experts" in why


def test_on_a_cpu_block_problems_go_to_the_per_expert_reference():
    ok, why = SM90_GROUPED.supports(torch.device("cpu"))
    assert not ok and "CUDA" in why
    p = _problem("group", "block")
    assert select_grouped_backend(p).name == "per_expert"


def test_the_problem_keeps_an_m_major_group_scale_without_a_copy():
    """The layout act_quant writes on sm90 (strides (1, round_up(M, 4))) reaches the kernel as it is."""
    a, b, sa, sb, offsets = _case(COUNTS, 200, 1040, "group", "block")
    m, kb = sa.shape
    buf = torch.empty(kb, -(-m // 4) * 4)
    buf[:, :m] = sa.t()
    mm = buf[:, :m].t()
    p = make_grouped_problem(a, b, mm, sb, offsets)
    assert p.scale_a.data_ptr() == mm.data_ptr() and p.scale_a.stride() == mm.stride()
    ref = reference64(a, b, sa, sb, COUNTS, "group", "block")
    out = grouped_fp8_gemm(a, b, mm, sb, offsets)
    assert calc_diff(out, ref) <= rounding_bar(ref, torch.bfloat16, EMULATED_FLOOR)


@pytest.mark.parametrize("rows,k", [(1, 48), (7, 1040), (130, 256)])
def test_quantize_groups_off_sm90_is_the_dynamic_group_quantization(rows, k):
    x = torch.randn(rows, k, dtype=torch.bfloat16) * 3
    q, s = quantize_groups(x, E4)
    q_ref, s_ref = quantize_dynamic(x, E4, "group")
    assert s.shape == (rows, math.ceil(k / BLOCK))
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
