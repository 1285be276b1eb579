"""benchmarks/prefill_profile.py: the per-kernel differences against BF16, and the script end to end on a
tiny model on the CPU (no GPU kernels there, so every figure is zero; the GPU run is in docs/performance.md)."""

from __future__ import annotations

import json

from benchmarks import prefill_profile as pp


def test_differences_rank_by_absolute_change_and_count_missing_names_as_zero():
    base = dict(names={"gemm": 100.0, "norm": 10.0, "gone": 5.0})
    row = dict(names={"gemm": 60.0, "norm": 12.0, "quant": 20.0})
    got = pp.differences(row, base, top=3)
    assert [(d["name"], d["us"]) for d in got] == [("gemm", -40.0), ("quant", 20.0), ("gone", -5.0)]


def test_tiny_cpu_run_writes_every_path(tmp_path):
    assert pp.main(["--tiny", "--device", "cpu", "--layers", "1", "--tokens", "16", "--reps", "1", "--fuse",
                    "--presets", "fp8-tensor", "--out", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("prefill-profile-*.json")
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["bf16", "fp8-tensor+fused"]
    assert all(r["busy_us"] == 0.0 and r["idle_us"] == 0.0 for r in rows)
