"""Where an eager MoE prefill forward's time goes, BF16 against FP8 (``moe_bench --profile-prefill``).

One eager forward of ``[1, prefill]`` tokens (what ``moe_bench`` times as prefill), per model, three ways:

1. **clock**: wall ms of the forward with the device synchronized around it, and host ms (the time until
   the Python call returns, no synchronization: where host ms ~ wall ms the forward is host-bound and
   the GPU waits for launches);
2. **modules**: forward hooks on the embedding, each decoder layer's attention, router (``mlp.gate``),
   experts (``mlp.experts``) and the ``lm_head``: host ms per module kind (summed over layers) and its
   GPU span (CUDA events recorded by the hooks, so it includes the GPU's idle time inside the module);
3. **profiler**: ``torch.profiler`` over the same forwards, with a ``record_function`` range per module
   (the same hooks): every GPU kernel sorted into a :data:`CATEGORIES` label; per forward the kernel
   count and GPU time per category, the 15 kernels with the most GPU time, and the host-synchronizing
   calls (:data:`SYNC_OPS`: ``aten::item`` / ``_local_scalar_dense`` from ``.item()`` / ``bool()`` /
   ``.tolist()``, ``nonzero``, ``cudaStreamSynchronize``, device-to-host copies) with the module they
   ran in. ``GPU busy`` is the kernels' summed time (one stream), ``idle = wall - busy``.

On a CPU (``--tiny``, a check of the script) the profiler sees CPU ops only: the op counts per module are
then those of the emulated backends (the FP8 grouped GEMM is one emulated GEMM per expert there, one
launch on an sm90 GPU).
"""

from __future__ import annotations

import collections
import importlib
import re
import statistics
import time

import torch

from benchmarks.common.cuda_clock import is_cuda, sync
from benchmarks.common.kernel_names import first_match

#: Module kinds by qualified name (first match wins), hooked for host time, GPU span and profiler ranges.
MODULE_KINDS = (
    ("embedding", r"embed_tokens$"),
    ("attention", r"layers\.\d+\.self_attn$"),
    ("router", r"layers\.\d+\.mlp\.gate$"),
    ("experts", r"layers\.\d+\.mlp\.experts$"),
    ("attn linears", r"layers\.\d+\.self_attn\.[qkvo]_proj$"),
    ("lm_head", r"(^|\.)lm_head$"),
)
#: Functions timed as a kind of their own (module, attribute, kind): the experts' grouped GEMMs, BF16
#: (transformers' ``_grouped_mm``, what its ``grouped_mm`` experts call) and FP8 (the grouped dispatcher's
#: run), so that "experts" counts what the experts forward does around them.
FUNCTION_KINDS = (
    ("transformers.integrations.moe", "_grouped_mm", "grouped gemm"),
    ("fp8_linear.grouped_gemm", "run_grouped_problem", "grouped gemm"),
)
#: GPU kernel categories by name (regular expressions, first match wins; the rest is ``other``).
CATEGORIES = (
    ("grouped fp8 gemm (ours)", r"fp8_grouped_sm90"),
    ("dense fp8 gemm (ours)", r"fp8_gemm_sm90|sm90_gemm"),
    ("act quant (ours)", r"quant_rows|quant_groups|act_quant"),
    ("bf16 grouped_mm", r"GroupProblemShape|[Gg]rouped"),
    ("attention", r"flash|fmha|attn|attention|sdpa|efficient"),
    ("cuBLAS gemm", r"nvjet|gemm|gemv|xmma|cutlass|cublas"),
    ("sort", r"[Ss]ort|[Rr]adix"),
    ("gather / scatter / index", r"[Ii]ndex|[Gg]ather|[Ss]catter"),
    ("histc / cumsum", r"histc|[Hh]istogram|[Ss]can|cumsum"),
    ("reduction", r"[Rr]educe"),
    ("copy / fill", r"[Mm]emcpy|[Mm]emset|copy|[Ff]ill|CatArray"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
)
#: Host-synchronizing calls counted in the profile (CPU-side event names).
SYNC_OPS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::unique", "aten::_unique2",
            "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
#: Prefix of the profiler ranges the module hooks open.
RANGE = "moe_profile/"
TOP_KERNELS = 15


def category(name: str) -> str:
    """The :data:`CATEGORIES` label of a GPU kernel's name (the first pattern that matches), else ``other``."""
    return first_match(name, CATEGORIES)


def module_kinds(model) -> dict[str, list[tuple[str, torch.nn.Module]]]:
    """``{kind: [(qualified name, module), ...]}`` of :data:`MODULE_KINDS` in ``model``."""
    out: dict[str, list] = collections.defaultdict(list)
    for name, m in model.named_modules():
        kind = first_match(name, MODULE_KINDS, default="")
        if kind:
            out[kind].append((name, m))
    return dict(out)


class ModuleHooks:
    """Forward pre/post hooks on the :func:`module_kinds` modules, and wrappers around the grouped GEMM
    functions of :data:`FUNCTION_KINDS` (put back by :meth:`remove`): host seconds per kind, CUDA event
    pairs (GPU span) when ``events``, and a profiler range ``moe_profile/<kind>`` when ``ranges``."""

    def __init__(self, model, events: bool, ranges: bool):
        self.host: dict[str, float] = collections.defaultdict(float)
        self.pairs: dict[str, list] = collections.defaultdict(list)
        self.events, self.ranges = events, ranges
        self._open: dict[int, tuple] = {}
        self._handles = []
        self._patched = []
        for kind, mods in module_kinds(model).items():
            for _, m in mods:
                self._handles.append(m.register_forward_pre_hook(
                    lambda mod, args, kind=kind: self._open.__setitem__(id(mod), self.enter(kind))))
                self._handles.append(m.register_forward_hook(
                    lambda mod, args, out: self.exit(self._open.pop(id(mod)))))
        for module_name, attr, kind in FUNCTION_KINDS:
            try:
                mod = importlib.import_module(module_name)
            except ImportError:
                continue
            fn = getattr(mod, attr, None)
            if fn is None:
                continue

            def wrapped(*a, _fn=fn, _kind=kind, **kw):
                token = self.enter(_kind)
                try:
                    return _fn(*a, **kw)
                finally:
                    self.exit(token)

            setattr(mod, attr, wrapped)
            self._patched.append((mod, attr, fn))

    def enter(self, kind: str) -> tuple:
        rf = torch.profiler.record_function(RANGE + kind) if self.ranges else None
        if rf is not None:
            rf.__enter__()
        ev = None
        if self.events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return kind, time.perf_counter(), ev, rf

    def exit(self, token: tuple) -> None:
        kind, t0, ev, rf = token
        if ev is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pairs[kind].append((ev, end))
        if rf is not None:
            rf.__exit__(None, None, None)
        self.host[kind] += time.perf_counter() - t0

    def gpu_ms(self) -> dict[str, float]:
        """GPU span per kind, summed over its modules and calls (call after a synchronization)."""
        return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self.pairs.items()}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        for mod, attr, fn in self._patched:
            setattr(mod, attr, fn)


