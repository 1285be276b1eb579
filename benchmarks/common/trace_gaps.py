"""GPU idle gaps of a ``torch.profiler`` trace, per decode step, by the two activities around each gap.

The input is the event list of a chrome trace as Kineto writes it (``prof.export_chrome_trace``, the
``traceEvents`` array; :func:`load_events` reads the file, gzipped or not):

- GPU activities: ``cat`` ``kernel``, ``gpu_memcpy`` or ``gpu_memset``; ``ts`` and ``dur`` in us on the
  host's clock; ``args.correlation`` (the id of the API call that launched it) and ``args.stream``.
- API calls: ``cat`` ``cuda_runtime`` or ``cuda_driver`` (``cudaLaunchKernel``, ``cudaLaunchKernelExC``,
  ``cuLaunchKernel``, ``cudaGraphLaunch``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...) with the
  same ``args.correlation``. CUPTI gives every kernel of a CUDA-graph replay the correlation id of its
  ``cudaGraphLaunch``, so a kernel's origin (replayed graph or eager launch) is read off that id.

A *gap* is an interval in which no GPU activity runs: activities sorted by start, the gap before one is
its start minus the latest end of all before it (activities that overlap, on other streams or through
programmatic dependent launch, leave none). The activity that ended last and the next one name the
gap, and the launch of the next one classifies it (:data:`GAP_KINDS`):

- ``in graph``: both from one graph replay; the GPU's own time between two graph nodes.
- ``graph launch, host late`` / ``eager, host late``: the next activity's launch call began after the
  GPU had gone idle, so the GPU waited for the host (Python, guards, the launch itself).
- ``graph launch, queued`` / ``eager, queued``: the launch call began before the GPU went idle; the gap
  is launch latency on the device side.
- ``unattributed``: no API call with the activity's correlation id in the trace.

Steps (:func:`step_windows`) are the intervals between the first activities of successive groups of
``per_step`` markers (graph launches, or device-to-host copies where nothing is replayed from a graph),
counted back from the last marker of the trace, so that the steps analysed are the steady ones at the
end of a ``generate`` call and the first step of the call (CUDA-graph recording) is left out.
"""

from __future__ import annotations

import bisect
import gzip
import json
import pathlib
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

#: Chrome-trace categories of GPU activities.
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Chrome-trace categories of host API calls.
API_CATS = ("cuda_runtime", "cuda_driver")
#: Prefixes of the API calls that replay a CUDA graph (CUPTI's runtime and driver names).
GRAPH_LAUNCH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch")
#: Name prefix of the device-to-host copies that mark steps where no graph is replayed.
DTOH_PREFIX = "Memcpy DtoH"
#: The gap kinds, in the order they are printed.
GAP_KINDS = ("in graph", "graph launch, host late", "graph launch, queued", "eager, host late", "eager, queued",
             "unattributed")
#: Characters kept of a kernel name in the tables (templates kept: they name our GEMM's config).
NAME_WIDTH = 110


class TraceError(ValueError):
    """A trace without what an analysis needs (GPU activities, enough steps)."""


@dataclass(frozen=True)
class Activity:
    """One GPU activity: ``name``, ``start`` / ``end`` (us), ``stream``, ``correlation`` (-1 if absent)."""

    name: str
    start: float
    end: float
    stream: int
    correlation: int


@dataclass(frozen=True)
class ApiCall:
    """One host API call (runtime or driver): ``name``, ``start`` / ``end`` (us), ``correlation``."""

    name: str
    start: float
    end: float
    correlation: int

    @property
    def is_graph_launch(self) -> bool:
        return self.name.startswith(GRAPH_LAUNCH_PREFIXES)


@dataclass(frozen=True)
class Trace:
    """A parsed trace: GPU ``activities`` sorted by start, API ``calls`` sorted by start, and the calls by
    correlation id."""

    activities: tuple[Activity, ...]
    calls: tuple[ApiCall, ...]
    by_correlation: dict
    starts: tuple[float, ...] = ()  # the activities' starts, for bisection

    def origin(self, a: Activity) -> ApiCall | None:
        """The API call that launched ``a`` (``None`` where the trace has none of its correlation id)."""
        return self.by_correlation.get(a.correlation)

    def graph_launches(self) -> list[ApiCall]:
        """The graph-replay calls, in start order."""
        return [c for c in self.calls if c.is_graph_launch]


@dataclass(frozen=True)
class Window:
    """One step: GPU interval ``[start, end)`` and host interval ``[host_start, host_end)`` (us)."""

    start: float
    end: float
    host_start: float
    host_end: float


