"""The compiled forward of a fused FP8 model holds no per-call work that depends on the weight scale kind.

fp8-tensor and fp8-channel differ only in the weight scale their GEMM's epilogue reads (a scalar per
GEMM against a vector per output row), so their AOT graphs must be the same op for op: any op one of
them adds (a scale concatenated or expanded per call for a fused group, a cast) would run on every
decode step. docs/performance.md ("End to end") rests its reading of the batch-16 spread between the
two on this. BF16's graph is the reference for what lies outside the linear layers: an FP8 graph has
no fewer of its non-linear ops.
"""

from __future__ import annotations

import collections

import pytest
import torch

LINEAR_OPS = {"aten.mm.default", "aten.t.default", "aten._unsafe_view.default", "aten.view.default",
              "aten.slice.Tensor", "aten._to_copy.default"}


def _aot_graph_ops(model, ids) -> tuple[collections.Counter, int]:
    """Counts of ``call_function`` targets in the forward graph(s) AOT autograd hands to its compiler,
    and the number of graph inputs."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        def fw(g, _inputs):
            graphs.append(g)
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(ids)
    ops = collections.Counter(str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function")
    inputs = sum(1 for g in graphs for n in g.graph.nodes if n.op == "placeholder")
    return ops, inputs


def _model(preset: str | None):
    from transformers import LlamaConfig, LlamaForCausalLM

    from fp8_linear import fuse_projections, quantize_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    if preset is None:
        return model
    calib = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    model = quantize_model(model, [calib], preset, progress=False)
    fuse_projections(model)
    return model


@pytest.mark.slow
def test_tensor_and_channel_compile_to_the_same_graph():
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    tensor_ops, tensor_inputs = _aot_graph_ops(_model("fp8-tensor"), ids)
    channel_ops, channel_inputs = _aot_graph_ops(_model("fp8-channel"), ids)
    assert tensor_ops == channel_ops
    assert tensor_inputs == channel_inputs
    bf16_ops, _ = _aot_graph_ops(_model(None), ids)
    for op, n in bf16_ops.items():
        if op not in LINEAR_OPS:
            assert tensor_ops[op] >= n, f"{op}: {tensor_ops[op]} in the FP8 graph against BF16's {n}"