def clock(model, ids: torch.Tensor, reps: int) -> dict:
    """Median wall ms (synchronized) and host ms (until the call returns) of ``model(ids)`` over ``reps``."""
    wall, host = [], []
    for _ in range(reps):
        sync(ids.device)
        t0 = time.perf_counter()
        model(ids)
        t1 = time.perf_counter()
        sync(ids.device)
        host.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    return dict(wall_ms=statistics.median(wall), host_ms=statistics.median(host))


def module_times(model, ids: torch.Tensor, reps: int) -> dict:
    """Per module kind: host ms and GPU span ms per forward (means over ``reps`` forwards)."""
    hooks = ModuleHooks(model, events=ids.is_cuda, ranges=False)
    try:
        for _ in range(reps):
            model(ids)
        sync(ids.device)
        gpu = hooks.gpu_ms() if ids.is_cuda else {}
        return {k: dict(host_ms=hooks.host[k] * 1e3 / reps, gpu_span_ms=gpu[k] / reps if k in gpu else None)
                for k in hooks.host}
    finally:
        hooks.remove()


def _enclosing_range(evt) -> str:
    """The ``moe_profile/<kind>`` range around a profiler event (``-`` when none), through ``cpu_parent``."""
    p = getattr(evt, "cpu_parent", None)
    while p is not None:
        if p.name.startswith(RANGE):
            return p.name[len(RANGE):]
        p = getattr(p, "cpu_parent", None)
    return "-"


def _parent_chain(evt, depth: int = 3) -> str:
    names, p = [], getattr(evt, "cpu_parent", None)
    while p is not None and len(names) < depth and not p.name.startswith(RANGE):
        names.append(p.name)
        p = getattr(p, "cpu_parent", None)
    return " < ".join(names)


