"""benchmarks/common/trace_gaps.py on chrome traces in Kineto's format: a handwritten trace of decode steps
with known gaps (CUDA-graph replays, eager launches, a copy, an overlapping kernel on another stream),
its gzipped round trip through a file, and a real trace of the CPU profiler (no GPU activities)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from benchmarks import step_profile as sp
from benchmarks.common import trace_gaps as tg

GEMM = "void fp8sm90::fp8_gemm_sm90_kernel<64, true, 1>(CUtensorMap_st, CUtensorMap_st, int)"
NORM, SILU, COPY, ARGMAX = "triton_red_fused_rmsnorm_0", "triton_poi_fused_silu_1", "copy_kernel", "argmax_kernel"
DTOH = "Memcpy DtoH (Device -> Pinned)"
STEP_US = 1000.0


def _kernel(name, ts, dur, corr, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": corr}}


def _call(name, ts, dur, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"cbid": 311, "correlation": corr}}


def decode_steps(n: int) -> list[dict]:
    """``n`` steps of STEP_US: a graph replay of 4 kernels (one on a second stream overlapping its
    neighbours), an eager kernel launched after the GPU went idle, a device-to-host copy launched in time.
    Per step the gaps are: norm -> copy 1 us and gemm -> silu 2 us (in graph), silu -> argmax 10 us
    (eager, host late), argmax -> copy 5 us (eager, queued), copy -> next step's norm 939 us (graph
    launch, host late)."""
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    for k in range(n):
        t, g = 1e6 + k * STEP_US, 100 + k
        ev += [_call("cudaGraphLaunch", t, 20, g),
               _kernel(NORM, t + 30, 10, g), _kernel(COPY, t + 41, 3, g, stream=9), _kernel(GEMM, t + 43, 17, g),
               _kernel(SILU, t + 62, 8, g),
               _call("cudaLaunchKernel", t + 75, 4, 200 + k), _kernel(ARGMAX, t + 80, 5, 200 + k),
               _call("cudaMemcpyAsync", t + 82, 9, 300 + k), _kernel(DTOH, t + 90, 1, 300 + k, cat="gpu_memcpy"),
               {"ph": "s", "cat": "ac2g", "id": g, "pid": 1, "tid": 1, "ts": t, "name": "ac2g"},
               {"ph": "X", "cat": "cpu_op", "name": "aten::argmax", "pid": 1, "tid": 1, "ts": t + 74, "dur": 6}]
    return ev


def test_short_name_drops_void_and_parameters_keeps_templates():
    assert tg.short_name(GEMM) == "fp8sm90::fp8_gemm_sm90_kernel<64, true, 1>"
    assert tg.short_name("f<a(b)>(int)") == "f<a(b)>"  # a parenthesis inside the template arguments stays
    assert tg.short_name("void ns::(anonymous namespace)::k(float const*, int)") == "ns::(anonymous namespace)::k"
    assert tg.short_name(NORM) == NORM
    assert tg.short_name("x" * 300, 20) == "x" * 20
    assert tg.short_name(DTOH) == DTOH  # a space before the parenthesis: not a parameter list


def test_parse_keeps_gpu_activities_and_api_calls_only():
    t = tg.parse(decode_steps(2))
    assert len(t.activities) == 12 and len(t.calls) == 6
    assert [a.name for a in t.activities[:6]] == [NORM, COPY, GEMM, SILU, ARGMAX, DTOH]
    assert t.origin(t.activities[2]).name == "cudaGraphLaunch"
    assert len(t.graph_launches()) == 2
    assert tg.count_calls(t, "cudaGraphLaunch") == 2 and tg.count_activities(t, "Memcpy DtoH") == 2


def test_windows_are_the_last_complete_steps():
    t = tg.parse(decode_steps(4))
    w = tg.step_windows(t, 10)  # 4 launches: 3 complete steps, the last one is followed by the end of the call
    assert [(x.start, x.end) for x in w] == [(1e6 + k * STEP_US + 30, 1e6 + (k + 1) * STEP_US + 30) for k in range(3)]
    assert [(x.host_start, x.host_end) for x in w] == [(1e6 + k * STEP_US, 1e6 + (k + 1) * STEP_US) for k in range(3)]
    assert len(tg.step_windows(t, 2)) == 2 and tg.step_windows(t, 2)[0].start == 1e6 + STEP_US + 30
    two = tg.step_windows(t, 5, per_step=2)  # two launches a step: one complete step of two
    assert len(two) == 1 and two[0].end - two[0].start == 2 * STEP_US
    d = tg.step_windows(t, 10, marker="dtoh")
    assert len(d) == 3 and d[0].start == 1e6 + 90 and d[0].host_start == 1e6 + 82


def test_gaps_by_pair_and_kind():
    t = tg.parse(decode_steps(4))
    r = tg.analyze(t, tg.step_windows(t, 10), category=sp.category)
    assert r["steps"] == 3
    assert (r["span_us"], r["busy_us"], r["idle_us"]) == (STEP_US, 43.0, 957.0)  # busy: 10 + 19 (union) + 8 + 5 + 1
    assert r["host_step_us"] == STEP_US
    assert r["idle_by_kind"] == {"in graph": 3.0, "graph launch, host late": 939.0, "graph launch, queued": 0.0,
                                 "eager, host late": 10.0, "eager, queued": 5.0, "unattributed": 0.0}
    assert sum(r["idle_by_kind"].values()) == r["idle_us"]
    gemm = tg.short_name(GEMM)
    assert [(p["before"], p["after"], p["us"], p["kind"]) for p in r["pairs"]] == [
        (DTOH, NORM, 939.0, "graph launch, host late"), (SILU, ARGMAX, 10.0, "eager, host late"),
        (ARGMAX, DTOH, 5.0, "eager, queued"), (gemm, SILU, 2.0, "in graph"), (NORM, COPY, 1.0, "in graph")]
    assert all(p["count"] == 1.0 and p["median_us"] == p["us"] for p in r["pairs"])
    assert r["kernels"] == dict(total=6.0, graph=4.0, eager=2.0)
    assert r["categories"] == {"copy/fill": 2.0, "fp8 gemm (ours)": 1.0, "inductor triton": 2.0, "other": 1.0}
    assert r["api"] == {"cudaGraphLaunch": 1.0, "cudaLaunchKernel": 1.0, "cudaMemcpyAsync": 1.0}
    assert r["graph_launches"] == 1.0
    assert r["eager"] == [dict(name=ARGMAX, count=1.0, us=5.0), dict(name=DTOH, count=1.0, us=1.0)]
    cp = {(p["before"], p["after"]): p["us"] for p in r["category_pairs"]}
    assert cp[("copy/fill", "inductor triton")] == 939.0 and cp[("fp8 gemm (ours)", "inductor triton")] == 2.0
    assert len(tg.analyze(t, tg.step_windows(t, 10), top=2)["pairs"]) == 2


def test_queued_graph_launch_and_unattributed_kernel():
    ev = [_call("cudaGraphLaunch", 0, 50, 1), _kernel("a", 10, 10, 1),
          _call("cudaGraphLaunch", 15, 50, 2), _kernel("b", 30, 10, 2),  # launched before a ended: queued
          _kernel("c", 45, 5, 77),  # no call with correlation 77
          _call("cudaGraphLaunch", 60, 5, 3), _kernel("d", 70, 1, 3)]
    t = tg.parse(ev)
    r = tg.analyze(t, [tg.Window(10, 70, 0, 60)])
    assert r["idle_by_kind"]["graph launch, queued"] == 10.0  # a ends 20, b starts 30
    assert r["idle_by_kind"]["unattributed"] == 5.0  # b ends 40, c starts 45
    assert r["idle_by_kind"]["graph launch, host late"] == 20.0  # c ends 50, d's launch began at 60, d starts 70
    assert r["kernels"] == dict(total=3.0, graph=2.0, eager=1.0) and r["graph_launches"] == 2.0


def test_gzipped_trace_round_trip(tmp_path):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": decode_steps(3), "displayTimeUnit": "ms"}, f)
    t = tg.parse(tg.load_events(path))
    assert tg.analyze(t, tg.step_windows(t, 8))["idle_us"] == 957.0
    plain = tmp_path / "list.json"
    plain.write_text(json.dumps(decode_steps(3)))
    assert len(tg.parse(tg.load_events(plain)).activities) == 18
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"something": 1}))
    with pytest.raises(tg.TraceError):
        tg.load_events(bad)


def test_real_cpu_profiler_trace_has_no_steps(tmp_path):
    """A trace the CPU profiler wrote (torch.profiler, CPU activity only): CPU ops are read past, and
    without GPU activities there is no step to analyse (a typed error, not an empty table)."""
    from torch.profiler import ProfilerActivity, profile

    lin = torch.nn.Linear(64, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            lin(torch.randn(4, 64))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    events = tg.load_events(path)
    assert any(e.get("cat") == "cpu_op" for e in events)
    t = tg.parse(events)
    assert t.activities == () and t.calls == ()
    with pytest.raises(tg.TraceError, match="no complete step"):
        tg.step_windows(t, 4)
    with pytest.raises(tg.TraceError):
        tg.analyze(t, [])


def test_bad_arguments():
    t = tg.parse(decode_steps(3))
    with pytest.raises(ValueError):
        tg.step_windows(t, 0)
    with pytest.raises(ValueError):
        tg.step_windows(t, 2, marker="nvtx")
