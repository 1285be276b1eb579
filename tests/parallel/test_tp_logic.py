"""The sharding rules of fp8_linear.parallel without processes: slices, block alignment, typed errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8_linear.errors import ShapeError
from fp8_linear.parallel import check_block_split, parallelize_linear, shard_range, tensor_parallelize


def test_shard_range_splits_evenly():
    assert [shard_range(512, r, 4, "n") for r in range(4)] == [(0, 128), (128, 256), (256, 384), (384, 512)]


def test_shard_range_refuses_uneven():
    with pytest.raises(ShapeError, match="does not divide evenly over 3 ranks"):
        shard_range(512, 0, 3, "out_features")


@pytest.mark.parametrize("size,world", [(256, 2), (128, 2), (128, 4), (1024, 8)])
def test_block_split_accepts_whole_or_inner_blocks(size, world):
    check_block_split(size, world, "out_features")


@pytest.mark.parametrize("size,world", [(384, 2), (960, 4)])
def test_block_split_refuses_cut_blocks(size, world):
    with pytest.raises(ShapeError, match="would cut 128-wide scale blocks"):
        check_block_split(size, world, "in_features")


def test_needs_initialized_process_group():
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        tensor_parallelize(nn.Sequential(nn.Linear(4, 4)))


def test_style_is_checked():
    with pytest.raises(ValueError, match="'column' or 'row'"):
        parallelize_linear(nn.Linear(4, 4), "diagonal")
