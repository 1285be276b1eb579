"""Where a compiled decode step's host time goes: BF16 against FP8, Python function by function.

``python -m benchmarks.host_profile`` builds the Llama-3-8B-shaped model of ``benchmarks/e2e.py``
(``benchmarks/common/random_model.py``: random weights, full depth unless ``--layers``) and, per path
(``bf16``, each ``--presets`` preset, with ``--fuse`` its ``+fused`` form) and batch, runs transformers'
compiled static-cache ``generate`` once to compile and capture and once more to warm, then four steady
calls, all with one static-cache shape (``max_new_tokens = --new-tokens + --extra-tokens``, the
shorter call stopped by a criterion, as ``benchmarks/step_profile.py`` does):

1. ``--new-tokens`` tokens, garbage collection off (as ``e2e`` and ``step_profile`` time it);
2. ``--new-tokens + --extra-tokens`` tokens, garbage collection off: the reference step;
3. the same with garbage collection on, every collection timed through ``gc.callbacks``;
4. the same under ``cProfile``, garbage collection off.

The steady window of a long call is its last ``--extra-tokens`` decode steps, from the streamer's stamp
of token ``--new-tokens`` to that of the last token (prefill and the first decode step, which
re-records the CUDA graph for the call's new static cache, lie before it); every figure is per step of
that window. ``cProfile`` runs only inside the window (enabled and disabled from the streamer), so its
function times need no difference of two calls; call 1 gives the wall per step by difference too.

Per path and batch it reports: the wall per step (window, by difference, with garbage collection, and
under cProfile: the profiler's overhead, per step and per profiled call); the step split by a clock
around transformers' compiled call (``model._compiled_call``: dynamo's guards, the compiled graph's
wrappers, CUDA-graph tree bookkeeping, the input copy and the graph launch all happen inside it): host
time before it (from the previous token's stamp: ``generate``'s stop check, its loop and
``prepare_inputs_for_generation``), inside it, and after it (``generate``'s logits processing, argmax,
stopping criteria and the token's copy to the host, which waits for the GPU), and on CUDA the GPU span
of the compiled call (an event recorded before it and one after it: the time from the GPU reaching the
call to its last kernel); the garbage collections in the window (count and ms per step, by
generation, the longest pause); the top Python functions by total (own) time and by cumulative time,
per step, with calls per step; and per FP8 path the functions whose own time differs most from the
BF16 row of the same batch, and the phases' differences. The functions that wait for the GPU
(``Tensor.cpu``, ``Tensor.item``, ``synchronize``) are marked: their time is the GPU's, not the host's.

Off CUDA (``--tiny --device cpu``: a check of the script) transformers does not compile ``generate``
by itself; the script passes a ``CompileConfig`` for all devices with ``--compile-backend`` (default
``eager`` there: dynamo, its guards and the call path, without inductor's C++ build).

The JSON (``--out``, rewritten after every cell) holds the same figures: 40 functions by own time and
by cumulative time, 25 rows of the difference against BF16. ``--budget-s`` skips the cells that would
not fit (listed in the table and the JSON).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pathlib
import pstats
import re
import statistics
import time

import torch

from benchmarks.common.budget import Budget
from benchmarks.common.decode_args import add_decode_args, path_list
from benchmarks.common.cuda_clock import is_cuda, sync
from benchmarks.common.fp8_swap import calibrate, decoder_linears, fp8_layers, swap_in
from benchmarks.common.generate_clock import StepClock, reset_compiled, stop_after, timed_generate
from benchmarks.common.random_model import build_model, prompt_ids
from benchmarks.common.results import RESULTS_DIR, environment, rewrite_json
from fp8_linear import fuse_projections, unfuse_projections

#: Functions whose time is a wait for the GPU (regular expressions on the function's label).
WAITS = (r"method 'cpu' of", r"method 'item' of", r"method 'tolist' of", r"synchronize")
#: Functions kept in the JSON, by own time and by cumulative time; rows printed of each.
KEEP, SHOWN = 40, 15
#: Rows of the difference against BF16 kept in the JSON / printed.
DIFF_KEEP, DIFF_SHOWN = 25, 12
#: Path prefixes removed from a function's file name (site-packages, the repository).
ROOTS = (r".*/site-packages/", re.escape(str(pathlib.Path(__file__).resolve().parents[1])) + "/")


class WindowClock(StepClock):
    """A :class:`StepClock` that runs ``profiler`` (a ``cProfile.Profile``, or ``None``) from its stamp
    ``start`` to its stamp ``stop`` (stamp 0 is the prompt, stamp ``k`` the ``k``-th new token): enabled
    just after stamp ``start``, disabled just before stamp ``stop``, so the window's wall holds all it
    profiled."""

    def __init__(self, start: int, stop: int, profiler: cProfile.Profile | None = None):
        super().__init__()
        self.start, self.stop, self.profiler = start, stop, profiler

    def put(self, value) -> None:
        k = len(self.stamps)
        if k == self.stop and self.profiler is not None:
            self.profiler.disable()
        super().put(value)
        if k == self.start and self.profiler is not None:
            self.profiler.enable()

    def window(self) -> tuple[float, float]:
        """Host seconds (``time.perf_counter``) of the window's first and last stamps."""
        if len(self.stamps) <= self.stop:
            raise RuntimeError(f"generate streamed {len(self.stamps)} stamps, the window needs {self.stop + 1}")
        return self.stamps[self.start], self.stamps[self.stop]


