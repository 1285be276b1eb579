"""Host cost of one call of a compiled decode step, apart from running it: dynamo's guards, argument passing
and the side effects replayed after the graph.

A small Llama (width 128, ``--layers`` decoder layers, random weights, bf16) with its decoder Linears as
BF16 ``nn.Linear`` or ``FP8Linear`` of each preset is compiled (``fullgraph=True``) the way
transformers compiles its static-cache decode step, with a backend that runs the graph once and then
returns that result: what a call costs afterwards is the guard evaluation, the collection of the
graph's inputs and the replay of attribute stores, the part of a compiled call that grows with the
number of layers and tensors (the AOTAutograd and CUDA-graph wrappers on a GPU add per-input work of
their own). Each path runs in its own process (no other compiled entry to fail through first). Per path:

- ``us``: the fastest of ``--calls`` single calls (on a shared, loaded CPU the minimum is the figure
  that repeats);
- ``guard us``: of that, the evaluation of the guards alone (the cache entry's guard manager checked on the
  call's frame locals, the fastest of ``--calls``): steadier than ``us`` on a loaded machine;
- ``inputs``: the graph's inputs (tensors dynamo passes in: parameters, buffers, cache tensors);
- ``guards``: leaf guards of the cache entry that serves the steady calls (dynamo's C++ guard tree), of
  them ``lambda``: the conditions of guards evaluated in Python (mostly object aliasing: one object
  reached by two paths);
- ``checked``: of the leaf guards, those a steady call evaluates where dynamo's recursive dict-tag guards
  skip the subtree of a module whose dicts are unchanged (``--dict-tags``: torch 2.11's default, the GPU's;
  without it every guard is checked), plus one tag check per skipped subtree;
- ``stores``: attribute stores dynamo replays after the graph (side effects of the traced forward),
  counted as calls of its store helper during one call.

A path ``<preset>+fused`` also fuses the q/k/v and gate/up siblings (``fp8_linear.fuse_projections``);
``+head`` makes ``lm_head`` an ``FP8Linear`` of the preset too and ``+emb`` the input embedding an
``FP8Embedding`` (as ``benchmarks/e2e.py --fp8-lm-head --fp8-embedding``); suffixes combine
(``fp8-channel+fused+head+emb``).
Runs on a CPU:

    python -m benchmarks.compiled_call_overhead [--layers 8] [--paths bf16,fp8-tensor,fp8-channel,fp8-dynamic]
    python -m benchmarks.compiled_call_overhead --layers 32 --paths bf16,fp8-channel+fused,fp8-dynamic+fused
    python -m benchmarks.compiled_call_overhead --layers 32 --dict-tags --paths bf16,fp8-channel,fp8-channel+fused
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks.common.dynamo_counts import (  # noqa: F401  (re-exported: tests and moe_call_overhead use them)
    STORE_HELPER, count_guards, count_stores, decode_step_inputs, guard_conditions, leaf_guards, time_calls)

PATHS = ("bf16", "fp8-tensor", "fp8-channel", "fp8-dynamic")
#: Path suffixes: the FP8 siblings fused (q/k/v, gate/up); lm_head FP8 too; the input embedding an FP8Embedding.
FUSED, HEAD, EMB = "fused", "head", "emb"
#: The small Llama: only the structure matters (layers, modules, tensors), not the width.
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def tag_checked_guards(root) -> int:
    """Leaf guards of a dynamo guard tree (``cache_entry.guard_manager``) that a call evaluates while every
    "tag safe root" (a module whose guarded subtree dynamo skips while its dicts are unchanged, under
    ``torch._dynamo.config.use_recursive_dict_tags_for_guards``) is unchanged, plus one check per such root;
    every leaf guard where the tree marks no root (the option off, or a torch without it)."""
    root = getattr(root, "root", root)
    todo, checked = [root], 0
    while todo:
        m = todo.pop()
        if getattr(m, "is_tag_safe_root", lambda: False)():
            checked += 1  # its dicts' tags are compared; the subtree below is skipped
            continue
        checked += len(m.get_leaf_guards())
        todo.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):
            for pair in m.get_key_value_managers().values():
                todo.extend(k for k in (pair if isinstance(pair, tuple) else (pair,)) if k is not None)
    return checked + len(root.get_epilogue_lambda_guards() if hasattr(root, "get_epilogue_lambda_guards") else [])


def frame_locals(fn, args: tuple, kwargs: dict) -> dict:
    """The locals a call ``fn(*args, **kwargs)`` starts its frame with (what dynamo's guards read): the bound
    parameters (``fn``'s own signature, not a wrapped function's) and the closure's free variables."""
    import inspect

    f = getattr(fn, "__func__", fn)
    if f is not fn:
        args = (fn.__self__, *args)
    sig = inspect.signature(f, follow_wrapped=False)
    loc = dict(sig.bind(*args, **kwargs).arguments)
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        loc[name] = cell.cell_contents
    return loc


def guard_seconds(guard_manager, loc: dict, calls: int) -> float | None:
    """The fastest of ``calls`` evaluations of ``guard_manager`` on ``loc`` (None if they do not pass there)."""
    if not guard_manager.check(loc):
        return None
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        guard_manager.check(loc)
        best = min(best, time.perf_counter() - t0)
    return best


def compiled_step(path: str, layers: int):
    """The small Llama of ``path`` (``bf16`` or ``<preset>[+fused][+head][+emb]``) with ``layers`` decoder layers,
    its decode step compiled as transformers compiles it (``fullgraph=True``; a backend that runs the graph once
    and then returns that result), called twice (the static cache's first call recompiles once, as in
    ``generate``). Returns ``(model, step, kwargs, inputs)``: ``step(**kwargs)`` is a steady call, ``inputs["n"]``
    the graph's input count, and the model's cache entry serves it (:func:`steady_entry`)."""
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    from fp8_linear import FP8Linear, fuse_projections
    from fp8_linear.embedding import FP8Embedding

    preset, *flags = path.split("+")
    if set(flags) - {FUSED, HEAD, EMB} or (flags and preset == "bf16"):
        raise SystemExit(f"--paths: {path!r}: expected bf16 or <preset>[+fused][+head][+emb]")
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=layers, **CONFIG)
    model = LlamaForCausalLM(cfg).eval().to(torch.bfloat16)
    if preset != "bf16":
        for name, lin in list(model.named_modules()):
            if isinstance(lin, nn.Linear) and (name != "lm_head" or HEAD in flags):
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, FP8Linear.from_linear(lin, preset, input_amax=1.0))
    if EMB in flags:
        model.model.embed_tokens = FP8Embedding.from_embedding(model.model.embed_tokens)
    if FUSED in flags:
        fuse_projections(model)
    inputs = {}

    def run_once(gm, example_inputs):
        inputs["n"] = len(example_inputs)
        out = gm(*example_inputs)
        return lambda *args: out

    step = torch.compile(model.forward, backend=run_once, fullgraph=True)
    kw = decode_step_inputs(cfg, 64)
    with torch.inference_mode():
        step(**kw)
        step(**kw)
    return model, step, kw, inputs


