"""benchmarks/e2e.py end to end on small models of the same architectures (``--tiny --device cpu``):
every path runs, the JSON holds every measurement, a forced backend that cannot run is a row with its
reason, and the greedy-token comparison is recorded."""

from __future__ import annotations

import json

import pytest

from benchmarks import e2e


@pytest.mark.slow
def test_tiny_run_writes_every_measurement(tmp_path, capsys):
    rc = e2e.main(["--tiny", "--device", "cpu", "--models", "llama3-8b", "--batches", "2", "--new-tokens", "3",
                   "--prompt", "8", "--prefill", "16", "--reps", "1", "--presets", "fp8-dynamic",
                   "--cublaslt", "fp8-dynamic", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("e2e-*.json")).read_text())
    rows = {r["path"]: r for r in doc["rows"]}
    assert set(rows) >= {"bf16", "fp8-dynamic ours", "fp8-dynamic cublaslt"}
    assert "needs a CUDA device" in rows["fp8-dynamic cublaslt"]["error"]
    ours = rows["fp8-dynamic ours"]
    assert ours["backends"] == ["emulated"] and ours["prefill_tok_s"] > 0
    for r in (ours, rows["bf16"]):  # the prefill forward split into its linear layers and the rest
        assert 0 < r["prefill_linear_ms"] and r["prefill_rest_ms"] == pytest.approx(r["prefill_ms"] - r["prefill_linear_ms"])
    assert e2e.prefill_ceiling(ours, rows["bf16"]) == pytest.approx(
        rows["bf16"]["prefill_ms"] / (rows["bf16"]["prefill_rest_ms"] + ours["prefill_linear_ms"]))
    cell = ours["decode"]["2"]
    for mode in ("eager", "compiled"):
        assert cell[mode]["decode_tok_s"] > 0 and cell[mode]["ttft_ms"] > 0
    assert cell["linear_ms"] > 0 and cell["same_tokens_rows"].endswith("/2")
    assert ours["linear_weight_gb"] < rows["bf16"]["linear_weight_gb"]
    assert any("2 of 2" in n or "torchao" in n for n in doc["meta"]["notes"])
    out = capsys.readouterr().out
    assert "fp8-dynamic ours" in out and "prefill of 16 tokens: forward ms = linear layers" in out


@pytest.mark.slow
def test_skip_guards_cells_are_recorded_and_printed(tmp_path, capsys):
    """``--skip-guards``: each compiled cell also has its timing under
    ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, with the same tokens as with every guard, and
    the report prints them. On a CPU transformers does not compile ``generate``, so this checks the option's
    path through the script (the stance, the timings, the token comparison, the table), not dynamo's guards."""
    rc = e2e.main(["--tiny", "--device", "cpu", "--models", "llama3-8b", "--batches", "2", "--new-tokens", "3",
                   "--prompt", "8", "--prefill", "16", "--reps", "1", "--presets", "fp8-tensor", "--cublaslt", "",
                   "--no-torchao", "--skip-eager", "--skip-guards", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("e2e-*.json")).read_text())
    for row in doc["rows"]:
        sg = row["decode"]["2"]["compiled"]["skip_guards"]
        assert sg["decode_tok_s"] > 0 and sg["same_tokens_as_guarded"] is True, row["path"]
    assert "guards skipped (torch.compiler.set_stance" in capsys.readouterr().out


def test_prefill_ceiling():
    """BF16's forward over BF16's rest plus the path's linear layers; None where a split is missing."""
    base = dict(prefill_ms=100.0, prefill_linear_ms=70.0, prefill_rest_ms=30.0)
    assert e2e.prefill_ceiling(dict(prefill_linear_ms=70.0 / 1.8), base) == pytest.approx(100.0 / (30.0 + 70.0 / 1.8))
    assert e2e.prefill_ceiling(dict(prefill_linear_ms=None), base) is None
    assert e2e.prefill_ceiling(dict(prefill_linear_ms=35.0), dict(base, prefill_rest_ms=None)) is None