def profile_forwards(model, ids: torch.Tensor, reps: int) -> dict:
    """``torch.profiler`` over ``reps`` forwards with module ranges: kernel categories, top kernels, CPU ops and
    syncs per forward (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ids.is_cuda else [])
    hooks = ModuleHooks(model, events=False, ranges=True)
    try:
        sync(ids.device)
        with profile(activities=acts) as prof:
            for _ in range(reps):
                model(ids)
            sync(ids.device)
    finally:
        hooks.remove()
    events = prof.events()
    kernels, cpu = _split(events)
    cats, names = kernel_sums(kernels)
    syncs: dict[tuple, int] = collections.Counter()
    for e in cpu:
        if e.name in SYNC_OPS:
            syncs[(e.name, _enclosing_range(e), _parent_chain(e))] += 1
    for e in kernels:  # device-to-host copies: a host sync follows each
        if "DtoH" in e.name or "Device -> Pageable" in e.name:
            syncs[(e.name, "-", "")] += 1
    ops: dict[str, int] = collections.Counter()
    op_names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in cpu:  # top-level aten ops (not called by another aten op), by the range they ran in
        if e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::")):
            kind = _enclosing_range(e)
            ops[kind] += 1
            op_names[kind][e.name] += 1
    ranges: dict[str, dict] = {}
    for e in cpu:
        if e.name.startswith(RANGE):
            r = ranges.setdefault(e.name[len(RANGE):], dict(host_us=0.0, kernel_us=0.0))
            r["host_us"] += e.time_range.end - e.time_range.start
            r["kernel_us"] += float(getattr(e, "device_time_total", 0.0) or 0.0)
    per = float(reps)
    return dict(
        **kernel_figures(cats, names, per),
        syncs=[dict(op=k[0], module=k[1], called_from=k[2], per_forward=v / per) for k, v in sorted(syncs.items())],
        top_level_aten_ops=dict(sorted(((k, v / per) for k, v in ops.items()), key=lambda kv: -kv[1])),
        aten_ops_by_kind={k: {n: c / per for n, c in v.most_common()} for k, v in op_names.items()},
        ranges={k: dict(host_ms=v["host_us"] / per / 1e3, kernel_ms=v["kernel_us"] / per / 1e3)
                for k, v in ranges.items()},
        table=prof.key_averages().table(sort_by=_sort_key(ids.is_cuda), row_limit=TOP_KERNELS),
    )


def _split(events) -> tuple[list, list]:
    """``(GPU kernels, CPU events)`` of a profile's events."""
    dev = torch.autograd.DeviceType.CUDA
    return [e for e in events if e.device_type == dev], [e for e in events if e.device_type != dev]


def kernel_sums(kernels) -> tuple[dict, dict]:
    """``({category: [count, us]}, {kernel name: [count, us]})`` of profiler kernel events."""
    cats: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    names: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        for d, key in ((cats, category(e.name)), (names, e.name)):
            d[key][0] += 1
            d[key][1] += us
    return dict(cats), dict(names)


def kernel_figures(cats: dict, names: dict, per: float) -> dict:
    """Kernels per unit (a forward, a decode step: the sums divided by ``per``), GPU busy ms, the categories
    by GPU time and the :data:`TOP_KERNELS` kernels."""
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return dict(
        kernels=sum(c for c, _ in cats.values()) / per,
        gpu_busy_ms=sum(us for _, us in cats.values()) / per / 1e3,
        categories={k: dict(kernels=c / per, ms=us / per / 1e3)
                    for k, (c, us) in sorted(cats.items(), key=lambda kv: -kv[1][1])},
        top_kernels=[dict(name=n[:160], calls=c / per, ms=us / per / 1e3) for n, (c, us) in top])


def compile_counters() -> dict:
    """What dynamo and inductor counted since the last ``counters.clear()``: graph breaks, graphs compiled,
    CUDA graph skips (an FP8 step that inductor does not capture pays every launch on the host) and inputs
    that CUDA graphs had to copy (non-static)."""
    from torch._dynamo.utils import counters

    return dict(graph_breaks=sum(counters["graph_break"].values()), graphs=counters["stats"]["unique_graphs"],
                cudagraph_skips=counters["inductor"]["cudagraph_skips"],
                cudagraph_non_static_inputs=counters["inductor"]["cudagraph_recorded_non_static_inputs"])


#: CUDA runtime / driver calls counted per decode step (CPU-side profiler events): a step replayed from a
#: CUDA graph is one ``cudaGraphLaunch`` and the few eager launches of ``generate``'s own ops; a step that
#: CUDA graphs do not capture launches every kernel of the model itself.
LAUNCH_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaStreamSynchronize")


