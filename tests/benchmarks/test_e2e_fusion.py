"""benchmarks/e2e.py ``--fuse --no-fuse`` on a small model of the 8B architecture (``--tiny --device cpu``):
both rows of an FP8 path run, the fused row times the fused GEMMs a forward launches (4 a decoder layer
instead of 7), and the model is unfused again for the next path."""

from __future__ import annotations

import json

import pytest

from benchmarks import e2e
from benchmarks.common.random_model import TINY


@pytest.mark.slow
def test_fused_and_unfused_rows(tmp_path):
    rc = e2e.main(["--tiny", "--device", "cpu", "--models", "llama3-8b", "--batches", "2", "--new-tokens", "3",
                   "--prompt", "8", "--prefill", "16", "--reps", "1", "--presets", "fp8-dynamic", "--cublaslt", "",
                   "--no-torchao", "--skip-eager", "--fuse", "--no-fuse", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("e2e-*.json")).read_text())
    rows = {r["path"]: r for r in doc["rows"]}
    assert set(rows) == {"bf16", "fp8-dynamic ours", "fp8-dynamic ours fused"}, rows.keys()
    layers = TINY["num_hidden_layers"]
    plain, fused = rows["fp8-dynamic ours"], rows["fp8-dynamic ours fused"]
    assert plain["linear_calls"] == 7 * layers and fused["linear_calls"] == 4 * layers
    assert fused["fusion"] == dict(groups=2 * layers, skipped=[])
    assert fused["linear_weight_gb"] == plain["linear_weight_gb"]  # the members' weights are views: no copy
    cell = fused["decode"]["2"]
    assert cell["compiled"]["decode_tok_s"] > 0 and cell["linear_ms"] > 0
    assert cell["same_tokens_rows"].endswith("/2")
