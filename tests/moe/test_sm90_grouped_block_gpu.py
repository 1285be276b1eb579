"""GPU tests of the grouped sm90 kernel with block scales (1x128 token groups x 128x128 weight blocks per
expert, the DeepSeek-V3 / Qwen3-FP8 layout) beyond the launch tests that test_sm90_grouped_gpu.py runs for
both scale layouts (every tile and routing, ragged N / K, dtypes, bias, e5m2, repeatability, graphs):
M-major (what act_quant writes, read without a copy) against row-major group scales (copied by the
binding), per-tensor / per-token activation scales with block weights, Qwen3-30B-A3B-FP8 shapes, the
sorted tokens' quantization and the fp8-block experts module on the kernel.

Bars (docs/design.md section 7): calc_diff <= 1.05 x the error of rounding the exact result to the output
dtype + 1e-8 against fp64 math on the dequantized inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a CUDA device of compute capability 9.0", allow_module_level=True)

from helpers import BLOCK, calc_diff, random_fp8, random_scale  # noqa: E402
from test_experts_module import ACTIVATION_STEPS, ALL_STEPS, _dequantized_twin, _routing, _unit_error  # noqa: E402
from test_experts_module import qwen3_experts  # noqa: E402
from test_grouped_gemm import COUNTS, _case, reference64  # noqa: E402
from test_sm90_grouped_gpu import ROUTINGS, _check, _launch  # noqa: E402

from fp8_linear.grouped_gemm import (  # noqa: E402
    grouped_fp8_gemm, make_grouped_problem, offsets_from_counts, register_grouped_backend, select_grouped_backend,
    unregister_grouped_backend,
)
from fp8_linear.moe.experts import FP8Experts  # noqa: E402
from fp8_linear.moe.grouped_backends import PER_EXPERT  # noqa: E402
from fp8_linear.moe.sm90_grouped import BLOCK_NS, SM90_GROUPED, quantize_groups  # noqa: E402
from fp8_linear.ops import quantize_dynamic  # noqa: E402

pytestmark = pytest.mark.gpu

E4 = torch.float8_e4m3fn
DEV = "cuda"


def m_major(s: torch.Tensor) -> torch.Tensor:
    """``s`` ``[M, kb]`` with the layout act_quant writes: strides ``(1, round_up(M, 4))``."""
    m, kb = s.shape
    buf = torch.full((kb, -(-m // 4) * 4), float("nan"), device=s.device)
    buf[:, :m] = s.t()
    return buf[:, :m].t()


@pytest.mark.parametrize("bn", BLOCK_NS)
@pytest.mark.parametrize("counts", ROUTINGS)
def test_m_major_and_row_major_group_scales_give_the_same_bits(bn, counts):
    n, k = 200, 1040  # N: a partial 128-row weight block; K: a partial 1x128 group / k-block
    a, b, sa, sb, offsets = _case(counts, n, k, "group", "block", device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    assert SM90_GROUPED.can_run(p)[0]
    ref = reference64(a, b, sa, sb, counts, "group", "block")
    row_major = _launch(p, bn)
    _check(row_major, ref, torch.bfloat16, f"bn={bn} row-major scale_a")
    mm = _launch(p, bn, scale_a=m_major(sa))
    assert torch.equal(mm, row_major), "the M-major and the copied row-major scales give other bits"


@pytest.mark.parametrize("bn", BLOCK_NS)
def test_expert_tiles_at_every_row_residue_with_a_padded_offset_m_major_scale(bn):
    """Expert tiles start at rows 0, 1, 2 and 3 mod 4 (the token-scale box is a TMA box, which must start
    16-byte aligned: the kernel reads it from the aligned row before the tile), scale_a an M-major view
    with a padded leading dimension, 16 bytes into a NaN-filled buffer (read in place, no copy)."""
    counts = (1, 2, 3, 5, 0, 7, 1, 9)  # first rows 0, 1, 3, 6, 11, 11, 18, 19
    n, k = 136, 400
    a, b, sa, sb, offsets = _case(counts, n, k, "group", "block", device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    m, kb = sa.shape
    ld = -(-m // 4) * 4 + 8
    buf = torch.full((kb * ld + 4,), float("nan"), device=DEV)
    view = buf[4:].as_strided((m, kb), (1, ld))
    view.copy_(sa)
    _check(_launch(p, bn, scale_a=view), reference64(a, b, sa, sb, counts, "group", "block"), torch.bfloat16,
           f"bn={bn}")


@pytest.mark.parametrize("a_kind", ["tensor", "row"])
def test_block_weights_with_a_per_tensor_or_per_token_activation_scale(a_kind):
    """Static / per-token activation scales with block weights (loaded checkpoints): spread over the groups."""
    a, b, sa, sb, offsets = _case(COUNTS, 200, 1040, a_kind, "block", device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    assert select_grouped_backend(p) is SM90_GROUPED
    _check(grouped_fp8_gemm(a, b, sa, sb, offsets), reference64(a, b, sa, sb, COUNTS, a_kind, "block"), torch.bfloat16)


def test_qwen3_moe_block_decode_and_prefill_routing():
    """Qwen3-30B-A3B-FP8's gate_up: 128 experts, top-8, N 1536, K 2048: one decode token and a 256-token prefill."""
    e, n, k = 128, 1536, 2048
    b = random_fp8((e, n, k), E4, DEV)
    sb = random_scale((e, n // BLOCK, k // BLOCK), DEV)
    for tokens in (1, 256):
        idx = torch.stack([torch.randperm(e)[:8] for _ in range(tokens)])
        counts = torch.bincount(idx.reshape(-1), minlength=e).tolist()
        m = sum(counts)
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        a, sa = quantize_groups(x, E4)
        offsets = offsets_from_counts(torch.tensor(counts, device=DEV))
        p = make_grouped_problem(a, b, sa, sb, offsets)
        assert select_grouped_backend(p).name == "sm90_grouped"
        ref = reference64(a, b, sa, sb, counts, "group", "block")
        _check(grouped_fp8_gemm(a, b, sa, sb, offsets), ref, torch.bfloat16, f"tokens={tokens} (auto tile)")


def test_block_dispatch_and_refusals():
    a, b, sa, sb, offsets = _case((3, 4), 256, 384, "group", "block", device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    assert select_grouped_backend(p).name == "sm90_grouped"
    ok, why = SM90_GROUPED.can_run(p)
    assert ok and "blocks" in why
    a, b, sa, sb, offsets = _case((3, 4), 256, 384, "group", "channel", device=DEV)
    ok, why = SM90_GROUPED.can_run(make_grouped_problem(a, b, sa, sb, offsets))
    assert not ok and "pair only with 128x128 weight blocks" in why
    a, b, sa, sb, offsets = _case((3, 4), 256, 40, "group", "block", device=DEV)
    ok, why = SM90_GROUPED.can_run(make_grouped_problem(a, b, sa, sb, offsets))
    assert not ok and "multiple of 16" in why


@pytest.mark.parametrize("rows", [1, 7, 130])
@pytest.mark.parametrize("k", [48, 1040])
def test_quantize_groups_is_the_triton_quantization_bitwise_with_m_major_scales(rows, k):
    x = torch.randn(rows, k, device=DEV, dtype=torch.bfloat16) * 3
    x[0, :5] = 0  # a partly zero group
    q, s = quantize_groups(x, E4)
    q_ref, s_ref = quantize_dynamic(x, E4, "group")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    assert s.shape == (rows, math.ceil(k / BLOCK)) and (rows == 1 or s.stride(0) == 1)


@pytest.mark.parametrize("inter", [96, 128])  # 96: gate and up are separate GEMMs (rows % 128 != 0)
@torch.no_grad()
def test_fp8_block_experts_run_on_sm90_grouped_and_match_the_per_expert_loop(inter):
    src = qwen3_experts(e=8, h=256, i=inter).cuda()
    x = torch.randn(200, 256, device=DEV)
    idx, w = _routing(200, 8, unused=(1,))
    idx, w = idx.cuda(), w.cuda()
    fp8 = FP8Experts.from_experts(src, "fp8-block")
    q, sa = quantize_groups(x, E4)
    even = offsets_from_counts(torch.full((8,), 25, device=DEV))
    gate = make_grouped_problem(q, fp8.gate_up_proj[:, :inter], sa, fp8.gate_up_proj_scale[:, 0], even)
    assert select_grouped_backend(gate) is SM90_GROUPED  # what the module's gate GEMM takes
    out = fp8(x, idx, w)
    register_grouped_backend(PER_EXPERT)  # the dense per-expert loop, for comparison
    try:
        loop = fp8(x, idx, w)
    finally:
        unregister_grouped_backend(PER_EXPERT.name)
    u = _unit_error(x.cpu())
    ref = _dequantized_twin(src, fp8)(x, idx, w)
    assert torch.isfinite(out).all()
    assert calc_diff(out, ref) < ACTIVATION_STEPS * u, (calc_diff(out, ref), u)
    assert calc_diff(out, src(x, idx, w)) < ALL_STEPS * u
    assert calc_diff(out, loop) < ACTIVATION_STEPS * u