def load_events(path: str | pathlib.Path) -> list[dict]:
    """The ``traceEvents`` of a chrome-trace JSON file (``.gz``: gzipped), or the file's list itself."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: expected a chrome trace (a list, or an object with 'traceEvents')")
    return events


def _correlation(e: dict) -> int:
    c = (e.get("args") or {}).get("correlation")
    return int(c) if c is not None else -1


def parse(events: Iterable[dict]) -> Trace:
    """The :class:`Trace` of chrome-trace ``events`` (complete ``"ph": "X"`` events of :data:`GPU_CATS` and
    :data:`API_CATS`; everything else, CPU ops and flow arrows included, is ignored)."""
    acts, calls = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat not in GPU_CATS and cat not in API_CATS:
            continue
        start = float(e["ts"])
        end = start + float(e.get("dur", 0.0))
        if cat in GPU_CATS:
            args = e.get("args") or {}
            acts.append(Activity(str(e.get("name", "?")), start, end, int(args.get("stream", e.get("tid", 0)) or 0),
                                 _correlation(e)))
        else:
            calls.append(ApiCall(str(e.get("name", "?")), start, end, _correlation(e)))
    acts.sort(key=lambda a: (a.start, a.end))
    calls.sort(key=lambda c: c.start)
    return Trace(tuple(acts), tuple(calls), {c.correlation: c for c in calls if c.correlation >= 0},
                 tuple(a.start for a in acts))


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` without a leading ``void`` and without its trailing parameter list (a final ``(...)`` that
    follows the name directly, as in a demangled kernel), cut to ``width`` characters:
    ``void ns::k<64, true>(CUtensorMap_st, int)`` -> ``ns::k<64, true>``; ``Memcpy DtoH (Device -> Pinned)``
    (a space before the parenthesis) and ``ns::(anonymous namespace)::k`` are kept."""
    s = name[5:] if name.startswith("void ") else name
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                if i > 0 and not s[i - 1].isspace():
                    s = s[:i]
                break
    return s[:width]


def count_calls(trace: Trace, prefix: str) -> int:
    """API calls whose name starts with ``prefix``."""
    return sum(c.name.startswith(prefix) for c in trace.calls)


def count_activities(trace: Trace, prefix: str) -> int:
    """GPU activities whose name starts with ``prefix``."""
    return sum(a.name.startswith(prefix) for a in trace.activities)


def _markers(trace: Trace, marker: str) -> list[tuple[Activity, ApiCall | None]]:
    """(first activity, its launch call) of each marker: each graph launch that ran an activity, or each
    device-to-host copy."""
    if marker == "graph":
        first: dict[int, Activity] = {}
        for a in trace.activities:
            first.setdefault(a.correlation, a)
        return [(first[c.correlation], c) for c in trace.graph_launches() if c.correlation in first]
    if marker == "dtoh":
        return [(a, trace.origin(a)) for a in trace.activities if a.name.startswith(DTOH_PREFIX)]
    raise ValueError(f"marker: expected 'graph' or 'dtoh', got {marker!r}")


def step_windows(trace: Trace, steps: int, per_step: int = 1, marker: str = "graph") -> list[Window]:
    """The last ``steps`` complete steps of ``trace``: a step starts at the first activity of a group of
    ``per_step`` consecutive markers (``graph``: graph launches; ``dtoh``: device-to-host copies) and ends
    where the next group starts; groups are counted back from the last marker, whose group (the last
    step, followed by the end of the call) is not analysed. Fewer steps where the trace has fewer
    (``TraceError`` below one)."""
    if steps < 1 or per_step < 1:
        raise ValueError(f"steps and per_step: expected >= 1, got {steps}, {per_step}")
    marks = _markers(trace, marker)
    groups = len(marks) // per_step
    n = min(steps, groups - 1)
    if n < 1:
        raise TraceError(f"{len(marks)} {marker} markers at {per_step} a step: no complete step")
    out = []
    last = len(marks)
    for j in range(n, 0, -1):
        a0, c0 = marks[last - (j + 1) * per_step]
        a1, c1 = marks[last - j * per_step]
        out.append(Window(a0.start, a1.start, c0.start if c0 else a0.start, c1.start if c1 else a1.start))
    return out


def _kind(trace: Trace, prev: Activity, nxt: Activity) -> str:
    call = trace.origin(nxt)
    if call is None:
        return "unattributed"
    if call.is_graph_launch:
        if prev.correlation == nxt.correlation:
            return "in graph"
        return "graph launch, host late" if call.start > prev.end else "graph launch, queued"
    return "eager, host late" if call.start > prev.end else "eager, queued"


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (us): the time some activity runs."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def window_gaps(trace: Trace, w: Window) -> tuple[list[Activity], list[tuple[Activity, Activity, float, str]]]:
    """The activities starting in ``w`` (clipped to its end) and its gaps ``(before, after, us, kind)``;
    the gap before the first activity of the next window ends the list."""
    lo = bisect.bisect_left(trace.starts, w.start)
    acts = []
    for a in trace.activities[lo:]:
        if a.start >= w.end:
            nxt = a
            break
        acts.append(a)
    else:
        nxt = None
    gaps = []
    last: Activity | None = None
    for a in [*acts, *([nxt] if nxt is not None else [])]:
        if last is not None and a.start > last.end:
            gaps.append((last, a, a.start - last.end, _kind(trace, last, a)))
        if last is None or a.end > last.end:
            last = a
    return acts, gaps


