"""benchmarks/gemm_bench.py on the CPU: the plan of each mode, the peers' operand plumbing against an
fp64 reference, the table and the summary. The timing itself needs an H200 (docs/performance.md)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import KERNEL_FLOOR, calc_diff, cpu_scaled_mm_available, gemm_ref64, rounding_bar

from benchmarks import gemm_bench as G
from benchmarks import gemm_run as R
from benchmarks.common.shapes import Shape

needs_cpu_scaled_mm = pytest.mark.skipif(not cpu_scaled_mm_available(),
                                         reason="torch._scaled_mm does not run on this CPU (oneDNN FP8 needs AVX512-FP16)")


def plan_of(*argv):
    return G.make_plan(G.parse_args(list(argv)))


def test_each_mode_has_its_set_columns_and_timing():
    decode = plan_of("--mode", "decode")
    assert len(decode.shapes) == 407 and "ours_block" in decode.columns and "cublas_block" in decode.columns
    assert set(G.DEFAULT_COLUMNS["burst"]) == set(G.COLUMNS) and len(plan_of("--mode", "burst").shapes) == 68
    assert len(plan_of("--mode", "steady").shapes) == 27
    splitk = plan_of("--mode", "splitk", "--ms", "1,16", "--splits", "4,2")
    assert splitk.splits == [1, 4, 2] and {s.m for s in splitk.shapes} == {1, 16} and len(splitk.shapes) == 16
    raster = plan_of("--mode", "raster", "--groups", "8,16", "--even-waves")
    assert raster.configs == ["7", "10"] and raster.groups == [8, 16] and raster.even_waves
    args = G.parse_args(["--mode", "steady", "--rounds", "4"])
    assert (args.rounds, args.rep, args.burn) == (4, 400, 0.5)


def test_splitk_mode_on_decode_models_times_small_m_in_graphs():
    p = plan_of("--mode", "splitk", "--set", "decode", "--models", "Qwen2.5-0.5B", "--ms", "1,16", "--splits", "2,8")
    assert p.splits == [1, 2, 8] and len(p.shapes) == 8 and {s.m for s in p.shapes} == {1, 16}
    assert all(s.layer.startswith("Qwen2.5-0.5B ") for s in p.shapes)
    assert [R.in_graphs(p, m) for m in (1, 256, 2048)] == [True, True, False]


def test_block_mode_times_small_m_in_graphs_and_large_m_steady():
    p = plan_of("--mode", "block")
    assert p.columns == ["ours_block", "cublas_block", "ours", "bf16"] and len(p.shapes) == 56
    assert [R.in_graphs(p, m) for m in (1, 512, 2048, 8192)] == [True, True, False, False]
    assert not R.in_graphs(plan_of("--mode", "steady"), 1) and R.in_graphs(plan_of("--mode", "decode"), 4096)
    assert ("ours", "ours_block") in R.RATIOS  # the block path's cost against our per-tensor path


def test_decode_plan_splits_by_model_and_m():
    p = plan_of("--mode", "decode", "--models", "Qwen2.5-0.5B,Gemma-2-9B", "--ms", "1,1024")
    assert len(p.shapes) == 16 and {s.m for s in p.shapes} == {1, 1024}
    assert {s.layer.split()[0] for s in p.shapes} == {"Qwen2.5-0.5B", "Gemma-2-9B"}
    with pytest.raises(ValueError, match="Llama-9"):
        plan_of("--mode", "decode", "--models", "Llama-9")


def test_quick_decode_plan_is_small():
    quick = plan_of("--mode", "decode", "--quick")
    assert 0 < len(quick.shapes) <= 48 and {s.m for s in quick.shapes} == {1, 16, 64, 256}


def test_shapes_and_per_channel_options():
    p = plan_of("--mode", "steady", "--shapes", "6144x6144x1280", "--columns", "ours,cublas_t", "--per-channel")
    assert [s.mnk for s in p.shapes] == [(6144, 6144, 1280)] and p.columns == ["ours", "cublas_t", "ours_ch"]


@pytest.mark.parametrize("argv, msg", [(["--columns", "ours,cudnn"], "cudnn"),
                                        (["--mode", "decode", "--env", "A=1"], "decode"),
                                        (["--mode", "splitk", "--splits", "0"], ">= 1"),
                                        (["--shapes", "8x8"], "MxNxK")])
def test_bad_plans_are_refused_with_the_reason(argv, msg, capsys):
    with pytest.raises(ValueError, match=msg):
        plan_of(*argv)
    assert G.main(argv) == 2 and msg in capsys.readouterr().err


@needs_cpu_scaled_mm
def test_peer_calls_compute_the_documented_gemm():
    """The cuBLASLt peers' scales are wired as docs/design.md section 2 says: each peer's output
    against fp64 on the dequantized inputs, within the tensor-core bar (torch's CPU _scaled_mm)."""
    torch.manual_seed(0)
    plan = plan_of("--columns", "cublas_t,cublas_row,bf16")
    ops = R.make_operands(33, 200, 272, device="cpu")
    na = {}
    calls = R.calls_for(plan, ops, [], na)
    assert set(calls) == {"cublas_t", "cublas_row", "bf16"} and not na
    refs = {"cublas_t": gemm_ref64(ops.a, ops.b, ops.s1, ops.s2),
            "cublas_row": gemm_ref64(ops.a, ops.b, ops.sa_row, ops.sb_row),
            "bf16": gemm_ref64(ops.a, ops.b, torch.ones(1), torch.ones(1))}
    for name, ref in refs.items():
        out = calls[name]()
        assert out.shape == (33, 200) and out.dtype == torch.bfloat16
        assert calc_diff(out, ref) <= rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR), name