def _profiled(fn, device) -> tuple[dict, dict, float, dict]:
    """``fn()`` under the profiler (host and CUDA activities on a GPU) with garbage collection off:
    :func:`kernel_sums`, the synchronized wall ms and the :data:`LAUNCH_CALLS` counts."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda(device) else [])
    sync(device)
    gc.collect()
    gc.disable()
    try:
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            fn()
            sync(device)
            wall = (time.perf_counter() - t0) * 1e3
    finally:
        gc.enable()
    kernels, cpu = _split(prof.events())
    calls = collections.Counter(e.name for e in cpu if e.name in LAUNCH_CALLS)
    return (*kernel_sums(kernels), wall, dict(calls))


def _per_step(long: dict, short: dict, steps: int) -> dict:
    return {k: (long.get(k, 0) - short.get(k, 0)) / steps for k in sorted(set(long) | set(short))}


def profile_decode(model, label: str, new: int, device) -> dict:
    """One compiled decode step at batch 1 (transformers' static-cache ``generate``, as ``moe_bench
    --compile`` times it), after two warm-up calls (compile, CUDA-graph capture):

    - ``step_ms``: the median interval between tokens of two timed calls (a streamer stamp per token,
      garbage collection off; :func:`benchmarks.common.generate_clock.timed_generate`), the steady step;
      ``first_step_ms`` the first decode step of a call (it re-records the CUDA graph for the call's new
      static cache);
    - kernels and GPU busy ms by category, the top kernels, and the CUDA launch calls per step
      (:data:`LAUNCH_CALLS`), from ``generate(new) - generate(1)`` profiled (prefill and per-call costs
      cancel) over ``new - 1`` steps; ``profiled_step_ms`` is that difference's wall time (the figure
      reported before, which also holds the per-call re-record spread over the steps);
    - :func:`compile_counters` since the first warm-up call (graph breaks, graphs,
      CUDA graph skips).

    Prints and returns the figures."""
    from torch._dynamo.utils import counters

    from benchmarks.common.generate_clock import timed_generate

    prompt = torch.randint(0, model.config.vocab_size, (1, 16), device=device)
    kw = dict(cache_implementation="static")

    def gen(n):
        return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)

    counters.clear()
    with torch.inference_mode():
        for _ in range(2):
            gen(new)()
        runs = [timed_generate(model, prompt, new, kw)[0] for _ in range(2)]
        c1, n1, w1, a1 = _profiled(gen(1), device)
        cn, nn_, wn, an = _profiled(gen(new), device)
    steps = new - 1
    cats = {k: [v[0] - c1.get(k, [0, 0.0])[0], v[1] - c1.get(k, [0, 0.0])[1]] for k, v in cn.items()}
    names = {k: [v[0] - n1.get(k, [0, 0.0])[0], v[1] - n1.get(k, [0, 0.0])[1]] for k, v in nn_.items()}
    out = dict(model=label, new_tokens=new, step_ms=statistics.median(r["step_ms"] for r in runs),
               first_step_ms=statistics.median(r["first_step_ms"] for r in runs), profiled_step_ms=(wn - w1) / steps,
               launch_calls=_per_step(an, a1, steps), **compile_counters(), **kernel_figures(cats, names, steps))
    print(f"\n== {label}: compiled decode step at batch 1: {out['step_ms']:.3f} ms (median token interval, GC off; "
          f"first step {out['first_step_ms']:.2f} ms; generate({new}) - generate(1) under the profiler "
          f"{out['profiled_step_ms']:.3f} ms a step), GPU busy {out['gpu_busy_ms']:.3f} ms, {out['kernels']:.1f} kernels")
    print(f"    graph breaks {out['graph_breaks']}, graphs {out['graphs']}, CUDA graph skips {out['cudagraph_skips']}; "
          "launch calls per step: " + (", ".join(f"{k} {v:.1f}" for k, v in out["launch_calls"].items()) or "none"))
    for k, v in out["categories"].items():
        print(f"    {k:26s} {v['kernels']:6.1f} kernels {v['ms'] * 1e3:8.1f} us")
    for t in out["top_kernels"]:
        print(f"    {t['ms'] * 1e3:8.1f} us {t['calls']:5.1f} x  {t['name'][:110]}")
    return out


def _sort_key(cuda: bool) -> str:
    if not cuda:
        return "self_cpu_time_total"
    evt = torch.autograd.profiler_util.FunctionEventAvg()
    return "self_device_time_total" if hasattr(evt, "self_device_time_total") else "self_cuda_time_total"


def profile_prefill(model, label: str, prefill: int, reps: int, device) -> dict:
    """:func:`clock`, :func:`module_times` and :func:`profile_forwards` of one eager ``model(ids)`` of
    ``[1, prefill]`` random tokens (two warm-up forwards first); prints the figures."""
    ids = torch.randint(0, model.config.vocab_size, (1, prefill), device=device)
    with torch.inference_mode():
        for _ in range(2):
            model(ids)
        sync(ids.device)
        out = dict(model=label, prefill=prefill, **clock(model, ids, reps))
        out["modules"] = module_times(model, ids, reps)
        out["profile"] = profile_forwards(model, ids, reps)
    print_profile(out)
    return out


def print_profile(r: dict) -> None:
    """The figures of one :func:`profile_prefill` result."""
    p = r["profile"]
    busy = p["gpu_busy_ms"]
    print(f"\n== {r['model']}: eager prefill of {r['prefill']} tokens: wall {r['wall_ms']:.3f} ms, host {r['host_ms']:.3f} ms"
          f" (call returns), GPU busy {busy:.3f} ms, idle {r['wall_ms'] - busy:.3f} ms; "
          f"{p['kernels']:.0f} kernels per forward")
    print(f"  {'module':12s} {'host ms':>8s} {'GPU span ms':>11s} {'kernel ms':>9s} {'aten ops':>8s}   (per forward, all layers)")
    for k, v in r["modules"].items():
        span = f"{v['gpu_span_ms']:11.3f}" if v["gpu_span_ms"] is not None else f"{'-':>11s}"
        kern = p["ranges"].get(k, {}).get("kernel_ms")
        print(f"  {k:12s} {v['host_ms']:8.3f} {span} {kern if kern is not None else float('nan'):9.3f} "
              f"{p['top_level_aten_ops'].get(k, 0):8.0f}")
    print(f"  aten ops outside the hooked modules: {p['top_level_aten_ops'].get('-', 0):.0f}")
    print("  experts' own aten ops (outside its grouped GEMMs): " + ", ".join(
        f"{n.removeprefix('aten::')} {c:g}" for n, c in p["aten_ops_by_kind"].get("experts", {}).items()))
    if p["categories"]:
        print("  GPU kernels by category (per forward):")
        for k, v in p["categories"].items():
            print(f"    {k:26s} {v['kernels']:6.1f} kernels {v['ms']:8.3f} ms")
        print(f"  top {TOP_KERNELS} kernels by GPU time (per forward):")
        for t in p["top_kernels"]:
            print(f"    {t['ms']:8.3f} ms {t['calls']:5.1f} x  {t['name'][:110]}")
    print("  host syncs per forward: " + ("none" if not p["syncs"] else ""))
    for s in p["syncs"]:
        print(f"    {s['per_forward']:5.1f} x {s['op']} in {s['module']}" + (f" (from {s['called_from']})" if s["called_from"] else ""))
    print(p["table"])


def compare(rows: list[dict]) -> None:
    """Per module kind and kernel category: FP8 minus BF16 (ms per forward), to read the gap off."""
    if len(rows) < 2:
        return
    base, other = rows[0], rows[1]
    print(f"\n{other['model']} minus {base['model']} (ms per forward): wall {other['wall_ms'] - base['wall_ms']:+.3f}, "
          f"host {other['host_ms'] - base['host_ms']:+.3f}, GPU busy "
          f"{other['profile']['gpu_busy_ms'] - base['profile']['gpu_busy_ms']:+.3f}")
    for k in sorted(set(base["modules"]) | set(other["modules"])):
        a, b = base["modules"].get(k, {}), other["modules"].get(k, {})
        d_host = b.get("host_ms", 0.0) - a.get("host_ms", 0.0)
        span = (b.get("gpu_span_ms") or 0.0) - (a.get("gpu_span_ms") or 0.0)
        print(f"  {k:12s} host {d_host:+8.3f}  GPU span {span:+8.3f}")
    cats = set(base["profile"]["categories"]) | set(other["profile"]["categories"])
    for k in sorted(cats):
        a = base["profile"]["categories"].get(k, dict(ms=0.0, kernels=0.0))
        b = other["profile"]["categories"].get(k, dict(ms=0.0, kernels=0.0))
        print(f"  {k:26s} {b['ms'] - a['ms']:+8.3f} ms  {b['kernels'] - a['kernels']:+6.1f} kernels")


__all__ = ["CATEGORIES", "LAUNCH_CALLS", "MODULE_KINDS", "ModuleHooks", "category", "compare", "compile_counters",
           "profile_decode", "profile_prefill"]
