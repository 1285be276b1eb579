"""The benchmarks' JSON writer (benchmarks/common/results.py): a real file, read back."""

from __future__ import annotations

import json

import pytest

from benchmarks.common.results import environment, write_json


def test_write_json_round_trip(tmp_path):
    meta = environment({"mode": "decode"})
    assert meta["mode"] == "decode" and meta["torch"] and meta["date"].endswith("+00:00")
    rows = [{"M": 1, "us": {"ours": 5.0, "cublas_t": float("nan")}}]
    path = write_json("gemm-decode", meta, {"M=1": {"x": float("inf")}}, rows, out=tmp_path, tag="quick")
    assert path.parent == tmp_path and path.name.startswith("gemm-decode-") and path.name.endswith("-quick.json")
    doc = json.loads(path.read_text())  # strict JSON: NaN / inf written as null
    assert doc["rows"][0]["us"] == {"ours": 5.0, "cublas_t": None} and doc["summary"]["M=1"]["x"] is None
    assert doc["meta"]["command"].startswith("python -m ")


@pytest.mark.parametrize("name, tag", [("gemm/x", ""), ("", ""), ("gemm", "a b")])
def test_write_json_refuses_odd_names(tmp_path, name, tag):
    with pytest.raises(ValueError, match="name|tag"):
        write_json(name, {}, {}, [], out=tmp_path, tag=tag)
