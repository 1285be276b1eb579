"""Host cost of one call of the compiled decode step of a MoE model, apart from running it: BF16 against
each FP8 scheme, the whole model FP8 and the experts alone.

The model is the tiny Qwen3-MoE of the CPU tests (:data:`benchmarks.common.random_model.QUALITY_MOE`: 8 experts, top-2,
hidden 128; ``--layers`` decoder layers, random weights from the config, bf16). A path is BF16 (transformers'
experts), ``<scheme>`` (``quantize_model``: the attention ``FP8Linear`` layers and the ``FP8Experts``),
``<scheme>+experts`` (only the experts FP8, the attention projections left BF16: what the experts module
adds) or ``<scheme>+fused`` (the whole model, q/k/v fused by ``fp8_linear.fuse_projections``). Its static-cache decode step is compiled (``fullgraph=True``) with the backend of
:mod:`benchmarks.compiled_call_overhead` that runs the graph once and then returns that result, so what a
call costs afterwards is dynamo's guard evaluation, the collection of the graph's inputs and the replay of
attribute stores. Each path runs in its own process. Per path (:func:`benchmarks.compiled_call_overhead.measure`'s
columns): ``us`` (fastest of ``--calls`` calls), ``inputs`` (graph inputs), ``guards`` (leaf guards),
``lambda`` (conditions evaluated in Python), ``stores`` (attribute stores replayed a call), plus
``expert_inputs`` / ``expert_guards``: the graph inputs and the guards whose source names an experts module.

    python -m benchmarks.moe_call_overhead [--layers 8] [--paths bf16,fp8-dynamic,fp8-dynamic+experts]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks.common.dynamo_counts import count_guards, decode_step_inputs, time_calls

SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
#: Path suffix: only the experts modules FP8.
EXPERTS_ONLY = "+experts"
#: Path suffix: the whole model FP8, q/k/v fused (``fp8_linear.fuse_projections``).
FUSED = "+fused"
PATHS = ("bf16",) + SCHEMES + tuple(f"{s}{x}" for x in (EXPERTS_ONLY, FUSED) for s in SCHEMES)
#: How a guard's or an input's source names an experts module (``...['mlp']._modules['experts']...``).
EXPERTS_KEY = "['experts']"
CACHE_LEN = 64


def build(path: str, layers: int):
    """The model of ``path`` (module docstring), bf16 on the CPU, with generate's padding set."""
    import torch

    from benchmarks.common.random_model import QUALITY_MOE, from_fields
    from fp8_linear import quantize_model
    from fp8_linear.calibration.data import Batch, corpus_text

    model = from_fields(QUALITY_MOE, layers, "cpu")
    if path == "bf16":
        return model
    experts_only, fused = path.endswith(EXPERTS_ONLY), path.endswith(FUSED)
    scheme = path.removesuffix(EXPERTS_ONLY).removesuffix(FUSED)
    data = torch.tensor(list(corpus_text("calib").encode("utf-8"))[:4 * 64], dtype=torch.int64).reshape(4, 64)
    calib = list(data) if scheme in ("fp8-tensor", "fp8-channel") else None
    if experts_only:
        from fp8_linear.calibration.experts import quantize_experts

        batches = None if calib is None else [Batch(data, torch.ones_like(data))]
        quantize_experts(model, scheme, batches, progress=False)
        return model
    model = quantize_model(model, calib, scheme, progress=False, gptq=False)
    if fused:
        from fp8_linear import fuse_projections

        fuse_projections(model)
    return model


def _named(sources: list[str]) -> int:
    return sum(EXPERTS_KEY in s for s in sources)


def expert_guards(root) -> int:
    """Leaf guards of a dynamo guard tree whose code names an experts module."""
    root = getattr(root, "root", root)
    n, todo = 0, [root]
    while todo:
        m = todo.pop()
        n += sum(_named(g.verbose_code_parts()) > 0 for g in m.get_leaf_guards())
        todo.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):
            for pair in m.get_key_value_managers().values():
                todo.extend(k for k in (pair if isinstance(pair, tuple) else (pair,)) if k is not None)
    if hasattr(root, "get_epilogue_lambda_guards"):
        n += sum(_named(g.verbose_code_parts()) > 0 for g in root.get_epilogue_lambda_guards())
    return n