class CallClock:
    """Stands in for transformers' compiled decode call (``model._compiled_call``): per call the host
    ``perf_counter`` at entry and exit, and with ``cuda`` a CUDA event recorded before and after it."""

    def __init__(self, fn, cuda: bool):
        self.fn, self.cuda = fn, cuda
        self.calls: list[tuple[float, float, object, object]] = []

    def __call__(self, *args, **kwargs):
        e0 = e1 = None
        if self.cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        t1 = time.perf_counter()
        if self.cuda:
            e1 = torch.cuda.Event(enable_timing=True)
            e1.record()
        self.calls.append((t0, t1, e0, e1))
        return out


def install_call_clock(model, cuda: bool) -> CallClock:
    """Wrap ``model._compiled_call`` (made by the first compiled ``generate``; ``RuntimeError`` if there
    is none: ``generate`` did not compile) in a new :class:`CallClock`, or re-arm the one already there."""
    fn = model.__dict__.get("_compiled_call")
    if fn is None:
        raise RuntimeError("generate made no compiled call (model._compiled_call): nothing compiled the decode step")
    clock = CallClock(fn.fn if isinstance(fn, CallClock) else fn, cuda)
    model.__dict__["_compiled_call"] = clock
    return clock


class GcClock:
    """Times every garbage collection while entered (``gc.callbacks``): ``(start s, pause s, generation)``."""

    def __init__(self):
        self.events: list[tuple[float, float, int]] = []
        self._t0 = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.events.append((self._t0, time.perf_counter() - self._t0, info["generation"]))
            self._t0 = None

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def gc_per_step(events: list[tuple[float, float, int]], window: tuple[float, float], steps: int) -> dict:
    """The collections that began inside ``window`` (host seconds): per generation the count and ms per
    step, their total, and the longest pause in ms."""
    inside = [e for e in events if window[0] <= e[0] < window[1]]
    by_gen = {f"gen{g}": dict(count=sum(1 for e in inside if e[2] == g) / steps,
                              ms=sum(e[1] for e in inside if e[2] == g) * 1e3 / steps) for g in range(3)}
    return dict(by_generation=by_gen, count=len(inside) / steps, ms=sum(e[1] for e in inside) * 1e3 / steps,
                max_pause_ms=max((e[1] * 1e3 for e in inside), default=0.0), thresholds=list(gc.get_threshold()))


