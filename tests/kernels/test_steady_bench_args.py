"""CPU tests of benchmarks/steady_bench.py's argument helpers (the timing itself needs an sm90 GPU)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import steady_bench  # noqa: E402


def test_parse_shapes_reads_mxnxk_lists():
    assert steady_bench.parse_shapes("6144x6144x1280, 8192X4096x4096") == [(6144, 6144, 1280), (8192, 4096, 4096)]


@pytest.mark.parametrize("bad", ["1x2", "0x8x16", "axbxc", "8x8x-16", "8x8x16,"])
def test_parse_shapes_rejects_malformed(bad):
    with pytest.raises(ValueError, match="MxNxK"):
        steady_bench.parse_shapes(bad)


def test_paired_cost_is_mean_of_per_round_ratios():
    # round 1: 1.1 / 1.0, round 2: 1.5 / 1.25 -> mean of 1.1 and 1.2, minus one
    assert steady_bench.paired_cost([1.1, 1.5], [1.0, 1.25]) == pytest.approx(0.15)


def test_parse_env_sweep_reads_name_and_values():
    assert steady_bench.parse_env_sweep("FP8_LINEAR_SM90_GROUP_M=8, 16,32") == ("FP8_LINEAR_SM90_GROUP_M", ["8", "16", "32"])


@pytest.mark.parametrize("bad", ["NOVALUES", "A=", "A=1,,2", "=1,2", "1A=3"])
def test_parse_env_sweep_rejects_malformed(bad):
    with pytest.raises(ValueError, match="NAME=v1"):
        steady_bench.parse_env_sweep(bad)