def analyze(trace: Trace, windows: list[Window], category: Callable[[str], str] | None = None,
            top: int = 25) -> dict:
    """Per-step figures of ``windows`` (:func:`step_windows`) of ``trace``, JSON-ready:

    ``steps``; ``span_us`` / ``busy_us`` / ``idle_us`` (median over the steps; span = the window, busy =
    the union of its activities); ``host_step_us`` (median host window, marker launch to marker launch);
    ``idle_by_kind`` (us a step, mean, by :data:`GAP_KINDS`); ``kernels`` (a step: ``total``, ``graph``
    (replayed), ``eager``); ``categories`` (activities a step by
    ``category(name)``, where given); ``api`` (API calls a step by name, host window) and
    ``graph_launches`` (a step); ``eager``: the ``top`` activities not replayed from a graph by GPU time
    (``name``, ``count`` and ``us`` a step); ``pairs``: the ``top`` ``(before, after)`` name pairs by idle time, each
    ``count`` and ``us`` a step, ``median_us`` of its gaps and its most common ``kind``; ``category_pairs``:
    the same by ``(category(before), category(after))`` (where ``category`` is given).
    """
    if not windows:
        raise TraceError("no steps to analyse")
    n = len(windows)
    spans, busys, idles, hosts = [], [], [], []
    kinds: Counter = Counter()
    origin: Counter = Counter()
    cats: Counter = Counter()
    api: Counter = Counter()
    eager: dict[str, list] = defaultdict(list)
    pairs: dict[tuple[str, str], list] = defaultdict(list)
    cpairs: dict[tuple[str, str], list] = defaultdict(list)
    pair_kinds: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for w in windows:
        acts, gaps = window_gaps(trace, w)
        busy = busy_us([(a.start, min(a.end, w.end)) for a in acts])
        spans.append(w.end - w.start)
        hosts.append(w.host_end - w.host_start)
        busys.append(busy)
        idles.append(w.end - w.start - busy)
        for a in acts:
            call = trace.origin(a)
            replayed = call is not None and call.is_graph_launch
            origin["graph" if replayed else "eager"] += 1
            if not replayed:
                eager[short_name(a.name)].append(min(a.end, w.end) - a.start)
            if category is not None:
                cats[category(a.name)] += 1
        for c in trace.calls:
            if w.host_start <= c.start < w.host_end:
                api[c.name] += 1
        for before, after, us, kind in gaps:
            key = (short_name(before.name), short_name(after.name))
            pairs[key].append(us)
            pair_kinds[key][kind] += 1
            kinds[kind] += us
            if category is not None:
                cpairs[(category(before.name), category(after.name))].append(us)

    def table(d: dict, with_kind: bool) -> list[dict]:
        rows = []
        for (b, a), v in d.items():
            row = dict(before=b, after=a, count=len(v) / n, us=sum(v) / n, median_us=statistics.median(v))
            if with_kind:
                row["kind"] = pair_kinds[(b, a)].most_common(1)[0][0]
            rows.append(row)
        return sorted(rows, key=lambda r: -r["us"])

    return dict(
        steps=n,
        span_us=statistics.median(spans), busy_us=statistics.median(busys), idle_us=statistics.median(idles),
        host_step_us=statistics.median(hosts),
        idle_by_kind={k: kinds.get(k, 0.0) / n for k in GAP_KINDS},
        kernels=dict(total=sum(origin.values()) / n, graph=origin["graph"] / n, eager=origin["eager"] / n),
        categories={k: v / n for k, v in sorted(cats.items())},
        api={k: v / n for k, v in sorted(api.items())},
        graph_launches=sum(v for k, v in api.items() if k.startswith(GRAPH_LAUNCH_PREFIXES)) / n,
        eager=sorted((dict(name=k, count=len(v) / n, us=sum(v) / n) for k, v in eager.items()),
                     key=lambda r: -r["us"])[:top],
        pairs=table(pairs, True)[:top],
        category_pairs=table(cpairs, False)[:top] if category is not None else [],
    )


__all__ = ["API_CATS", "Activity", "ApiCall", "GAP_KINDS", "GPU_CATS", "Trace", "TraceError", "Window", "analyze",
           "busy_us", "count_activities", "count_calls", "load_events", "parse", "short_name", "step_windows", "window_gaps"]
