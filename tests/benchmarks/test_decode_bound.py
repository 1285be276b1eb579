"""benchmarks/decode_bound.py on the committed H200 decode set: the ideal kernel's time is a lower bound of
every measured time, so the best possible ratio bounds the measured one, and the fractions are at most 1."""

from __future__ import annotations

import json

import pytest

from benchmarks import decode_bound as db


def _rows():
    return json.loads(db.DEFAULT_FILE.read_text())["rows"]


def test_bytes_per_problem():
    # FP8 weight 4096 x 4096 and activation 1 x 4096 once, bf16 output 1 x 4096
    assert db.gemm_bytes(1, 4096, 4096) == 4096 * 4096 + 4096 + 2 * 4096


def test_bound_is_below_every_measured_time():
    rows = _rows()
    res = db.bound(rows)
    bw = db.COPY_TBPS * 1e6  # bytes per us
    slack = [t - res["floor_us"] - db.gemm_bytes(r["M"], r["N"], r["K"]) / bw
             for r in rows for t in (r["us"]["ours"], r["us"]["cublas_t"])]
    assert min(slack) == pytest.approx(0.0, abs=1e-9)  # the floor is some kernel's fixed cost
    assert 0.5 < res["floor_us"] < 5.0  # a launch inside a CUDA graph, not noise
    assert res["best_tbps"] <= db.COPY_TBPS
    for m, p in res["per_m"].items():
        measured = db.geomean(r["us"]["cublas_t"] / r["us"]["ours"] for r in rows if r["M"] == m)
        assert p["best_possible"] >= measured, m
        assert 0 < p["ours_of_ideal"] <= 1 and 0 < p["cublas_of_ideal"] <= 1, m
        assert p["bar_needs_of_ideal"] == pytest.approx(db.BAR_SMALL_M / p["best_possible"])
        assert p["shapes"] == 37 and 0 <= p["impossible"] <= p["shapes"]


def test_bound_needs_both_columns():
    with pytest.raises(ValueError, match="no row has both"):
        db.bound([{"M": 1, "N": 8, "K": 16, "us": {"ours": 3.0}}])


def test_main_prints_each_m(capsys, tmp_path):
    assert db.main([]) == 0
    out = capsys.readouterr().out
    assert "floor" in out and all(f"\n{m:>5} " in out for m in (1, 16, 64, 128))
    with pytest.raises(SystemExit, match="no such file"):
        db.main([str(tmp_path / "missing.json")])
