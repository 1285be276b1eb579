"""benchmarks/step_profile.py's arithmetic: kernel categories by name, the busy time as the union of
kernel intervals, and one decode step as the difference of two profiled calls."""

from __future__ import annotations

import pytest

from benchmarks import step_profile as sp
from benchmarks.common.decode_args import path_list


@pytest.mark.parametrize("name,want", [
    ("void fp8sm90::fp8_gemm_sm90_kernel<16, true, 4, 0, 0, false, false, false>(CUtensorMap_st)", "fp8 gemm (ours)"),
    ("void fp8act::(anonymous namespace)::quant_rows_kernel<__nv_bfloat16, 0, 0, true>(...)", "act quant (ours)"),
    ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "cuBLAS/cuBLASLt gemm"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_14", "inductor triton"),
    ("Memcpy DtoD (Device -> Device)", "copy/fill"),
    ("some_other_kernel", "other"),
])
def test_category(name, want):
    assert sp.category(name) == want


def test_busy_is_the_union_of_intervals():
    assert sp.busy_us([]) == 0.0
    assert sp.busy_us([(0, 2), (1, 3), (5, 6)]) == 4.0  # overlap counted once, the gap not at all
    assert sp.busy_us([(5, 6), (0, 10)]) == 10.0  # contained, any order


def test_per_step_is_the_difference_over_the_extra_steps():
    short = dict(categories={"a": dict(count=10, us=100.0)}, names={"k": 100.0}, busy_us=100.0, span_us=150.0,
                 wall_us=1000.0)
    long = dict(categories={"a": dict(count=30, us=300.0), "b": dict(count=2, us=4.0)}, names={"k": 300.0, "j": 4.0},
                busy_us=304.0, span_us=400.0, wall_us=3000.0)
    r = sp.per_step(short, long, 2)
    assert r["categories"] == {"a": dict(count=10.0, us=100.0), "b": dict(count=1.0, us=2.0)}
    assert (r["busy_us"], r["span_us"], r["idle_us"], r["wall_us"]) == (102.0, 125.0, 23.0, 1000.0)
    assert [t["name"] for t in r["top"]] == ["k", "j"]


def test_inductor_kernels_named_after_the_gemm_they_feed_are_inductor_triton():
    assert sp.category("triton_red_fused__to_copy_add_clamp_div_mean_mul_pow_rsqrt_sm90_gemm_view_13") == "inductor triton"
    assert sp.category("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_cat_clone_2") == "inductor triton"


def test_path_list():
    assert path_list(["a", "b"], False, False, False) == ["bf16", "a", "b"]
    assert path_list(["a"], True, False, False) == ["bf16", "a", "a+fused"]
    assert path_list(["a", "b"], True, True, True) == ["bf16", "a+fused", "b+fused", "a+fused+nopdl", "b+fused+nopdl"]
    assert path_list(["a"], False, True, True) == ["bf16", "a", "a+nopdl"]  # --fused-only needs --fuse


def _replay_steps(steps: int, launches: int) -> list[dict]:
    """Chrome-trace events of ``steps`` decode steps of 1000 us, each ``launches`` graph replays of one
    20 us kernel followed by an eager argmax and a device-to-host copy."""
    ev, corr = [], 0
    for k in range(steps):
        t = 1e6 + 1000.0 * k
        for j in range(launches):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t + 100 * j, "dur": 5,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"triton_poi_fused_{j}", "ts": t + 100 * j + 10, "dur": 20,
                       "args": {"correlation": corr, "stream": 7}})
        for name, cat, dt in (("argmax", "kernel", 600), ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 700)):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + dt - 5, "dur": 3,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": cat, "name": name, "ts": t + dt, "dur": 2, "args": {"correlation": corr,
                                                                                            "stream": 7}})
    return ev


@pytest.mark.parametrize("launches", [1, 3])
def test_step_gaps_marks_steps_by_the_extra_graph_launches(launches, capsys):
    """The longer call has ``extra`` more steps: the graph launches a step are read off the difference,
    a step of several launches (a partitioned graph) is one window."""
    from benchmarks.common import trace_gaps as tg

    short, long = tg.parse(_replay_steps(3, launches)), tg.parse(_replay_steps(7, launches))
    g = sp.step_gaps(short, long, 4)
    assert (g["marker"], g["markers_per_step"], g["graph_launches_by_difference"]) == ("graph", launches, launches)
    assert g["steps"] == 4 and g["span_us"] == 1000.0 and g["graph_launches"] == launches
    assert g["kernels"] == dict(total=launches + 2.0, graph=float(launches), eager=2.0)
    assert g["busy_us"] == 20 * launches + 4 and g["idle_us"] == 1000 - 20 * launches - 4
    assert g["kernels_by_difference"] == launches + 2
    sp.print_gaps("p", 1, g)
    sp.print_summary({"p/b1": dict(gaps=g), "q/b1": dict(gaps=dict(error="no complete step"))})
    out = capsys.readouterr().out
    assert f"{launches}.0 graph launches" in out and "argmax" in out and "no complete step" in out


def test_step_gaps_without_graphs_marks_steps_by_the_copies():
    from benchmarks.common import trace_gaps as tg

    eager = [e for e in _replay_steps(6, 1) if e["name"] != "cudaGraphLaunch"]
    g = sp.step_gaps(tg.parse(eager[: len(eager) // 2]), tg.parse(eager), 3)
    assert (g["marker"], g["markers_per_step"], g["steps"]) == ("dtoh", 1, 3)
    assert g["kernels"]["graph"] == 0 and g["idle_by_kind"]["unattributed"] > 0  # the replayed kernel lost its launch
    assert "error" in sp.step_gaps(tg.parse([]), tg.parse([]), 3)


@pytest.mark.slow
def test_tiny_cpu_run_writes_the_json_and_traces(tmp_path, capsys):
    """The script end to end on a 2-layer tiny Llama on the CPU (no GPU kernels: no gaps, said so)."""
    import json

    rc = sp.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "2", "--prompt", "8", "--new-tokens", "2",
                  "--extra-tokens", "2", "--presets", "fp8-tensor", "--fuse", "--fused-only", "--gaps",
                  "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("step-profile-*.json")).read_text())
    assert [r["path"] for r in doc["rows"]] == ["bf16/b2", "fp8-tensor+fused/b2"]
    assert all("no complete step" in r["gaps"]["error"] for r in doc["rows"])
    assert len(list(tmp_path.glob("step-trace-*.json.gz"))) == 2
    assert "fp8-tensor+fused" in capsys.readouterr().out
