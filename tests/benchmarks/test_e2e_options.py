"""benchmarks/e2e.py's run plan: which batch sizes get an eager cell (``--eager-batches``), the order of
paths and of cells (``--order``), and a JSON that is whole on disk after every cell, so a run killed by
a time limit (SIGTERM, as ``timeout`` sends) keeps every cell it printed."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from benchmarks import e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv,batches,eager", [
    ([], [1, 16, 64], [1, 16, 64]),
    (["--skip-eager"], [1, 16, 64], []),
    (["--eager-batches", "1,16"], [1, 16, 64], [1, 16]),
    (["--eager-batches", ""], [1, 16, 64], []),
    (["--batches", "2,8", "--eager-batches", "8"], [2, 8], [8]),
    (["--quick"], [1, 16], [1, 16]),
])
def test_eager_batches(argv, batches, eager):
    args = e2e.parse_args(argv)
    assert (args.batches, args.eager_batches, args.order) == (batches, eager, "path")


@pytest.mark.parametrize("argv", [
    ["--eager-batches", "32"],                       # not one of --batches
    ["--skip-eager", "--eager-batches", "1"],        # contradictory
    ["--batches", "1,x"],
    ["--batches", "0"],
    ["--batches", ""],
    ["--order", "random"],
])
def test_bad_plans_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as err:
        e2e.parse_args(argv)
    assert err.value.code == 2 and "error" in capsys.readouterr().err


def test_paths_run_in_the_order_given():
    paths = e2e.plan_paths(["fp8-dynamic", "fp8-tensor"], on_ours=["fp8-dynamic", "fp8-tensor"],
                           on_cublaslt=["fp8-tensor"], fusions=[False, True], torchao=True)
    assert [p.label for p in paths] == [
        "bf16", "fp8-dynamic ours", "fp8-dynamic ours fused", "fp8-tensor ours", "fp8-tensor ours fused",
        "fp8-tensor cublaslt", "fp8-tensor cublaslt fused", "torchao float8 rowwise"]
    assert paths[5].backend == "cublaslt" and paths[4].backend is None and paths[4].fused
    only_fused = e2e.plan_paths(["fp8-channel"], ["fp8-channel"], [], [True], torchao=False)
    assert [p.label for p in only_fused] == ["bf16", "fp8-channel ours fused"]


def test_save_rewrites_one_whole_file(tmp_path):
    args = e2e.parse_args(["--out", str(tmp_path)])
    results = {"llama3-8b": dict(layers=2, rows=[dict(path="bf16", decode={"1": {"linear_ms": 1.0}})])}
    first = e2e.save(results, [], args)
    results["llama3-8b"]["rows"].append(dict(path="fp8-tensor ours", decode={}))
    again = e2e.save(results, ["a note"], args, first)
    assert again == first and [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging left
    doc = json.loads(first.read_text())
    assert [r["path"] for r in doc["rows"]] == ["bf16", "fp8-tensor ours"] and doc["meta"]["notes"] == ["a note"]
    assert doc["summary"]["llama3-8b"]["bf16"] == {"1": {"linear_ms": 1.0}}


@pytest.mark.slow
def test_batch_order_and_a_killed_run_keeps_its_cells(tmp_path):
    """``--order batch``: every path at batch 1 before any at batch 2; killed (SIGTERM) as soon as the
    first batch-2 cell is printed, the JSON holds every printed cell, eager only where asked."""
    cmd = [sys.executable, "-m", "benchmarks.e2e", "--tiny", "--device", "cpu", "--models", "llama3-8b",
           "--batches", "1,2", "--eager-batches", "1", "--order", "batch", "--new-tokens", "3", "--prompt", "8",
           "--prefill", "16", "--reps", "1", "--presets", "fp8-dynamic", "--cublaslt", "", "--no-torchao",
           "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    printed = []
    try:
        for line in proc.stdout:
            if " batch " in line and line.startswith("  "):
                printed.append(line.strip().split(":")[0])
                if printed[-1] == "bf16 batch 2":
                    proc.send_signal(signal.SIGTERM)
                    break
    finally:
        proc.wait(timeout=120)
    assert printed == ["bf16 batch 1", "fp8-dynamic ours batch 1", "bf16 batch 2"]
    assert proc.returncode == -signal.SIGTERM
    (path,) = tmp_path.glob("e2e-*.json")
    doc = json.loads(path.read_text())
    rows = {r["path"]: r for r in doc["rows"]}
    assert set(rows["bf16"]["decode"]) == {"1", "2"} and set(rows["fp8-dynamic ours"]["decode"]) == {"1"}
    for label in rows:
        one = rows[label]["decode"]["1"]
        assert one["eager"]["decode_tok_s"] > 0 and one["compiled"]["decode_tok_s"] > 0
    two = rows["bf16"]["decode"]["2"]
    assert "eager" not in two and two["compiled"]["decode_tok_s"] > 0 and two["same_tokens_rows"].endswith("/2")
    assert rows["fp8-dynamic ours"]["prefill_tok_s"] > 0


@pytest.mark.slow
def test_budget_skips_a_baseline_without_room_for_a_partner(tmp_path):
    """BF16's compiled cell needs room for two compiles (itself and an FP8 cell to compare): with 1000 s
    and a first guess of 600 s it is skipped, and so is the FP8 cell after it (600 s would fit, but
    there is no BF16 cell to compare it with); the eager reference tokens and the linear split still run."""
    rc = e2e.main(["--tiny", "--device", "cpu", "--models", "llama3-8b", "--batches", "1", "--skip-eager",
                   "--new-tokens", "3", "--prompt", "8", "--prefill", "16", "--reps", "1", "--presets", "fp8-dynamic",
                   "--cublaslt", "", "--no-torchao", "--budget-s", "1000", "--compile-guess-s", "600",
                   "--reserve-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    rows = {r["path"]: r for r in json.loads(next(tmp_path.glob("e2e-*.json")).read_text())["rows"]}
    assert rows["bf16"]["decode"]["1"]["compiled"]["error"].startswith("skipped: --budget-s 1000")
    fp8 = rows["fp8-dynamic ours"]["decode"]["1"]
    assert fp8["compiled"]["error"] == "skipped: no BF16 compiled cell at this batch to compare with"
    assert fp8["linear_ms"] > 0 and fp8["greedy"] is None and rows["fp8-dynamic ours"]["prefill_tok_s"] > 0
