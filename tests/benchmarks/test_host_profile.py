"""benchmarks/host_profile.py: the steady window's clocks, the per-step function times, the collections,
the difference against BF16, and the script end to end on a tiny CPU model."""

from __future__ import annotations

import cProfile
import gc
import json

import pytest

from benchmarks import host_profile as hp


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_window_clock_profiles_only_between_its_stamps():
    """Profiling starts after stamp ``start`` and stops before stamp ``stop``: work before and after
    the window is not seen, work inside it is, and the profiled own times fit in the window's wall."""
    prof = cProfile.Profile()
    clock = hp.WindowClock(1, 3, prof)
    clock.put(None)  # the prompt
    _busy(10_000)  # before the window: not profiled
    clock.put(None)  # stamp 1: the window opens
    _busy(20_000)
    clock.put(None)  # stamp 2
    _busy(20_000)
    clock.put(None)  # stamp 3: the window closes
    _busy(10_000)  # after it: not profiled
    funcs = hp.function_times(prof, 2)
    busy = [v for k, v in funcs.items() if k.endswith("(_busy)")]
    assert len(busy) == 1 and busy[0]["calls"] == 1.0  # 2 calls over 2 steps; the two outside not counted
    lo, hi = clock.window()
    assert sum(f["tottime_us"] for f in funcs.values()) * 2 <= (hi - lo) * 1e6
    assert all(f["tottime_us"] >= 0 and f["cumtime_us"] >= f["tottime_us"] - 1e-6 for f in funcs.values())
    with pytest.raises(RuntimeError):
        hp.WindowClock(1, 9).window()


def test_gc_clock_times_collections_and_the_window_keeps_its_own():
    with hp.GcClock() as clock:
        gc.collect(0)
        gc.collect(2)
    assert [e[2] for e in clock.events] == [0, 2] and all(e[1] >= 0 for e in clock.events)
    assert clock not in gc.callbacks
    events = [(1.0, 0.002, 0), (2.0, 0.004, 2), (5.0, 0.1, 1)]  # the last begins after the window
    g = hp.gc_per_step(events, (0.5, 3.0), 2)
    assert g["count"] == 1.0 and g["ms"] == pytest.approx(3.0) and g["max_pause_ms"] == pytest.approx(4.0)
    assert g["by_generation"]["gen0"] == dict(count=0.5, ms=pytest.approx(1.0)) and g["by_generation"]["gen1"]["count"] == 0


def test_phases_split_each_step_around_the_compiled_call():
    clock = hp.WindowClock(1, 3)
    clock.stamps = [0.0, 1.0, 2.0, 3.0]
    calls = hp.CallClock(None, cuda=False)
    calls.calls = [(0.5, 0.9, None, None), (1.1, 1.7, None, None), (2.2, 2.5, None, None)]  # the first before the window
    p = hp.phases(calls, clock, 2)
    assert p["calls"] == 1.0 and p["gpu_call_us"] is None
    assert (p["before_call_us"], p["in_call_us"], p["after_call_us"]) == pytest.approx((150e3, 450e3, 400e3))
    assert sum(p[k] for k in ("before_call_us", "in_call_us", "after_call_us")) == pytest.approx(1e6)  # = the step


def test_diff_against_bf16_ranks_functions_by_the_size_of_the_difference():
    def cell(before):
        return dict(wall_us=100.0 + before, cprofile=dict(wall_us=120.0 + before),
                    phases=dict(before_call_us=before, in_call_us=10.0, after_call_us=5.0, gpu_call_us=None))
    base = (cell(10.0), {"a": dict(tottime_us=5.0, calls=1.0, wait=False), "b": dict(tottime_us=50.0, calls=1.0, wait=True)})
    other = (cell(30.0), {"a": dict(tottime_us=25.0, calls=2.0, wait=False), "c": dict(tottime_us=3.0, calls=1.0, wait=False)})
    d = hp.diff_against(base, other)
    assert [r["name"] for r in d["functions"]] == ["b", "a", "c"]
    assert [r["tottime_us"] for r in d["functions"]] == [-50.0, 20.0, 3.0] and d["functions"][0]["wait"]
    assert d["wall_us"] == 20.0 and d["phases"]["before_call_us"] == 20.0 and d["phases"]["gpu_call_us"] is None