def phases(calls: CallClock, clock: WindowClock, steps: int) -> dict:
    """Per step of the window, in us: host time from the token's stamp before each compiled call to the
    call (``before_call_us``), inside the call (``in_call_us``), from its return to the next stamp
    (``after_call_us``, which waits for the GPU), and on CUDA ``gpu_call_us``, the GPU span between the
    events around the call; ``calls`` the compiled calls in the window a step (1 for one graph a step)."""
    lo, hi = clock.window()
    inside = [c for c in calls.calls if lo <= c[0] < hi]
    out = dict(calls=len(inside) / steps, before_call_us=0.0, in_call_us=0.0, after_call_us=0.0, gpu_call_us=None)
    if not inside:
        return out
    stamps = clock.stamps
    for t0, t1, _, _ in inside:
        out["before_call_us"] += (t0 - max(s for s in stamps if s <= t0)) * 1e6 / steps
        out["in_call_us"] += (t1 - t0) * 1e6 / steps
        out["after_call_us"] += (min(s for s in stamps if s >= t1) - t1) * 1e6 / steps
    if calls.cuda:
        out["gpu_call_us"] = sum(e0.elapsed_time(e1) for _, _, e0, e1 in inside) * 1e3 / steps
    return out


def label(func: tuple[str, int, str]) -> str:
    """A function of ``pstats`` (``(file, line, name)``) as ``file:line(name)``, the file relative to
    site-packages or the repository; a built-in as its name. Code generated per compile is named alike
    for every path, so that the difference against BF16 pairs it: inductor's output modules
    (``.../torchinductor_<user>/<xx>/<hash>.py``) as ``<inductor code>(name)``, an FX graph's
    ``<eval_with_key>.N`` as ``<eval_with_key>``."""
    file, line, name = func
    if file == "~":
        return name
    if re.search(r"torchinductor_[^/]*/", file):
        return f"<inductor code>({name})"
    file = re.sub(r"^<eval_with_key>\.\d+$", "<eval_with_key>", file)
    for root in ROOTS:
        file = re.sub("^" + root, "", file)
    return f"{file}:{line}({name})"


def function_times(prof: cProfile.Profile, steps: int) -> dict[str, dict]:
    """Per step of the profiled window, for every function ``cProfile`` saw: ``calls``, own time
    ``tottime_us`` and ``cumtime_us`` (a recursive function's cumulative time counted once), and
    ``wait`` (the function waits for the GPU, :data:`WAITS`)."""
    out: dict[str, dict] = {}
    for func, (_, nc, tt, ct, _) in pstats.Stats(prof).stats.items():
        name = label(func)
        row = out.setdefault(name, dict(calls=0.0, tottime_us=0.0, cumtime_us=0.0,
                                        wait=any(re.search(w, name) for w in WAITS)))
        row["calls"] += nc / steps
        row["tottime_us"] += tt * 1e6 / steps
        row["cumtime_us"] += ct * 1e6 / steps
    return out


def window_us(clock: WindowClock, steps: int) -> float:
    """Wall us per step of the clock's window."""
    lo, hi = clock.window()
    return (hi - lo) * 1e6 / steps


def ranked(funcs: dict[str, dict], key: str, n: int) -> list[dict]:
    """The ``n`` functions of :func:`function_times` with the largest ``key``, as rows with ``name``."""
    return [dict(name=k, **v) for k, v in sorted(funcs.items(), key=lambda kv: -kv[1][key])[:n]]


