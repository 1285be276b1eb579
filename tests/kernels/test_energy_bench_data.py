"""CPU tests of benchmarks/energy_bench.py's operand kinds (``--data``; the measurement needs a GPU)."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import energy_bench  # noqa: E402


@pytest.mark.parametrize("kind", energy_bench.DATA_KINDS)
def test_operand_is_e4m3_of_the_asked_shape(kind):
    x = energy_bench.make_operand(64, 48, kind, device="cpu")
    assert x.dtype == torch.float8_e4m3fn and x.shape == (64, 48) and x.is_contiguous()


def test_operand_values_per_kind():
    torch.manual_seed(0)
    scaled = energy_bench.make_operand(256, 128, "scaled", device="cpu").float()
    assert scaled.abs().max().item() == energy_bench.E4M3_MAX  # the largest magnitude lands on 448
    assert torch.all(energy_bench.make_operand(8, 16, "ones", device="cpu").float() == 1.0)
    assert torch.all(energy_bench.make_operand(8, 16, "zeros", device="cpu").float() == 0.0)
    randn = energy_bench.make_operand(256, 128, "randn", device="cpu").float()
    assert 0.8 < randn.std().item() < 1.2 and randn.abs().max().item() < 8.0


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown data kind"):
        energy_bench.make_operand(8, 16, "uniform", device="cpu")
