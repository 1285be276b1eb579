"""The FP8 MoE model under ``torch.compile`` (CPU, emulated backend): transformers' static-cache decode step
of the tiny Qwen3-MoE, every preset, is one graph with no break, and nothing in it stops CUDA graphs from
capturing it (no host sync, no data-dependent shape: the experts' token counts stay on the device, the
grouped GEMM is one custom op per projection). What the compiled decode costs on the GPU is measured by
``python -m benchmarks.moe_bench --compile`` (docs/moe.md)."""

from __future__ import annotations

import collections

import pytest
import torch

from fp8_linear import quantize_model
from fp8_linear.moe.experts import FP8Experts
from helpers import calc_diff
from tiny_moe import TINY_QWEN3_MOE, byte_samples, tiny_qwen3_moe

SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
STATIC = ("fp8-tensor", "fp8-channel")
GROUPED_OP = "fp8_linear.grouped_fp8_gemm.default"
#: Ops that read a device value on the host or give data-dependent shapes (CUDA graphs cannot capture them).
HOST_SYNC_OPS = ("aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default",
                 "aten.unique_consecutive.default", "aten._unique2.default", "aten.bincount.default")
CACHE_LEN = 32


def _fp8_model(scheme: str):
    model = tiny_qwen3_moe()
    calib = byte_samples("calib", 4, 64) if scheme in STATIC else None
    model = quantize_model(model, calib, scheme, progress=False, gptq=False)
    experts = [m for m in model.modules() if isinstance(m, FP8Experts)]
    assert len(experts) == TINY_QWEN3_MOE["num_hidden_layers"], "every experts module must be FP8"
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def _decode_step_args(model, pos: int = 3) -> dict:
    from transformers import StaticCache

    p = torch.tensor([pos])
    return dict(input_ids=torch.tensor([[17]]), past_key_values=StaticCache(config=model.config, max_cache_len=CACHE_LEN),
                cache_position=p, position_ids=p[None], use_cache=True)


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=pytest.mark.slow) if s in STATIC else s for s in SCHEMES])
def test_decode_step_is_one_graph_cuda_graphs_can_capture(scheme):
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    model = _fp8_model(scheme)
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return gm

    def backend(gm, example_inputs):  # aot_eager that keeps the forward graph inductor would get
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep)

    torch._dynamo.reset()
    step = torch.compile(model.forward, backend=backend, fullgraph=True)  # a graph break raises here
    with torch.inference_mode():
        compiled = step(**_decode_step_args(model)).logits
        eager = model(**_decode_step_args(model)).logits
    assert len(graphs) == 1
    gm = graphs[0]
    assert get_first_incompatible_cudagraph_node(gm) is None
    ops = collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert ops[GROUPED_OP] == 2 * TINY_QWEN3_MOE["num_hidden_layers"], "one grouped GEMM per projection and layer"
    assert not [op for op in HOST_SYNC_OPS if ops[op]], f"host syncs in the graph: {ops}"
    # the same emulated kernels run the same math (the traced activation quantization is bitwise the op's)
    assert calc_diff(compiled, eager) < 1e-10


@pytest.mark.slow
def test_transformers_compiled_generate_decodes_with_no_graph_break_or_recompile():
    """The path ``moe_bench --compile`` times: generate's static cache and its own compile config
    (``fullgraph=False``, so a break would split the graph silently): one graph, no break, no recompile."""
    from torch._dynamo.utils import counters
    from transformers.generation.configuration_utils import CompileConfig

    model = _fp8_model("fp8-dynamic")
    config = CompileConfig(backend="aot_eager", mode=None)
    config._compile_all_devices = True  # transformers compiles the decode step on CUDA only unless told
    torch._dynamo.reset()
    counters.clear()
    ids = torch.tensor([list(b"The experts ")])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static",
                             compile_config=config)
    assert out.shape == (1, ids.shape[1] + 6)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, "one compiled decode graph for every step"


def test_compiled_step_has_no_python_guard_on_the_experts():
    """dynamo checks in Python (an epilogue lambda guard) that objects reached from two layers are the same
    object; a guard per layer on every compiled call. The experts forward reads its granularities as strings
    (C++ equality guards), not the QuantScheme all layers share, so no such guard names an experts module."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = _fp8_model("fp8-dynamic")
    torch._dynamo.reset()
    step = torch.compile(model.forward, backend=lambda gm, _inputs: gm, fullgraph=True)
    with torch.inference_mode():
        step(**_decode_step_args(model))
    entries = _debug_get_cache_entry_list(model.forward.__func__.__code__)
    assert len(entries) == 1
    parts = [p for g in entries[0].guard_manager.root.get_epilogue_lambda_guards() for p in g.verbose_code_parts()]
    assert parts, "the step has aliasing guards (transformers' own), so the introspection works"
    assert [p for p in parts if "['experts']" in p] == []


def _experts_guard_code(model) -> list[str]:
    """The code of every guard (leaf and epilogue) of the compiled decode step that names an experts module."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    step = torch.compile(model.forward, backend=lambda gm, _inputs: gm, fullgraph=True)
    with torch.inference_mode():
        step(**_decode_step_args(model))
    entries = _debug_get_cache_entry_list(model.forward.__func__.__code__)
    root = entries[0].guard_manager.root
    code, todo = [], [root]
    while todo:
        m = todo.pop()
        code += [p for g in m.get_leaf_guards() for p in g.verbose_code_parts()]
        todo.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):
            for pair in m.get_key_value_managers().values():
                todo.extend(k for k in (pair if isinstance(pair, tuple) else (pair,)) if k is not None)
    code += [p for g in root.get_epilogue_lambda_guards() for p in g.verbose_code_parts()]
    return [c for c in code if "['experts']" in c]


@pytest.mark.parametrize("scheme", ["fp8-dynamic", pytest.param("fp8-tensor", marks=pytest.mark.slow)])
def test_compiled_step_guards_no_python_structure_of_the_experts(scheme):
    """The experts forward reads plain bool / string attributes and its tensors (sizes from their static shapes):
    no guard on the shared QuantScheme, on the ``fp8_layout`` dict, on a method looked up on the instance or
    on an attribute searched with a default; per experts module its tensor guards are the 4 (dynamic) or 6
    (static) FP8 tensors'."""
    code = _experts_guard_code(_fp8_model(scheme))
    for bad in ("fp8_layout", ".scheme", "hasattr(", "'gemm'"):
        assert [c for c in code if bad in c and "DIMENSION" not in c and "_dynamo_" not in c] == [], bad
    layer0 = [c for c in code if "layers']._modules['0']" in c and c.startswith("check_tensor(")]
    assert len(layer0) == (6 if scheme in STATIC else 4), layer0
