"""CPU tests of the block-scaled launches' logic: which scales read as fine-grained, which configs a
block-scaled problem gets, and that the Python table and the C++ instances agree. Nothing is compiled."""

from __future__ import annotations

import itertools

import pytest
import torch

import fp8_linear.kernels as kern
from fp8_linear.kernels import configs
from helpers import KERNEL_FLOOR
from tensor_core_model import block_floor, model_calc_diff

BLOCK_IDS = {c.id for c in configs.CONFIGS if c.block_scales}


@pytest.mark.parametrize("m, n, k, sa_shape, sb_shape, want", [
    (7, 200, 1040, (7, 9), (2, 9), True),        # ragged K and N: partial last group and block
    (1, 4096, 4096, (1, 32), (32, 32), True),     # M = 1
    (7, 300, 128, (7, 1), (3, 1), True),          # one k-block, three weight blocks
    (7, 100, 128, (7, 1), (1, 1), False),         # [M, 1] x [1, 1]: the per-row reading, the same product
    (7, 200, 1040, (7, 1), (200, 1), False),      # per-token x per-channel
    (7, 200, 1040, (7, 9), (200, 1), False),      # group scale_a with a per-channel scale_b: not a pair
    (7, 200, 1040, (7, 9), (2, 8), False),        # wrong block count along K
    (7, 200, 1040, (63,), (2, 9), False),         # flattened scale_a
])
def test_is_block_scaled(m, n, k, sa_shape, sb_shape, want):
    assert kern.is_block_scaled(torch.ones(sa_shape), torch.ones(sb_shape), m, n, k) is want


SWEEP = list(itertools.product([1, 7, 16, 17, 33, 64, 65, 129, 512, 2048, 8192],
                               [72, 200, 4104, 6144, 10240, 28672, 57344], [48, 1040, 4096, 16400]))


def test_block_choice_has_block_instances(monkeypatch):
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    for m, n, k in SWEEP:
        cfg = configs.select_config(m, n, k, block=True)
        assert cfg.block_scales, (m, n, k, cfg.id)
        assert not (cfg.swap_ab and cfg.block_n >= 128), (m, n, k, cfg.id)


def test_block_choice_is_the_per_tensor_model(monkeypatch):
    """Where the per-tensor choice (without the swapped twins) has block instances, block scales get the
    same config;
    a 64-row decode tile only where ROWS64_BLOCK lets block launches take them, and then the one of
    the most tiles in one wave; elsewhere the cheapest of the block candidates by the same cost model."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    for m, n, k in SWEEP:
        plain = configs._select_rows128(m, n, k, 132, False, False)
        blk = configs.select_config(m, n, k, block=True)
        if blk.block_m == 64:
            assert configs.ROWS64_BLOCK and m <= configs.ROWS64_MAX_M, (m, n, k, blk.id)
            assert blk is configs._rows64(m, n, 132), (m, n, k, blk.id)
        elif plain.block_scales:
            assert blk.id == plain.id, (m, n, k)
        else:
            costs = {cid: configs.estimated_cost(configs.CONFIG_BY_ID[cid], m, n, rel, 132, k, ov)
                     for cid, rel, ov in configs.BLOCK_LARGE_M_CANDIDATES}
            assert costs[blk.id] == min(costs.values()), (m, n, k, costs)


def test_config10_block_launches_take_a_block_candidate(monkeypatch):
    """Config 10 has no block instances: where the per-tensor choice is config 10, a block-scaled launch
    gets config 7 or 6 (the block candidates), and such shapes are in the sweep."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    assert not configs.CONFIG_BY_ID[10].block_scales
    assert {cid for cid, _, _ in configs.BLOCK_LARGE_M_CANDIDATES} == {7, 6}
    tens = [(m, n, k) for m, n, k in SWEEP if configs.select_config(m, n, k).id == 10]
    assert tens
    for m, n, k in tens:
        assert configs.select_config(m, n, k, block=True).id in (7, 6), (m, n, k)


def test_block_swap_ok_ignored():
    """A per-tensor-looking call never sends block scales to the swapped large-M configs."""
    cfg = configs.select_config(8192, 4096, 4096, swap_ok=True, block=True)
    assert cfg.block_scales and not cfg.swap_ab


def test_block_split_configs_split():
    """Decode shapes with long K still split K with block scales (the split instances exist for them)."""
    m, n, k = 16, 4096, 14336
    cfg = configs.select_config(m, n, k, block=True)
    assert cfg.split_k and configs.select_splits(cfg, m, n, k) > 1


def test_fake_impl_is_shape_only():
    """The op's fake (torch.compile) gives [M, N] of the out dtype for block scales too, on meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(7, 1040, dtype=torch.float8_e4m3fn, device="cuda")
        b = torch.empty(200, 1040, dtype=torch.float8_e4m3fn, device="cuda")
        out = torch.ops.fp8_linear.sm90_gemm(a, b, torch.empty(7, 9, device="cuda"), torch.empty(2, 9, device="cuda"),
                                             None, torch.float16, -1)
        assert tuple(out.shape) == (7, 200) and out.dtype == torch.float16


def test_tensor_core_model_gives_the_measured_floor():
    """The accumulation model behind the block tests' floor reproduces the tensor-core error measured on an
    H200 on a large output (cuBLASLt with FP32 promotion, fp32 out: 7.9e-9, docs/design.md section 7)."""
    d = model_calc_diff(64, 256, 1040, block=False, seed=0)
    assert 6e-9 <= d <= 9e-9, d


def test_block_floor_covers_small_outputs():
    """At M = 1, N = 72, K = 1040 with block scales the model's calc_diff exceeds the large-output floor
    1e-8 in some draws (the spread of a ratio of sums over 72 outputs), and block_floor covers every draw."""
    draws = [model_calc_diff(1, 72, 1040, block=True, seed=s) for s in range(40)]
    assert max(draws) > KERNEL_FLOOR, max(draws)
    assert max(draws) <= block_floor(72), (max(draws), block_floor(72))
