"""benchmarks/common/budget.py: a compiled cell starts only while the slowest compile so far (the first
guess before any) fits in what is left, with the reserve kept."""

from __future__ import annotations

import time

import pytest

from benchmarks.common.budget import Budget


def test_no_budget_allows_everything():
    b = Budget(None, first_guess_s=1e9)
    b.compiled(1e9)
    assert b.left() == float("inf") and b.allows_compile()


def test_first_guess_then_the_slowest_compile_decides():
    b = Budget(100.0, first_guess_s=60.0, reserve_s=30.0)
    assert b.allows_compile()  # ~100 s left > 60 + 30
    b.compiled(20.0)
    assert b.allows_compile() and b.slowest == 20.0
    b.compiled(10.0)  # a faster compile does not lower the estimate
    assert b.slowest == 20.0
    b.compiled(75.0)  # 75 + 30 > ~100 s left
    assert not b.allows_compile()
    assert "--budget-s 100" in b.why() and "75 s" in b.why()


def test_time_runs_out():
    b = Budget(0.2, first_guess_s=0.0, reserve_s=0.0)
    assert b.allows_compile()
    time.sleep(0.25)
    assert b.left() < 0 and not b.allows_compile()
    assert "0 s left" in b.why()


@pytest.mark.parametrize("kw", [dict(seconds=0.0, first_guess_s=1.0), dict(seconds=-5.0, first_guess_s=1.0),
                                dict(seconds=10.0, first_guess_s=-1.0), dict(seconds=10.0, first_guess_s=1.0, reserve_s=-1.0)])
def test_bad_values_raise(kw):
    with pytest.raises(ValueError):
        Budget(**kw)


def test_a_baseline_asks_room_for_two():
    b = Budget(100.0, first_guess_s=40.0, reserve_s=10.0)
    assert b.allows_compile(1) and b.allows_compile(2)  # 40 + 10, 80 + 10 < ~100
    b.compiled(50.0)
    assert b.allows_compile(1) and not b.allows_compile(2)  # 60 < ~100 < 110
    with pytest.raises(ValueError):
        b.allows_compile(0)


def test_a_slow_path_does_not_starve_the_others():
    # torchao compiled in 122 s at batch 1 on an H200 where ours took 38-47 s; at the next batch size
    # each path is estimated by its own compiles, so ours still run where torchao's would not fit
    b = Budget(200.0, first_guess_s=45.0, reserve_s=20.0)
    for path, s in (("bf16", 32.0), ("fp8-tensor ours fused", 38.0), ("torchao float8 rowwise", 122.0)):
        b.compiled(s, path)
    b.t0 -= 40.0  # ~160 s left
    assert b.allows_compile(2, "bf16") and b.allows_compile(1, "fp8-tensor ours fused")
    assert not b.allows_compile(2, "torchao float8 rowwise")
    assert b.estimate("a new path") == 122.0 and b.estimate() == 122.0  # unknown: the slowest of any
    assert "torchao float8 rowwise's compile took up to 122 s" in b.why("torchao float8 rowwise")