def test_labels_are_short():
    assert hp.label(("~", 0, "<method 'cpu' of 'torch._C.TensorBase' objects>")) == "<method 'cpu' of 'torch._C.TensorBase' objects>"
    assert hp.label(("/x/lib/python3.11/site-packages/transformers/generation/utils.py", 3123, "_sample")) == \
        "transformers/generation/utils.py:3123(_sample)"
    assert hp.label(("<eval_with_key>.3", 4, "forward")) == hp.label(("<eval_with_key>.1", 4, "forward"))
    assert hp.label(("/tmp/torchinductor_root/ab/cab12.py", 812, "call")) == \
        hp.label(("/tmp/torchinductor_root/q7/cq7zz.py", 640, "call")) == "<inductor code>(call)"
    assert any(__import__("re").search(w, "<method 'cpu' of 'torch._C.TensorBase' objects>") for w in hp.WAITS)


@pytest.mark.slow
def test_tiny_cpu_run_writes_the_json(tmp_path, capsys):
    """The script end to end on a 2-layer tiny Llama on the CPU (dynamo with the eager backend)."""
    rc = hp.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "2", "--prompt", "8", "--new-tokens", "2",
                  "--extra-tokens", "2", "--presets", "fp8-tensor", "--fuse", "--fused-only", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("host-profile-*.json")).read_text())
    assert doc["meta"]["compile_backend"] == "eager" and doc["meta"]["skipped"] == []
    assert [(r["path"], r["batch"]) for r in doc["rows"]] == [("bf16", 2), ("fp8-tensor+fused", 2)]
    for r in doc["rows"]:
        cp = r["cprofile"]
        assert r["steps"] == 2 and r["wall_us"] > 0 and cp["wall_us"] > 0
        assert r["phases"]["calls"] == 1.0 and cp["phases"]["calls"] == 1.0  # one compiled call a step
        assert r["dynamo_frames_in_steady_calls"] == {}  # no recompile, under cProfile neither
        for rows in (r["by_tottime"], r["by_cumtime"]):
            assert rows and all(f["tottime_us"] >= 0 and f["cumtime_us"] >= 0 and f["calls"] > 0 for f in rows)
        assert sum(f["tottime_us"] for f in r["by_tottime"]) <= cp["attributed_us"] + 1e-6 <= cp["wall_us"]
        assert max(f["cumtime_us"] for f in r["by_cumtime"]) <= cp["wall_us"]
        # the compiled call runs the model: it is the top of the cumulative times, and most of the step
        assert any("compile_wrapper" in f["name"] or "_fn" in f["name"] for f in r["by_cumtime"][:4])
        assert r["phases"]["in_call_us"] > r["phases"]["before_call_us"]
        ph = r["phases"]  # one compiled call a step: before + in + after is the step, stamp to stamp
        assert ph["before_call_us"] + ph["in_call_us"] + ph["after_call_us"] == pytest.approx(r["wall_us"], rel=1e-6)
        g = r["gc_on"]
        assert set(g["by_generation"]) == {"gen0", "gen1", "gen2"} and g["count"] >= 0 and g["ms"] >= 0 and g["wall_us"] > 0
    diff = doc["rows"][1]["diff_vs_bf16"]
    assert diff["functions"] and "fp8_linear" in " ".join(f["name"] for f in diff["functions"])  # FP8's own code shows
    out = capsys.readouterr().out
    assert "fp8-tensor+fused - bf16, batch 2" in out and "top by own time" in out


def test_a_budget_too_small_skips_every_path_and_says_so(tmp_path, capsys):
    rc = hp.main(["--tiny", "--device", "cpu", "--layers", "1", "--batches", "2", "--prompt", "8", "--new-tokens", "2",
                  "--extra-tokens", "1", "--budget-s", "5", "--cell-guess-s", "100", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads(next(tmp_path.glob("host-profile-*.json")).read_text())
    assert doc["rows"] == [] and [s.split(":")[0] for s in doc["meta"]["skipped"]] == ["bf16", "fp8-channel"]
    assert "bf16: skipped (--budget-s 5" in capsys.readouterr().out


def test_too_few_tokens_for_a_steady_window_is_refused():
    with pytest.raises(ValueError, match="--new-tokens >= 2"):
        hp.profile_cell(None, 1, 8, 1, 4, "cpu", {})