@needs_cpu_scaled_mm
def test_candidates_rotate_fresh_copies_and_report_what_cannot_run():
    plan = plan_of("--columns", "cublas_t,ours_block")
    calls, na = R.candidates(plan, Shape("t", 16, 128, 256), 3, [], device="cpu")
    outs = [fn() for fn in calls["cublas_t"]]
    assert len(outs) == 3 and not torch.equal(outs[0], outs[1])  # each copy has its own operands
    assert "ours_block" in na and "sm90" in na["ours_block"]  # our backend's refusal, with its reason
    outs = R.probe(calls, na)
    assert set(outs) == {"cublas_t"}


def _row(m, us, na=None, cost=None):
    row = {"layer": "x", "M": m, "N": 4096, "K": 4096, "config": "7", "us": us, "na": na or {}, "ratios": {}}
    for peer, mine in R.RATIOS:
        if us.get(peer) and us.get(mine):
            row["ratios"][R.ratio_name(peer, mine)] = us[peer] / us[mine]
    if cost is not None:
        row["channel_cost"] = cost
    return row


def test_summary_geomeans_per_m_with_the_worst_shape():
    cols = ["ours", "ours_ch", "cublas_t", "ours_block"]
    rows = [_row(1, {"ours": 10.0, "cublas_t": 20.0}), _row(1, {"ours": 10.0, "cublas_t": 5.0}),
            _row(4096, {"ours": 100.0, "cublas_t": 110.0, "ours_ch": 101.0}, cost=0.01)]
    s = R.summarize(rows, R.RATIOS, cols)
    assert s["M=1"]["cublas_t/ours"]["geomean"] == pytest.approx(1.0)
    assert s["M=1"]["cublas_t/ours"]["worst"] == pytest.approx(0.5) and s["M=1"]["cublas_t/ours"]["shapes"] == 2
    assert s["M>=2048"]["cublas_t/ours"]["geomean"] == pytest.approx(1.1)
    assert s["M=4096"]["channel_cost"] == {"mean": 0.01, "worst": 0.01}
    assert "cublas_block/ours_block" not in s["M=1"]  # the peer column was not asked for
    assert any("per-channel cost mean +1.0%" in line for line in R.format_summary(s))


