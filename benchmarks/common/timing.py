"""Timing of GPU candidates (docs/design.md section 7: CUDA events, warm-up, median, random data).

Three methods, one per regime (the reasons: docs/kernel-log.md, "the power cap" under v10):

- :func:`time_burst`: ``triton.testing.do_bench`` medians (L2 cleared before every repetition),
  candidates interleaved over rounds, odd rounds in reverse order. Short: the card's clock is that
  of a burst after whatever ran before.
- :func:`time_steady`: each candidate alone for ``burn`` seconds, then ``do_bench`` for ``rep`` ms,
  A/B/B/A over rounds: the H200 runs large FP8 GEMMs at its 700 W cap, so only a kernel that has run
  for a while is at its sustained clock.
- :func:`time_graph`: small problems, where launch overhead and L2 hits would dominate: the calls
  (each on its own copy of the operands, the copies spanning more than the L2) captured in one CUDA
  graph and replayed; the time per call is the replay time over the number of calls.

Every function returns ``{name: [ms per call, one per round]}``; a candidate that raises gets the
error's text instead of its list (and is not run again).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

Fn = Callable[[], object]
#: Calls between synchronizations while a candidate burns in (keeps the queue full, bounds the lag).
BURN_BATCH = 20
#: GPU time per replayed graph measurement.
GRAPH_MIN_MS = 10.0


def burn(fn: Fn, seconds: float, batch: int = BURN_BATCH) -> None:
    """Run ``fn`` back to back for ``seconds`` (``batch`` calls between synchronizations)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()


def warm_up(seconds: float, size: int = 8192) -> None:
    """cuBLASLt FP8 GEMMs of ``size``^3 for ``seconds``, so that the first candidate timed does not meet
    a cool card (it measured 4-7% faster than the same kernel timed later: docs/kernel-log.md v13)."""
    if seconds <= 0:
        return
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    burn(lambda: torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), seconds, 10)
    del a


def _round_order(names: list[str], rnd: int) -> list[str]:
    return names if rnd % 2 == 0 else names[::-1]


def _run_rounds(fns: dict[str, Fn], rounds: int, one: Callable[[str, Fn], float]) -> dict[str, list[float] | str]:
    times: dict[str, list[float] | str] = {name: [] for name in fns}
    for rnd in range(rounds):
        for name in _round_order(list(fns), rnd):
            if isinstance(times[name], str):
                continue
            try:
                times[name].append(one(name, fns[name]))
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is reported, not fatal
                times[name] = f"{type(e).__name__}: {e}"[:200]
    return times


def time_burst(fns: dict[str, Fn], rounds: int = 3, rep: int = 40, warmup: int = 10) -> dict[str, list[float] | str]:
    """``do_bench`` median (ms) per round and candidate, candidates interleaved (see the module doc)."""
    from triton.testing import do_bench

    return _run_rounds(fns, rounds, lambda _n, fn: do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def time_steady(fns: dict[str, Fn], rounds: int = 2, burn_s: float = 0.5, rep: int = 400,
                batch: int = BURN_BATCH) -> dict[str, list[float] | str]:
    """Steady-state medians (ms): each candidate alone for ``burn_s`` seconds, then ``do_bench`` for
    ``rep`` ms; A/B/B/A over ``rounds``."""
    from triton.testing import do_bench

    def one(_name, fn):
        burn(fn, burn_s, batch)
        return do_bench(fn, warmup=batch, rep=rep, return_mode="median")

    return _run_rounds(fns, rounds, one)


def capture(calls: list[Fn]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` in order, after two eager passes on a side stream (lazy init, the
    kernel build and cuBLASLt's workspace happen outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    return graph


def replay_ms(graph: torch.cuda.CUDAGraph, calls: int, min_ms: float = GRAPH_MIN_MS) -> float:
    """ms per call of a captured graph of ``calls`` calls: replays enough times to fill ``min_ms``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    reps = max(1, math.ceil(min_ms / max(start.elapsed_time(end), 1e-3)))
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (reps * calls)


def time_graph(call_lists: dict[str, list[Fn]], rounds: int = 3, min_ms: float = GRAPH_MIN_MS) -> dict[str, list[float] | str]:
    """ms per call, per round and candidate: each candidate's ``calls`` (one per rotated operand copy)
    captured once in a CUDA graph, then replayed; candidates alternate A/B/B/A over ``rounds``."""
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int] | str] = {}
    for name, calls in call_lists.items():
        try:
            graphs[name] = (capture(calls), len(calls))
        except Exception as e:  # noqa: BLE001 - reported per candidate
            torch.cuda.synchronize()
            graphs[name] = f"{type(e).__name__}: {e}"[:200]
    ok = {name: g for name, g in graphs.items() if not isinstance(g, str)}
    times = _run_rounds({name: (lambda g=g: g) for name, g in ok.items()}, rounds,
                        lambda _n, fn: replay_ms(*fn(), min_ms=min_ms))
    return {name: (g if isinstance(g, str) else times[name]) for name, g in graphs.items()}


def time_host(fns: dict[str, Fn], rounds: int = 3, calls: int = 5) -> dict[str, list[float] | str]:
    """Host wall-clock ms per call (the mean of ``calls`` calls), per round and candidate: for CPU
    operands only (a GPU launch returns before its kernel ends)."""
    def one(_name, fn):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls

    return _run_rounds(fns, rounds, one)


def best(ts: list[float] | str) -> float:
    """The fastest round (ms), NaN for a candidate that failed."""
    return min(ts) if isinstance(ts, list) and ts else float("nan")


def median(ts: list[float] | str) -> float:
    """The median round (ms), NaN for a candidate that failed."""
    if not isinstance(ts, list) or not ts:
        return float("nan")
    s = sorted(ts)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def paired_cost(ms_x: list[float], ms_ref: list[float]) -> float:
    """Mean over rounds of ``ms_x / ms_ref`` minus 1: the two measured in the same round, so in the same
    thermal state (e.g. per-channel against per-tensor scales)."""
    if not ms_ref or len(ms_x) != len(ms_ref):
        raise ValueError(f"paired_cost: expected two equally long non-empty lists, got {len(ms_x)} and {len(ms_ref)}")
    return sum(x / r for x, r in zip(ms_x, ms_ref)) / len(ms_ref) - 1


def geomean(values) -> float:
    """Geometric mean of the finite positive ``values`` (NaN when there are none)."""
    vals = [v for v in values if v == v and 0 < v < math.inf]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else float("nan")


def parse_env_sweep(spec: str) -> tuple[str, list[str]]:
    """``NAME=v1,v2,...`` -> ``(NAME, [v1, v2, ...])``; ``ValueError`` unless NAME is an identifier and
    at least one non-empty value follows."""
    name, sep, values = spec.partition("=")
    vals = [v.strip() for v in values.split(",")]
    if not sep or not name.strip().isidentifier() or not vals or any(not v for v in vals):
        raise ValueError(f"--env {spec!r}: expected NAME=v1,v2,...")
    return name.strip(), vals
