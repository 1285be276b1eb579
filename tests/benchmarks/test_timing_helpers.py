"""The CPU-side helpers of benchmarks/common/timing.py (the timing itself needs a GPU)."""

from __future__ import annotations

import math

import pytest

from benchmarks.common import timing as T


def test_paired_cost_is_mean_of_per_round_ratios():
    # round 1: 1.1 / 1.0, round 2: 1.5 / 1.25 -> mean of 1.1 and 1.2, minus one
    assert T.paired_cost([1.1, 1.5], [1.0, 1.25]) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="equally long"):
        T.paired_cost([1.0], [1.0, 2.0])


def test_geomean_skips_what_did_not_run():
    assert T.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert T.geomean([2.0, float("nan"), 8.0, 0.0]) == pytest.approx(4.0)
    assert math.isnan(T.geomean([]))


def test_round_statistics_of_a_failed_candidate_are_nan():
    assert T.best([3.0, 1.0, 2.0]) == 1.0 and T.median([3.0, 1.0, 2.0]) == 2.0 and T.median([1.0, 2.0]) == 1.5
    assert math.isnan(T.best("RuntimeError: x")) and math.isnan(T.median([]))


def test_rounds_alternate_order_and_record_failures():
    seen = []

    def fails():
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")

    times = T._run_rounds({"a": lambda: None, "b": lambda: None, "c": fails}, 3,
                          lambda name, fn: (seen.append(name), fn(), 1.0)[2])
    assert seen == ["a", "b", "c", "b", "a", "a", "b"]  # c failed once and is not run again
    assert times["a"] == [1.0, 1.0, 1.0] and times["c"].startswith("RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED")


def test_parse_env_sweep_reads_name_and_values():
    assert T.parse_env_sweep("FP8_LINEAR_SM90_GROUP_M=8, 16,32") == ("FP8_LINEAR_SM90_GROUP_M", ["8", "16", "32"])


@pytest.mark.parametrize("bad", ["NOVALUES", "A=", "A=1,,2", "=1,2", "1A=3"])
def test_parse_env_sweep_rejects_malformed(bad):
    with pytest.raises(ValueError, match="NAME=v1"):
        T.parse_env_sweep(bad)