def profile_cell(model, batch: int, prompt: int, new: int, extra: int, device: str, compile_kw: dict) -> tuple[dict, dict]:
    """The figures of one path at ``batch`` (module docstring: compile, warm, four steady calls), per
    steady step; returns the JSON cell and every function's times (for the difference against BF16)."""
    if new < 2 or extra < 1:
        raise ValueError(f"--new-tokens >= 2 (the window starts after the first decode step) and --extra-tokens >= 1, "
                         f"got {new}, {extra}")
    ids = prompt_ids(model.config.vocab_size, batch, prompt, device)
    total = new + extra
    kw = dict(cache_implementation="static", **compile_kw)
    cuda = is_cuda(device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        timed_generate(model, ids, total, kw)  # compile and capture
        compile_s = time.perf_counter() - t0
        timed_generate(model, ids, total, kw)  # warm
        frames0 = dict(torch._dynamo.utils.counters["frames"])

        def steady(clock: WindowClock, n: int, gc_off: bool = True) -> CallClock:
            calls = install_call_clock(model, cuda)
            sync(device)
            timed_generate(model, ids, total, dict(kw, stopping_criteria=stop_after(prompt + n)), clock=clock,
                           gc_off=gc_off)
            return calls

        short = WindowClock(1, new)
        steady(short, new)
        plain = WindowClock(new, total)
        plain_calls = steady(plain, total)
        with GcClock() as collections:
            with_gc = WindowClock(new, total)
            steady(with_gc, total, gc_off=False)
        prof = cProfile.Profile()
        profiled = WindowClock(new, total, prof)
        prof_calls = steady(profiled, total)
    frames = {k: v - frames0.get(k, 0) for k, v in torch._dynamo.utils.counters["frames"].items() if v != frames0.get(k, 0)}
    funcs = function_times(prof, extra)
    wall, prof_wall = window_us(plain, extra), window_us(profiled, extra)
    calls_a_step = sum(f["calls"] for f in funcs.values())
    overhead = prof_wall - wall
    per_call = max(overhead, 0.0) / calls_a_step if calls_a_step else 0.0  # below 0: noise above the overhead
    for f in funcs.values():
        f["net_us"] = f["tottime_us"] - f["calls"] * per_call  # a rough correction: may go below 0
    attributed = sum(f["tottime_us"] for f in funcs.values())
    cell = dict(
        steps=extra, compile_s=compile_s,
        wall_us=wall, wall_by_difference_us=step_by_difference(short, plain, new, total),
        median_step_us=statistics.median(b - a for a, b in zip(plain.stamps[new:], plain.stamps[new + 1:])) * 1e6,
        phases=phases(plain_calls, plain, extra),
        gc_on=dict(wall_us=window_us(with_gc, extra), **gc_per_step(collections.events, with_gc.window(), extra)),
        cprofile=dict(wall_us=prof_wall, overhead_us=overhead, profiled_calls=calls_a_step,
                      overhead_per_call_us=per_call, attributed_us=attributed, unattributed_us=prof_wall - attributed,
                      wait_us=sum(f["tottime_us"] for f in funcs.values() if f["wait"]),
                      phases=phases(prof_calls, profiled, extra)),
        dynamo_frames_in_steady_calls=frames,
        by_tottime=ranked(funcs, "tottime_us", KEEP), by_cumtime=ranked(funcs, "cumtime_us", KEEP))
    return cell, funcs


def step_by_difference(short: WindowClock, long: WindowClock, new: int, total: int) -> float:
    """Wall us per step of ``long`` (``total`` tokens) minus ``short`` (``new`` tokens), each from the
    call's first stamp (the prompt) to its last, over the ``total - new`` steps ``long`` adds."""
    return ((long.stamps[total] - long.stamps[0]) - (short.stamps[new] - short.stamps[0])) * 1e6 / (total - new)


def diff_against(base: tuple[dict, dict], other: tuple[dict, dict]) -> dict:
    """``other`` minus ``base`` (two :func:`profile_cell` results of one batch): the phases and walls, and
    the :data:`DIFF_KEEP` functions whose own time per step differs most (either sign)."""
    (bc, bf), (oc, of) = base, other
    keys = ("before_call_us", "in_call_us", "after_call_us", "gpu_call_us")
    ph = {k: (oc["phases"][k] - bc["phases"][k]) if oc["phases"][k] is not None and bc["phases"][k] is not None else None
          for k in keys}
    rows = []
    for name in set(bf) | set(of):
        b, o = bf.get(name), of.get(name)
        d = (o["tottime_us"] if o else 0.0) - (b["tottime_us"] if b else 0.0)
        rows.append(dict(name=name, tottime_us=d, calls=(o["calls"] if o else 0.0) - (b["calls"] if b else 0.0),
                         base_us=b["tottime_us"] if b else 0.0, wait=(o or b)["wait"]))
    rows.sort(key=lambda r: -abs(r["tottime_us"]))
    return dict(wall_us=oc["wall_us"] - bc["wall_us"], cprofile_wall_us=oc["cprofile"]["wall_us"] - bc["cprofile"]["wall_us"],
                phases=ph, functions=rows[:DIFF_KEEP])


def short_name(name: str, width: int = 90) -> str:
    """A function label cut to its last ``width`` characters."""
    return name if len(name) <= width else "..." + name[-(width - 3):]


def print_cell(path: str, batch: int, c: dict) -> None:
    """Print one :func:`profile_cell` result: the walls, the phases, the collections, the top functions."""
    p, g, cp = c["phases"], c["gc_on"], c["cprofile"]
    gpu = f" (GPU span of the call {p['gpu_call_us']:.0f})" if p["gpu_call_us"] is not None else ""
    print(f"\n{path}, batch {batch}: per steady decode step ({c['steps']} steps), us: wall {c['wall_us']:.0f} "
          f"(median {c['median_step_us']:.0f}, by difference {c['wall_by_difference_us']:.0f}; compile {c['compile_s']:.1f} s)")
    print(f"  host: before the compiled call {p['before_call_us']:.0f}, in it {p['in_call_us']:.0f}{gpu}, after it "
          f"{p['after_call_us']:.0f} (waits for the GPU); {p['calls']:.1f} compiled calls a step")
    gens = ", ".join(f"{k} {v['count']:.2f}x {v['ms']:.3f} ms" for k, v in g["by_generation"].items())
    print(f"  gc on: wall {g['wall_us']:.0f}; collections a step {g['count']:.2f}, {g['ms']:.3f} ms ({gens}); "
          f"longest {g['max_pause_ms']:.3f} ms")
    print(f"  cProfile: wall {cp['wall_us']:.0f} (+{cp['overhead_us']:.0f} over {cp['profiled_calls']:.0f} calls, "
          f"{cp['overhead_per_call_us']:.2f} a call); functions' own time {cp['attributed_us']:.0f}, of it waiting for the "
          f"GPU {cp['wait_us']:.0f}; not in a profiled function {cp['unattributed_us']:.0f}; in the compiled call "
          f"{cp['phases']['in_call_us']:.0f}")
    if c["dynamo_frames_in_steady_calls"]:
        print(f"  dynamo frames during the steady calls: {c['dynamo_frames_in_steady_calls']}")
    for title, key in (("own time", "tottime_us"), ("cumulative time", "cumtime_us")):
        print(f"  top by {title}, us a step:\n    {'own':>9} {'net':>9} {'cum':>9} {'calls':>7}  function")
        for r in c["by_tottime" if key == "tottime_us" else "by_cumtime"][:SHOWN]:
            print(f"    {r['tottime_us']:9.1f} {r['net_us']:9.1f} {r['cumtime_us']:9.1f} {r['calls']:7.1f}  "
                  f"{'[GPU wait] ' if r['wait'] else ''}{short_name(r['name'])}")


def print_diff(path: str, batch: int, d: dict) -> None:
    """Print one :func:`diff_against` result."""
    ph = ", ".join(f"{k.removesuffix('_us')} {v:+.0f}" for k, v in d["phases"].items() if v is not None)
    print(f"\n{path} - bf16, batch {batch}: wall {d['wall_us']:+.0f} us a step (under cProfile {d['cprofile_wall_us']:+.0f}); {ph}")
    print(f"  {'own us':>9} {'calls':>7} {'bf16 us':>8}  function")
    for r in d["functions"][:DIFF_SHOWN]:
        print(f"  {r['tottime_us']:+9.1f} {r['calls']:+7.1f} {r['base_us']:8.1f}  {'[GPU wait] ' if r['wait'] else ''}"
              f"{short_name(r['name'])}")


def save(rows: list[dict], skipped: list[str], args, backend: str | None, written: pathlib.Path | None) -> pathlib.Path:
    """Write the JSON of the cells so far (the skipped ones in its meta) and delete the previous one
    (``written``) once the new one is whole; returns the new path."""
    meta = environment(dict(args=vars(args), skipped=skipped, compile_backend=backend or "transformers' default"))
    return rewrite_json("host-profile", meta, rows, args.out or RESULTS_DIR, written)


def print_summary(rows: list[dict], skipped: list[str]) -> None:
    """One line a cell (the wall and its split around the compiled call, collections, cProfile's
    overhead), then the skipped cells."""
    print(f"\n{'path':24s} {'batch':>5} {'wall':>7} {'before':>7} {'in call':>7} {'after':>7} {'gpu':>7} {'gc ms':>6} "
          f"{'prof+':>6}  (us a steady step; gc ms a step with collection on; prof+: cProfile's overhead)")
    for r in rows:
        p = r["phases"]
        gpu = f"{p['gpu_call_us']:7.0f}" if p["gpu_call_us"] is not None else f"{'-':>7}"
        print(f"{r['path']:24s} {r['batch']:5d} {r['wall_us']:7.0f} {p['before_call_us']:7.0f} {p['in_call_us']:7.0f} "
              f"{p['after_call_us']:7.0f} {gpu} {r['gc_on']['ms']:6.3f} {r['cprofile']['overhead_us']:6.0f}")
    print("\n".join(f"skipped {line}" for line in skipped))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_args(ap, presets="fp8-channel", batches="64", new_tokens=4, extra_tokens=8,
                    new_help="tokens of the shorter call; the steady window starts at this token (at least 2)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend of generate's decode step (default: transformers' own, inductor with "
                         "CUDA graphs, on CUDA; eager elsewhere)")
    args = ap.parse_args(argv)
    if is_cuda(args.device) and not torch.cuda.is_available():
        raise SystemExit("host_profile: needs a CUDA GPU (or --tiny --device cpu to check the script)")
    compile_kw = {}
    backend = args.compile_backend or (None if is_cuda(args.device) else "eager")
    if backend is not None:
        from transformers import CompileConfig

        cfg = CompileConfig(backend=backend, mode="reduce-overhead" if backend == "inductor" else None)
        cfg._compile_all_devices = True  # transformers compiles on CUDA only unless told
        compile_kw = dict(compile_config=cfg)
    clock = Budget(args.budget_s, args.cell_guess_s, reserve_s=5.0)
    batches = [int(b) for b in args.batches.split(",")]
    presets = [p for p in args.presets.split(",") if p]
    paths = path_list(presets, args.fuse, args.fused_only)
    model = build_model(args.model, args.layers, args.device, args.tiny)
    bf16 = decoder_linears(model)
    amax = calibrate(model)
    cells: dict[tuple[str, int], tuple[dict, dict]] = {}
    rows, skipped, written = [], [], None
    for path in paths:
        if not clock.allows_compile(2 if path == "bf16" else len(batches)):
            skipped.append(f"{path}: {clock.why()}")
            print(f"\n{path}: skipped ({clock.why()})")
            continue
        try:
            if path != "bf16":
                swap_in(model, fp8_layers(bf16, path.split("+")[0], amax))
                if path.endswith("+fused"):
                    fuse_projections(model)
            for b in batches:
                if path != "bf16" and not clock.allows_compile(1):
                    skipped.append(f"{path}/b{b}: {clock.why()}")
                    print(f"\n{path}, batch {b}: skipped ({clock.why()})")
                    continue
                t0 = time.perf_counter()
                reset_compiled(model)
                cells[path, b] = cell, funcs = profile_cell(model, b, args.prompt, args.new_tokens, args.extra_tokens,
                                                            args.device, compile_kw)
                clock.compiled(time.perf_counter() - t0)
                print_cell(path, b, cell)
                row = dict(path=path, batch=b, **cell)
                if path != "bf16" and ("bf16", b) in cells:
                    row["diff_vs_bf16"] = diff_against(cells["bf16", b], (cell, funcs))
                    print_diff(path, b, row["diff_vs_bf16"])
                rows.append(row)
                written = save(rows, skipped, args, backend, written)
        finally:
            unfuse_projections(model)
            swap_in(model, bf16)
            reset_compiled(model)
    print_summary(rows, skipped)
    if skipped or written is None:  # the skips after the last cell, or no cell at all
        written = save(rows, skipped, args, backend, written)
    print(f"\nwrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
