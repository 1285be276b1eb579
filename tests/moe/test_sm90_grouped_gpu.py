"""GPU tests of the grouped sm90 kernel (``fp8_linear/kernels/include/sm90_grouped.cuh``, backend ``sm90_grouped``)
against fp64 math on the dequantized inputs, expert by expert.

Bars (docs/design.md section 7): calc_diff <= 1.05 x the error of rounding the exact result to the output
dtype + 1e-8. Outputs are NaN-poisoned before each launch: every row must come back finite (rows past
the last expert as zeros). Routing mixes experts with 0, 1 and many tokens; N and K are ragged
(K % 16 == 0); every token tile (16 / 32 / 64 / 128) runs every case, with per-token x per-channel scales
and with block scales (1x128 token groups x 128x128 weight blocks per expert; more of them in
test_sm90_grouped_block_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a CUDA device of compute capability 9.0", allow_module_level=True)

from helpers import KERNEL_FLOOR, calc_diff, random_fp8, random_scale, rounding_bar  # noqa: E402
from test_grouped_gemm import COUNTS, _case, _scale_a, _scale_b, reference64  # noqa: E402

from fp8_linear.backends.sm90 import extension  # noqa: E402
from fp8_linear.grouped_gemm import (  # noqa: E402
    grouped_fp8_gemm, grouped_fp8_gemm_unchecked, make_grouped_problem, offsets_from_counts, select_grouped_backend,
)
from fp8_linear.moe.sm90_grouped import BLOCK_NS, MAX_EXPERTS, SM90_GROUPED, Sm90GroupedBackend  # noqa: E402

pytestmark = pytest.mark.gpu

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
DEV = "cuda"
#: Routings: empty / single / many-row experts; one row each (decode); one expert with everything.
ROUTINGS = [COUNTS, (1,) * 8, (0, 0, 300, 0), (200, 0, 0, 1)]
#: Scale layouts every launch test runs: per-token x per-channel, and 1x128 groups x 128x128 blocks.
KINDS = [("row", "channel"), ("group", "block")]


def _launch(p, bn: int, offsets=None, scale_a=None) -> torch.Tensor:
    """The kernel into a NaN-poisoned output (so unwritten rows show)."""
    out = torch.full((p.m, p.n), float("nan"), dtype=p.out_dtype, device=DEV)
    extension().grouped_gemm_out(p.a, p.b, p.scale_a if scale_a is None else scale_a, p.scale_b.contiguous(),
                                 p.offsets if offsets is None else offsets, p.bias, out, bn)
    torch.cuda.synchronize()
    return out


def _check(out, ref, out_dtype, what=""):
    assert torch.isfinite(out).all(), f"unwritten or non-finite values {what}"
    bar = rounding_bar(ref, out_dtype, KERNEL_FLOOR)
    d = calc_diff(out.float().cpu(), ref)
    assert d <= bar, f"calc_diff {d:.3g} > bar {bar:.3g} {what}"


@pytest.mark.parametrize("bn", BLOCK_NS)
@pytest.mark.parametrize("counts", ROUTINGS)
@pytest.mark.parametrize("a_kind,b_kind", [("row", "channel"), ("tensor", "tensor"), ("row", "tensor"),
                                           ("tensor", "channel"), ("group", "block")])
def test_matches_fp64_every_tile_and_routing(bn, counts, a_kind, b_kind):
    n, k = 200, 1040  # N: a partial 128-row weight block; K: a partial 128-wide k-block
    a, b, sa, sb, offsets = _case(counts, n, k, a_kind, b_kind, device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    assert SM90_GROUPED.can_run(p)[0]
    ref = reference64(a, b, sa, sb, counts, a_kind, b_kind)
    _check(_launch(p, bn), ref, torch.bfloat16, f"bn={bn}")


@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("bn", BLOCK_NS)
@pytest.mark.parametrize("n,k", [(16, 16), (72, 48), (128, 128), (136, 272), (1536, 2048), (2048, 768), (4104, 144)])
def test_ragged_and_model_shapes(bn, n, k, kinds):
    counts = (3, 0, 1, 17, 0, 64, 2, 33)
    a, b, sa, sb, offsets = _case(counts, n, k, *kinds, device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    _check(_launch(p, bn), reference64(a, b, sa, sb, counts, *kinds), torch.bfloat16, f"{n}x{k}")


@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bn", [16, 128])
def test_output_dtypes_bias_and_the_sentinel_tail(out_dtype, bias_dtype, bn, kinds):
    counts = (5, 0, 40, 1)
    a, b, sa, sb, offsets = _case(counts, 96, 256, *kinds, device=DEV, tail=7)
    bias = None if bias_dtype is None else torch.randn(4, 96, device=DEV).to(bias_dtype)
    p = make_grouped_problem(a, b, sa, sb, offsets, bias=bias, out_dtype=out_dtype)
    out = _launch(p, bn)
    assert torch.equal(out[46:].cpu(), torch.zeros(7, 96, dtype=out_dtype)), "rows past the last expert"
    ref = reference64(a, b, sa, sb, counts, *kinds, bias)
    _check(out[:46], ref[:46], out_dtype)


@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("fa,fb", [(E4, E5), (E5, E4), (E5, E5)])
def test_e5m2_operands(fa, fb, kinds):
    counts = (9, 0, 1, 70)
    m, e, n, k = sum(counts), len(counts), 144, 400
    a, b = random_fp8((m, k), fa, DEV), random_fp8((e, n, k), fb, DEV)
    sa, sb = _scale_a(kinds[0], m, k, DEV), _scale_b(kinds[1], e, n, k, DEV)
    offsets = offsets_from_counts(torch.tensor(counts, device=DEV))
    p = make_grouped_problem(a, b, sa, sb, offsets)
    for bn in (32, 128):
        _check(_launch(p, bn), reference64(a, b, sa, sb, counts, *kinds), torch.bfloat16, f"bn={bn}")


def test_int64_offsets_and_a_strided_expert_view():
    """``gate_up_proj[:, I:]``-style views (experts apart in memory, offset base) and int64 offsets."""
    counts = (4, 0, 130, 1)
    a, fused, sa, _, _ = _case(counts, 256, 512, "row", "tensor", device=DEV)
    view = fused[:, 128:]
    sb = random_scale((4,), DEV)
    offsets = torch.cumsum(torch.tensor(counts, device=DEV), 0)  # int64
    p = make_grouped_problem(a, view, sa, sb, offsets)
    assert SM90_GROUPED.can_run(p)[0]
    ref = reference64(a, view.contiguous(), sa, sb, counts, "row", "tensor")
    for bn in BLOCK_NS:
        _check(_launch(p, bn), ref, torch.bfloat16, f"bn={bn}")


def test_qwen3_moe_decode_and_prefill_routing():
    """128 experts, top-8: one decode token (8 experts with 1 row) and a 256-token prefill."""
    e, n, k = 128, 1536, 2048
    b = random_fp8((e, n, k), E4, DEV)
    sb = random_scale((e, n, 1), DEV)
    for tokens in (1, 256):
        idx = torch.stack([torch.randperm(e)[:8] for _ in range(tokens)])
        counts = torch.bincount(idx.reshape(-1), minlength=e).tolist()
        m = sum(counts)
        a, sa = random_fp8((m, k), E4, DEV), random_scale((m, 1), DEV)
        p = make_grouped_problem(a, b, sa, sb, offsets_from_counts(torch.tensor(counts, device=DEV)))
        assert select_grouped_backend(p).name == "sm90_grouped"
        ref = reference64(a, b, sa, sb, counts, "row", "channel")
        _check(grouped_fp8_gemm(a, b, sa, sb, p.offsets), ref, torch.bfloat16, f"tokens={tokens} (auto tile)")


@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("bn", BLOCK_NS)
def test_bitwise_repeatable(bn, kinds):
    a, b, sa, sb, offsets = _case(COUNTS, 200, 1040, *kinds, device=DEV)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    first = _launch(p, bn)
    for _ in range(3):
        assert torch.equal(_launch(p, bn), first)


def test_no_rows_at_all_and_all_rows_past_the_experts():
    a, b, sa, sb, offsets = _case((0, 0, 0), 64, 128, "row", "tensor", device=DEV, tail=5)
    p = make_grouped_problem(a, b, sa, sb, offsets)
    assert torch.equal(_launch(p, 16).cpu(), torch.zeros(5, 64, dtype=torch.bfloat16))


def test_the_default_dispatch_picks_it_and_refuses_what_it_cannot_run():
    a, b, sa, sb, offsets = _case((3, 4), 64, 128, "row", "channel", device=DEV)
    assert select_grouped_backend(make_grouped_problem(a, b, sa, sb, offsets)).name == "sm90_grouped"
    a, b, sa, sb, offsets = _case((3, 4), 256, 384, "group", "channel", device=DEV)
    ok, why = SM90_GROUPED.can_run(make_grouped_problem(a, b, sa, sb, offsets))
    assert not ok and "group/channel" in why
    many = make_grouped_problem(random_fp8((4, 32), E4, DEV), random_fp8((MAX_EXPERTS + 1, 16, 32), E4, DEV),
                                random_scale((1,), DEV), random_scale((MAX_EXPERTS + 1,), DEV),
                                torch.full((MAX_EXPERTS + 1,), 4, dtype=torch.int32, device=DEV))
    assert not SM90_GROUPED.can_run(many)[0] and select_grouped_backend(many).name != "sm90_grouped"
    with pytest.raises(ValueError, match="block_n"):
        Sm90GroupedBackend(block_n=48)


@pytest.mark.parametrize("kinds", KINDS)
def test_cuda_graph_capture_and_compiled_fullgraph_are_bitwise_eager(kinds):
    counts = (2, 0, 9, 1)
    a, b, sa, sb, offsets = _case(counts, 256, 512, *kinds, device=DEV)
    eager = grouped_fp8_gemm_unchecked(a, b, sa, sb, offsets)
    fn = torch.compile(grouped_fp8_gemm_unchecked, fullgraph=True)
    assert torch.equal(fn(a, b, sa, sb, offsets), eager)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grouped_fp8_gemm_unchecked(a, b, sa, sb, offsets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grouped_fp8_gemm_unchecked(a, b, sa, sb, offsets)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    # new routing, same shapes: the replay reads the new offsets on the device
    offsets.copy_(offsets_from_counts(torch.tensor((0, 12, 0, 0), device=DEV)))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, grouped_fp8_gemm_unchecked(a, b, sa, sb, offsets))
