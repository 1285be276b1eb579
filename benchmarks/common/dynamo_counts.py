"""What a compiled call costs the host, read off dynamo: the guard tree's leaf and Python ("lambda")
guards and their conditions, the attribute stores replayed after the graph, compile seconds, and the
fastest of single calls. Shared by ``compiled_call_overhead``, ``moe_call_overhead`` and ``moe_bench``."""

from __future__ import annotations

import sys
import time

#: dynamo's helper that replays an attribute store of the traced code after the graph.
STORE_HELPER = "object_setattr_ignore_descriptor"


def leaf_guards(root):
    """Every leaf guard of a dynamo guard tree (``cache_entry.guard_manager``) as ``(guard, is_lambda)``; the
    epilogue's Python guards last."""
    root = getattr(root, "root", root)  # torch's Python wrapper around the C++ root manager
    todo = [root]
    while todo:
        m = todo.pop()
        for g in m.get_leaf_guards():
            yield g, "LAMBDA" in type(g).__name__
        todo.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):  # a dict's managers hang off its key / value pairs
            for pair in m.get_key_value_managers().values():
                todo.extend(k for k in (pair if isinstance(pair, tuple) else (pair,)) if k is not None)
    for g in root.get_epilogue_lambda_guards() if hasattr(root, "get_epilogue_lambda_guards") else []:
        yield g, True


def guard_conditions(root) -> list[tuple[bool, str]]:
    """``(is_lambda, condition)`` of every condition a guard tree checks (a Python guard may check several)."""
    return [(lam, part.split("  #")[0].strip()) for g, lam in leaf_guards(root) for part in g.verbose_code_parts()]


def count_guards(root) -> tuple[int, int]:
    """``(leaf guards, lambda guards)`` of a dynamo guard tree (``cache_entry.guard_manager``); a lambda guard
    counts each condition it checks in Python."""
    leaves = lambdas = 0
    for g, lam in leaf_guards(root):
        leaves += 1
        if lam:
            lambdas += max(1, len(g.verbose_code_parts()))
    return leaves, lambdas


def count_stores(call) -> int:
    """Calls of dynamo's attribute-store helper during ``call()``."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "call" and frame.f_code.co_name == STORE_HELPER:
            n += 1

    sys.setprofile(prof)
    try:
        call()
    finally:
        sys.setprofile(None)
    return n


def time_calls(step, kwargs: dict, calls: int) -> tuple[float, int]:
    """``(fastest of calls single calls of step(**kwargs) in seconds, attribute stores replayed in one more)``
    of an already compiled (warmed) ``step``."""
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        step(**kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, count_stores(lambda: step(**kwargs))


def compile_seconds() -> dict:
    """Seconds dynamo and inductor spent compiling since the last ``torch._dynamo.utils.compilation_time_metrics``
    clear: ``dynamo_s`` (tracing and the backend, the whole compile of each frame) and ``inductor_s`` (inductor's
    lowering, code generation and kernel compilation, part of ``dynamo_s``); ``None`` where not recorded."""
    from torch._dynamo.utils import compilation_time_metrics as m

    def total(*keys):
        vals = [sum(v) for k, v in m.items() if any(k.endswith(x) for x in keys)]
        return round(sum(vals), 2) if vals else None

    return dict(dynamo_s=total("compile_inner"), inductor_s=total("compile_fx_inner"))


def decode_step_inputs(config, cache_len: int) -> dict:
    """Keyword arguments of one decode step of a transformers causal LM of ``config`` at batch 1 (one token at
    position 3 of a static cache of ``cache_len``), as transformers' compiled ``generate`` calls the forward."""
    import torch
    from transformers import StaticCache

    pos = torch.tensor([3])
    return dict(input_ids=torch.zeros(1, 1, dtype=torch.long),
                past_key_values=StaticCache(config=config, max_cache_len=cache_len),
                cache_position=pos, position_ids=pos[None], use_cache=True)