def measure(path: str, layers: int, calls: int) -> dict:
    """One path's row (module docstring), in this process."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = build(path, layers)
    seen = {}

    def run_once(gm, example_inputs):
        seen["n"] = len(example_inputs)
        seen["names"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        out = gm(*example_inputs)
        return lambda *args: out

    torch._dynamo.reset()
    step = torch.compile(model.forward, backend=run_once, fullgraph=True)
    kw = decode_step_inputs(model.config, CACHE_LEN)
    with torch.inference_mode():
        step(**kw)
        step(**kw)
        best, stores = time_calls(step, kw, calls)
    fn = model.forward
    entries = _debug_get_cache_entry_list(getattr(fn, "__func__", fn).__code__)
    guards, lambdas = count_guards(entries[0].guard_manager) if entries else (-1, -1)
    return dict(path=path, layers=layers, us_per_call=round(best * 1e6, 1), graph_inputs=seen["n"],
                guards=guards, lambda_guards=lambdas, stores=stores,
                expert_inputs=sum("experts" in nm for nm in seen["names"]),
                expert_guards=expert_guards(entries[0].guard_manager) if entries else -1,
                recompiles=len(entries))


def compile_time(path: str, layers: int, backend: str = "inductor") -> dict:
    """Seconds to compile (first call) and run the decode step of ``path`` at ``layers`` layers, in this process:
    ``wall_s``; ``cpu_s`` (this process's CPU time: dynamo, AOTAutograd and inductor's Python, which is what
    grows with the layers) and ``children_s`` (the C++ / Triton compiler processes inductor starts, of kernels
    that repeat across identical layers once each); ``dynamo_s`` / ``inductor_s`` as
    :func:`benchmarks.common.dynamo_counts.compile_seconds`. Run it with a fresh ``TORCHINDUCTOR_CACHE_DIR``."""
    import os

    import torch
    from torch._dynamo.utils import compilation_time_metrics

    from benchmarks.common.dynamo_counts import compile_seconds

    model = build(path, layers)
    torch._dynamo.reset()
    compilation_time_metrics.clear()
    step = torch.compile(model.forward, backend=backend, fullgraph=True)
    kw = decode_step_inputs(model.config, CACHE_LEN)
    t0, c0 = time.perf_counter(), os.times()
    with torch.inference_mode():
        step(**kw)
    c1 = os.times()
    return dict(path=path, layers=layers, backend=backend, wall_s=round(time.perf_counter() - t0, 2),
                cpu_s=round(c1.user + c1.system - c0.user - c0.system, 2),
                children_s=round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 2),
                **compile_seconds())


def _child(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.moe_call_overhead", *args], capture_output=True, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_scaling(paths: list[str], layer_counts: list[int]) -> list[dict]:
    """:func:`compile_time` of each path at each layer count, each in its own process with an empty inductor
    cache, and per path the least-squares line ``cpu_s = a + b * layers`` (``b``: seconds per layer)."""
    import os
    import tempfile

    rows = []
    for path in paths:
        for layers in layer_counts:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                           TORCHINDUCTOR_AUTOGRAD_CACHE="0")
                rows.append(_child(["--compile-one", path, "--layers", str(layers)], env))
            r = rows[-1]
            print(f"{path:<22} {layers:>3} layers: wall {r['wall_s']:7.1f} s, cpu {r['cpu_s']:7.1f} s, compilers "
                  f"{r['children_s']:6.1f} s (dynamo {r['dynamo_s']} s, inductor {r['inductor_s']} s)", flush=True)
    for path in paths:
        pts = [(r["layers"], r["cpu_s"]) for r in rows if r["path"] == path]
        if len(pts) >= 2:
            n = len(pts)
            mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
            b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            print(f"{path}: cpu_s ~ {my - b * mx:.1f} + {b:.2f} x layers (48 layers: {my - b * mx + 48 * b:.0f} s on this CPU)")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--paths", default="bf16,fp8-dynamic,fp8-dynamic+experts")
    ap.add_argument("--calls", type=int, default=500, help="single calls timed per path (the fastest is reported)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--compile-time", default=None, metavar="LAYERS",
                    help="instead: seconds to compile the decode step with inductor at these layer counts "
                         "(comma-separated, e.g. 2,4,8), per path, and the per-layer slope")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process of one path
    ap.add_argument("--compile-one", default=None, help=argparse.SUPPRESS)  # the child of one --compile-time point
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.layers, args.calls)))
        return 0
    if args.compile_one:
        print(json.dumps(compile_time(args.compile_one, args.layers)))
        return 0
    paths = [p for p in args.paths.split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        ap.error(f"--paths: expected a comma-separated subset of {PATHS}, got {bad}")
    if args.compile_time:
        rows = compile_scaling(paths, [int(x) for x in args.compile_time.split(",") if x])
    else:
        rows = [_child(["--one", path, "--layers", str(args.layers), "--calls", str(args.calls)]) for path in paths]
        print_rows(rows, args.layers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def print_rows(rows: list[dict], layers: int) -> None:
    """The table of :func:`measure` rows, per layer against the first row."""
    base = rows[0]
    print(f"compiled MoE decode step, {layers} layers: host cost per call beyond running it "
          f"(per layer: against {base['path']})")
    print(f"{'path':<22} {'us':>8} {'per layer':>10} {'inputs':>7} {'guards':>7} {'lambda':>7} {'stores':>7} "
          f"{'exp.inputs':>10} {'exp.guards':>10}")
    for r in rows:
        print(f"{r['path']:<22} {r['us_per_call']:>8.1f} {(r['us_per_call'] - base['us_per_call']) / layers:>+10.2f} "
              f"{r['graph_inputs']:>7} {r['guards']:>7} {r['lambda_guards']:>7} {r['stores']:>7} "
              f"{r['expert_inputs']:>10} {r['expert_guards']:>10}")


if __name__ == "__main__":
    raise SystemExit(main())
