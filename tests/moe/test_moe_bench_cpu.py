"""``benchmarks.moe_bench``'s compiled model part on the CPU (the full-depth device command's path at toy size):
transformers' compiled static-cache decode with inductor, BF16 against fp8-dynamic with q/k/v fused, one graph
each and no break, the per-model rows (build and compile seconds) kept after each model."""

from __future__ import annotations

import json

import pytest

from benchmarks.moe_bench import SCHEME_CHOICES, main


@pytest.mark.slow
def test_compiled_model_part_runs_on_cpu_and_keeps_each_model(tmp_path, capsys):
    rc = main(["--tiny", "--compile", "--compiled-only", "--skip-gemm", "--layers", "1", "--prefill", "8",
               "--new-tokens", "3", "--reps", "2", "--schemes", "bf16,fp8-dynamic+fused", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "moe-partial.json").read_text())
    assert [r["model"] for r in rows] == ["bf16", "fp8-dynamic+fused grouped"]
    for r in rows:
        assert r["compiled"] and r["layers"] == 1
        assert (r["graph_breaks"], r["graphs"]) == (0, 1), r
        assert r["build_s"] >= 0 and r["first_generate_s"] > 0 and r["dynamo_s"] > 0
        assert r["decode_step_ms"] > 0 and r["elapsed_s"] >= r["first_generate_s"]
    assert "fp8-dynamic+fused: fused" in capsys.readouterr().out  # the fusion report's first line
    assert len(list(tmp_path.glob("moe-*-tiny.json"))) == 1


def test_schemes_are_checked():
    assert "fp8-dynamic+fused" in SCHEME_CHOICES
    with pytest.raises(SystemExit):
        main(["--tiny", "--skip-gemm", "--schemes", "bf16,fp8-nope"])
