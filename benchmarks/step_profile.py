"""Where a compiled decode step's GPU time goes: BF16 against FP8, kernel by kernel.

``python -m benchmarks.step_profile`` builds the Llama-3-8B-shaped model of ``benchmarks/e2e.py``
(``benchmarks/common/random_model.py``: random weights, full depth unless ``--layers``), runs
transformers' compiled static-cache ``generate`` once per path and batch (compile and CUDA-graph capture), then profiles two more calls, of
``--new-tokens`` and of ``--new-tokens + --extra-tokens`` tokens, under ``torch.profiler``; their
difference divided by ``--extra-tokens`` is one steady decode step (prefill, the first step's graph
recording and per-call costs cancel). Every GPU kernel is sorted into a category (our FP8 GEMM,
our activation quantization, cuBLAS GEMMs, attention, inductor's Triton kernels,
copies, other). Per path and batch it prints, per decode step: the kernel count and GPU time of each
category, the GPU busy time (the union of kernel intervals) and the idle time between kernels
(span minus busy time), and the host wall time. This locates a difference between two paths' "rest" of the step
(``benchmarks/e2e.py`` reports step = linear layers + rest) in kernels or in gaps.

The JSON (``--out``) holds the same figures plus the 12 most expensive kernel names of each path.

``--gaps`` also exports the longer call's trace (``step-trace-<path>-b<batch>.json.gz`` beside the JSON)
and analyses its last ``--extra-tokens`` steady decode steps one by one (``benchmarks/common/trace_gaps.py``):
per step the GPU span, busy and idle time, the idle split by kind (inside a CUDA-graph replay, waiting
for the host's next launch, launch latency), the kernels launched from graph replays and eagerly, the
API calls (``cudaGraphLaunch`` and the launches), and the idle gaps by the pair of kernels around them.
``--no-pdl`` adds each FP8 path again with our kernels' programmatic dependent launch off
(``<path>+nopdl``), a control for gaps next to our kernels; ``--fused-only`` keeps only the fused rows
of ``--fuse``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import pathlib
import re
import shutil
import tempfile
import time

import torch

from benchmarks.common import trace_gaps
from benchmarks.common.trace_gaps import busy_us
from benchmarks.common.budget import Budget
from benchmarks.common.decode_args import add_decode_args, path_list
from benchmarks.common.kernel_names import CATEGORIES, category, kernel_totals  # noqa: F401 - re-exported
from benchmarks.common.cuda_clock import is_cuda, sync
from benchmarks.common.fp8_swap import calibrate, decoder_linears, fp8_layers, swap_in
from benchmarks.common.generate_clock import reset_compiled, stop_after, timed_generate
from benchmarks.common.random_model import build_model, prompt_ids
from benchmarks.common.results import RESULTS_DIR, environment, rewrite_json
from fp8_linear import fuse_projections, unfuse_projections

#: Gap pairs printed per path with ``--gaps`` (the JSON keeps trace_gaps' top 25).
GAP_ROWS = 15


def profile_generate(model, ids: torch.Tensor, new: int, max_new: int, trace: pathlib.Path | None = None) -> dict:
    """One greedy compiled static-cache ``generate`` (cache sized for ``max_new`` tokens) stopped after
    ``new`` tokens, under the profiler: kernel counts and GPU us by category, GPU us by kernel name,
    busy (union of kernels) and span us, host wall us; the chrome trace written to ``trace`` if given."""
    from torch.profiler import ProfilerActivity, profile

    kw = dict(cache_implementation="static", stopping_criteria=stop_after(ids.shape[1] + new))
    activity = ProfilerActivity.CUDA if ids.is_cuda else ProfilerActivity.CPU  # CPU: a check of the script
    with torch.inference_mode():
        sync(ids.device)
        with profile(activities=[activity]) as prof:
            t0 = time.perf_counter()
            timed_generate(model, ids, max_new, kw)
            sync(ids.device)
            wall_us = (time.perf_counter() - t0) * 1e6
    cats, names, intervals = kernel_totals(prof)
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    return dict(categories=cats, names=names, busy_us=busy_us(intervals), span_us=span, wall_us=wall_us)


def per_step(short: dict, long: dict, steps: int) -> dict:
    """Per decode step: ``(long - short) / steps`` of every figure of two :func:`profile_generate` results
    (prefill, the first step's CUDA-graph recording and the call's fixed costs cancel)."""
    cats = {}
    for k in set(short["categories"]) | set(long["categories"]):
        a = short["categories"].get(k, dict(count=0, us=0.0))
        b = long["categories"].get(k, dict(count=0, us=0.0))
        cats[k] = dict(count=(b["count"] - a["count"]) / steps, us=(b["us"] - a["us"]) / steps)
    names = {n: (long["names"].get(n, 0.0) - short["names"].get(n, 0.0)) / steps for n in long["names"]}
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    busy = (long["busy_us"] - short["busy_us"]) / steps
    span = (long["span_us"] - short["span_us"]) / steps
    return dict(categories=dict(sorted(cats.items())), busy_us=busy, span_us=span, idle_us=span - busy,
                wall_us=(long["wall_us"] - short["wall_us"]) / steps,
                top=[dict(name=n[:160], us=u) for n, u in top])


def step_gaps(short: trace_gaps.Trace, long: trace_gaps.Trace, extra: int) -> dict:
    """:func:`trace_gaps.analyze` of the last ``extra`` steps of the ``long`` call's trace, the steps marked
    by graph launches (as many a step as ``long`` has more than ``short``, over ``extra``), or by
    device-to-host copies where no graph is replayed; with ``marker``, ``markers_per_step`` and the
    per-step difference of graph launches and of kernels between the two calls; ``{"error": why}`` for a
    trace without steps to analyse (no GPU activities: a CPU run)."""
    graphs = (len(long.graph_launches()) - len(short.graph_launches())) / extra
    if graphs >= 0.5:
        marker, per = "graph", round(graphs)
    else:
        dtoh = trace_gaps.DTOH_PREFIX
        marker = "dtoh"
        per = max(1, round((trace_gaps.count_activities(long, dtoh) - trace_gaps.count_activities(short, dtoh)) / extra))
    try:
        r = trace_gaps.analyze(long, trace_gaps.step_windows(long, extra, per, marker), category)
    except trace_gaps.TraceError as e:
        return dict(error=str(e), marker=marker)
    r.update(marker=marker, markers_per_step=per, graph_launches_by_difference=graphs,
             kernels_by_difference=(len(long.activities) - len(short.activities)) / extra)
    return r


def profile_decode(model, batch: int, prompt: int, new: int, extra: int, traces: pathlib.Path | None = None,
                   label: str = "", device: str = "cuda") -> dict:
    """Per-step figures of compiled static-cache decode at ``batch``: ``generate`` of ``new`` and of
    ``new + extra`` tokens, each profiled, after a warm-up call that compiles and captures. With
    ``traces`` (a folder), also :func:`step_gaps` (key ``gaps``) and the longer call's trace saved there
    gzipped, as ``step-trace-<label>-b<batch>.json.gz``."""
    ids = prompt_ids(model.config.vocab_size, batch, prompt, device)
    with torch.inference_mode():
        timed_generate(model, ids, new + extra, dict(cache_implementation="static"))
    with tempfile.TemporaryDirectory() if traces is not None else contextlib.nullcontext() as tmp:
        paths = (pathlib.Path(tmp) / "short.json", pathlib.Path(tmp) / "long.json") if tmp else (None, None)
        short = profile_generate(model, ids, new, new + extra, paths[0])
        long = profile_generate(model, ids, new + extra, new + extra, paths[1])
        r = per_step(short, long, extra)
        if traces is not None:
            events = [trace_gaps.load_events(p) for p in paths]
            r["gaps"] = step_gaps(*(trace_gaps.parse(e) for e in events), extra)
            name = re.sub(r"[^A-Za-z0-9_-]", "_", f"step-trace-{label}-b{batch}")
            with open(paths[1], "rb") as src, gzip.open(traces / f"{name}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    return r


def print_cell(label: str, batch: int, r: dict) -> None:
    """Print one :func:`per_step` result: span = busy + idle, host wall, then the categories by GPU time."""
    print(f"\n{label}, batch {batch}: per decode step, GPU span {r['span_us']:.0f} us = busy {r['busy_us']:.0f} "
          f"+ idle {r['idle_us']:.0f}; host wall {r['wall_us']:.0f} us")
    for k, v in sorted(r["categories"].items(), key=lambda kv: -kv[1]["us"]):
        print(f"  {k:24s} {v['count']:7.1f} kernels {v['us']:9.1f} us")


def print_gaps(label: str, batch: int, g: dict) -> None:
    """Print one :func:`step_gaps` result: the steady step's span, busy and idle, the idle by kind, the
    kernels and launches a step, then the :data:`GAP_ROWS` costliest gap pairs."""
    if "error" in g:
        print(f"  gaps: none ({g['error']})")
        return
    print(f"  gaps, {g['steps']} steady steps ({g['markers_per_step']} {g['marker']} marker(s) a step): GPU span "
          f"{g['span_us']:.0f} us = busy {g['busy_us']:.0f} + idle {g['idle_us']:.0f}; host step {g['host_step_us']:.0f} us")
    print("    idle by kind: " + ", ".join(f"{k} {v:.0f}" for k, v in g["idle_by_kind"].items() if v))
    k = g["kernels"]
    launches = ", ".join(f"{n} {v:.1f}" for n, v in g["api"].items())
    print(f"    a step: {k['total']:.1f} GPU activities ({k['graph']:.1f} from graph replays, {k['eager']:.1f} eager); "
          f"{g['graph_launches']:.1f} graph launches; API calls: {launches}")
    print("    eager (not replayed) a step: " + ", ".join(f"{e['name'][:60]} {e['count']:.1f}x {e['us']:.0f} us"
                                                    for e in g["eager"][:8]))
    print(f"    {'us/step':>8} {'n/step':>6} {'median':>7}  kind  | before -> after")
    for p in g["pairs"][:GAP_ROWS]:
        print(f"    {p['us']:8.1f} {p['count']:6.1f} {p['median_us']:7.2f}  {p['kind']} | {p['before']} -> {p['after']}")
    print("    by category: " + "; ".join(f"{p['before']} -> {p['after']} {p['us']:.0f} ({p['count']:.0f}x)"
                                         for p in g["category_pairs"][:8]))


def pdl_state(on: bool):
    """Our kernels' programmatic dependent launch set to ``on`` (the sm90 extension's switch; a CUDA graph
    keeps the setting it was captured with); returns the previous ``(enabled, prefetch)``, or ``None``
    where the extension cannot be loaded."""
    try:
        from fp8_linear.backends.sm90 import extension

        return extension().set_pdl(on)
    except Exception as e:  # no sm90 toolchain: nothing of ours launches with PDL
        print(f"  (PDL switch unavailable: {e})")
        return None


def print_summary(results: dict) -> None:
    """One line a profiled cell with gaps: steady step span = busy + idle, the idle waiting for the host,
    inside graph replays and launch latency, graph launches and GPU activities a step."""
    print(f"\n{'path':28s} {'span':>7} {'busy':>7} {'idle':>6} {'host':>6} {'ingr':>6} {'queued':>6} "
          f"{'graphs':>6} {'kernels':>7}  (us a steady step; idle = host (waiting for the host) + ingr (inside graph "
          f"replays) + queued (launch latency) + unattributed; graphs: graph launches a step)")
    for key, r in results.items():
        g = r.get("gaps")
        if not g or "error" in g:
            print(f"{key:28s} {g['error'] if g else 'no gaps'}")
            continue
        k = g["idle_by_kind"]
        host = k["graph launch, host late"] + k["eager, host late"]
        queued = k["graph launch, queued"] + k["eager, queued"]
        print(f"{key:28s} {g['span_us']:7.0f} {g['busy_us']:7.0f} {g['idle_us']:6.0f} {host:6.0f} {k['in graph']:6.0f} "
              f"{queued:6.0f} {g['graph_launches']:6.1f} {g['kernels']['total']:7.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_args(ap, presets="fp8-tensor", batches="1,16", new_tokens=8, extra_tokens=16)
    ap.add_argument("--no-pdl", action="store_true",
                    help="also every FP8 path with our kernels' programmatic dependent launch off: <path>+nopdl")
    ap.add_argument("--gaps", action="store_true",
                    help="idle gaps of the steady decode steps by kind and kernel pair (trace saved beside the JSON)")
    args = ap.parse_args(argv)
    if is_cuda(args.device) and not torch.cuda.is_available():
        raise SystemExit("step_profile: needs a CUDA GPU (or --tiny --device cpu to check the script)")
    clock = Budget(args.budget_s, args.cell_guess_s, reserve_s=5.0)
    batches = [int(b) for b in args.batches.split(",")]
    out = pathlib.Path(args.out) if args.out else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.model, args.layers, args.device, args.tiny)
    bf16 = decoder_linears(model)
    amax = calibrate(model)
    results, skipped, written = {}, [], None
    presets = [p for p in args.presets.split(",") if p]
    for path in path_list(presets, args.fuse, args.fused_only, args.no_pdl):
        preset = path.split("+")[0]
        fused, nopdl = "+fused" in path, path.endswith("+nopdl")
        if not clock.allows_compile(2 if path == "bf16" else len(batches)):
            skipped.append(f"{path}: {clock.why()}")
            print(f"\n{path}: skipped ({clock.why()})")
            continue
        pdl_before = pdl_state(False) if nopdl and is_cuda(args.device) else None
        try:
            if preset != "bf16":
                swap_in(model, fp8_layers(bf16, preset, amax))
                if fused:
                    fuse_projections(model)
            for b in batches:
                t0 = time.perf_counter()
                reset_compiled(model)
                r = profile_decode(model, b, args.prompt, args.new_tokens, args.extra_tokens,
                                   out if args.gaps else None, path, args.device)
                clock.compiled(time.perf_counter() - t0)
                results[f"{path}/b{b}"] = r
                print_cell(path, b, r)
                if "gaps" in r:
                    print_gaps(path, b, r["gaps"])
                rows = [dict(path=k, **v) for k, v in results.items()]
                written = rewrite_json("step-profile", environment(dict(args=vars(args), skipped=skipped)), rows,
                                       out, written)
        finally:
            if pdl_before is not None:
                pdl_state(pdl_before[0])
            unfuse_projections(model)
            swap_in(model, bf16)
            reset_compiled(model)
    if args.gaps:
        print_summary(results)
    for line in skipped:
        print(f"skipped {line}")
    print(f"\nwrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