def test_table_row_prints_na_and_ratios():
    cols = ["ours", "ours_block", "cublas_t"]
    ratios = [("cublas_t", "ours"), ("cublas_block", "ours_block")]
    row = _row(16, {"ours": 8.0, "cublas_t": 10.0}, na={"ours_block": "sm90 refuses"})
    row["tflops"], row["tbps"] = 1.5, 2.25
    line = R.format_row(row, cols, ratios)
    assert "n/a" in line and "1.250" in line and "2.25" in line
    assert len(R.header(cols, ratios)) == len(line)
    assert math.isclose(R.calc_diff(torch.ones(4), torch.ones(4)), 0.0, abs_tol=1e-15)


def test_long_forced_config_labels_stay_separate_and_block_tables_show_the_block_choice():
    cols = ["ours_block", "bf16", "cfgswap64x128_2wg", "cfgtile128x128_2acc"]
    row = _row(128, {c: 15.0 for c in cols})
    row["config_block"] = "tile128x128_2acc"
    head, line = R.header(cols, []), R.format_row(row, cols, [])
    assert "bf16 cfgswap64x128_2wg cfgtile128x128_2acc" in head
    assert len(head) == len(line) and "tile128x128_2ac" in line
    assert " 7 " in R.format_row(row, ["ours", "bf16"], [])  # a per-tensor table shows the per-tensor choice


def test_runs_as_a_module_from_the_repository_root():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "benchmarks.gemm_bench", "--help"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--mode" in run.stdout and "cublas_block" in run.stdout
    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, "-m", "benchmarks.gemm_bench", "--mode", "decode", "--quick"],
                             cwd=root, capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and "needs a CUDA GPU" in run.stderr


@needs_cpu_scaled_mm
def test_a_cpu_run_prints_the_table_and_writes_the_json(tmp_path, capsys):
    """The whole run on CPU operands (torch's CPU _scaled_mm and matmul as the peers; our kernel and
    cuBLASLt's block-wise GEMM refuse the CPU and are reported n/a with their reasons)."""
    import json

    args = G.parse_args(["--mode", "burst", "--shapes", "1x256x512,33x384x256", "--columns",
                         "cublas_t,cublas_row,bf16,ours_block,cublas_block", "--rounds", "2", "--out", str(tmp_path)])
    plan = G.make_plan(args)
    plan.device = "cpu"
    assert R.run(plan, args) == 0
    out = capsys.readouterr().out
    assert "n/a ours_block on 2 shapes" in out and "n/a cublas_block on 2 shapes" in out
    doc = json.loads(next(tmp_path.glob("gemm-burst-*.json")).read_text())
    rows = doc["rows"]
    assert [(r["M"], r["N"], r["K"]) for r in rows] == [(1, 256, 512), (33, 384, 256)]
    for r in rows:
        assert set(r["us"]) == {"cublas_t", "cublas_row", "bf16"} and all(v > 0 for v in r["us"].values())
        assert len(r["rounds_ms"]["bf16"]) == 2 and "sm90" in r["na"]["ours_block"]
    assert doc["meta"]["mode"] == "burst" and doc["meta"]["columns"][:2] == ["cublas_t", "cublas_row"]


def test_forced_configs_resolve_by_id_or_name():
    from benchmarks.common import ours as U
    from fp8_linear.kernels import CONFIGS

    for cfg in CONFIGS:
        assert U.resolve_config(str(cfg.id)) is cfg
        if getattr(cfg, "name", None):
            assert U.resolve_config(cfg.name) is cfg
    with pytest.raises(ValueError, match="unknown config 'nope'"):
        U.resolve_config("nope")
    label = U.chosen(4096, 4096, 4096, torch.ones(1))
    assert label.split()[0] in {U.config_label(c) for c in CONFIGS}