def steady_entry(model):
    """The newest cache entry of ``model.forward`` (the one :func:`compiled_step`'s steady calls hit), or None."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    fn = model.forward
    entries = _debug_get_cache_entry_list(getattr(fn, "__func__", fn).__code__)
    return entries[0] if entries else None


def measure(path: str, layers: int, calls: int, dict_tags: bool = False) -> dict:
    """``{path, layers, us_per_call, guard_us, graph_inputs, guards, lambda_guards, checked, stores}`` of one path,
    in this process (``dict_tags``: with dynamo's recursive dict-tag guards on)."""
    import torch

    if dict_tags:
        torch._dynamo.config.use_recursive_dict_tags_for_guards = True
    model, step, kw, inputs = compiled_step(path, layers)
    with torch.inference_mode():
        best, stores = time_calls(step, kw, calls)
        entry = steady_entry(model)
        guards, lambdas = count_guards(entry.guard_manager) if entry else (-1, -1)
        checked = tag_checked_guards(entry.guard_manager) if entry else -1
        g = guard_seconds(entry.guard_manager, frame_locals(model.forward, (), kw), calls) if entry else None
    return dict(path=path, layers=layers, us_per_call=round(best * 1e6, 1),
                guard_us=None if g is None else round(g * 1e6, 1), graph_inputs=inputs["n"], guards=guards,
                lambda_guards=lambdas, checked=checked, stores=stores)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--calls", type=int, default=1000, help="single calls timed per path (the fastest is reported)")
    ap.add_argument("--dict-tags", action="store_true",
                    help="dynamo's recursive dict-tag guards on (torch 2.11's default; off by default in torch 2.13)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process of one path
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.layers, args.calls, args.dict_tags)))
        return 0
    rows = []
    for path in args.paths.split(","):
        out = subprocess.run([sys.executable, "-m", "benchmarks.compiled_call_overhead", "--one", path,
                              "--layers", str(args.layers), "--calls", str(args.calls),
                              *(["--dict-tags"] if args.dict_tags else [])],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["us_per_call"]
    linears = 7 * args.layers
    tags = ", dict-tag guards on" if args.dict_tags else ""
    print(f"compiled decode step, {args.layers} layers ({linears} linear layers{tags}): host cost per call beyond "
          "running it")
    print(f"{'path':<18} {'us':>8} {'per linear':>11} {'guard us':>9} {'inputs':>7} {'guards':>7} {'lambda':>7} "
          f"{'checked':>8} {'stores':>7}")
    for r in rows:
        g = "-" if r["guard_us"] is None else f"{r['guard_us']:.1f}"
        print(f"{r['path']:<18} {r['us_per_call']:>8.1f} {(r['us_per_call'] - base) / linears:>+11.2f} {g:>9} "
              f"{r['graph_inputs']:>7} {r['guards']:>7} {r['lambda_guards']:>7} {r['checked']:>8} {r['stores']:>7}")
    print(f"(per linear: us per linear layer against {rows[0]['path']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
