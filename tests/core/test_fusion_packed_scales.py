"""A static fused group's scales in one packed buffer (``fp8_linear.fusion.PACKED_SCALES``).

The fused layer of a group with a static input scale keeps its per-channel weight scales and its
input scale in one fp32 buffer, ``weight_scale`` and ``input_scale`` being views of it, so that a
compiled forward takes one scale tensor per fused layer. Checked on the CPU: the views hold the
members' scales, a compiled graph has one packed input per fused layer and no separate scale inputs
for it, and after ``deepcopy``, ``load_state_dict`` of new scales and dtype / device moves the compiled
forward (dynamo, backend ``eager``) gives bitwise the eager output.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from fp8_linear import FP8Linear, fuse_projections
from fp8_linear.fusion import PACKED_SCALES, SCALE_ALIGN, fusion_groups

#: Awkward widths: q/k/v rows 192 + 96 + 96 and gate/up 2 x 320 (not multiples of 4 * 128).
TINY = dict(vocab_size=256, hidden_size=192, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(preset: str) -> nn.Module:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval().to(torch.bfloat16)
    for name, lin in list(model.named_modules()):
        if isinstance(lin, nn.Linear) and name != "lm_head":
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, FP8Linear.from_linear(lin, preset, input_amax=6.0))
    fuse_projections(model)
    return model


def _graph_inputs(model: nn.Module, ids: torch.Tensor) -> list[str]:
    names = []

    def capture(gm, example_inputs):
        names.extend(n.name for n in gm.graph.nodes if n.op == "placeholder")
        return gm

    with torch.inference_mode():
        torch.compile(model, backend=capture, fullgraph=True)(ids)
    return names


def _ids() -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("preset", ["fp8-tensor", "fp8-channel"])
def test_views_hold_the_member_scales(preset):
    model = _model(preset)
    for g in fusion_groups(model):
        p = g.fused._parameters
        packed, ws, s = p[PACKED_SCALES], p["weight_scale"], p["input_scale"]
        n = g.fused.out_features
        off = -(-n // SCALE_ALIGN) * SCALE_ALIGN
        assert packed.shape == (off + 1,) and packed.dtype == torch.float32
        assert ws.data_ptr() == packed.data_ptr() and s.data_ptr() == packed.data_ptr() + 4 * off
        assert s.data_ptr() % 16 == 0  # aligned as a tensor of its own
        for m, (start, stop) in zip(g.members, g.bounds):
            want = m.weight_scale.reshape(-1, 1).expand(stop - start, 1)
            assert torch.equal(ws[start:stop], want)
            assert torch.equal(s, m.input_scale)


def test_dynamic_groups_are_not_packed():
    model = _model("fp8-dynamic")
    assert all(PACKED_SCALES not in g.fused._parameters for g in fusion_groups(model))


def test_compiled_graph_takes_one_scale_tensor_per_fused_layer():
    model = _model("fp8-tensor")
    names = _graph_inputs(model, _ids())
    fused = [n for n in names if "fusion_groups" in n]
    layers = TINY["num_hidden_layers"]
    assert sum(n.endswith(f"{PACKED_SCALES}_") for n in fused) == 2 * layers
    assert not [n for n in fused if n.endswith(("weight_scale_", "input_scale_"))]


def test_compiled_equals_eager_after_copy_load_and_moves():
    model = copy.deepcopy(_model("fp8-tensor"))
    # new, differing weight scales for one member (its input scale unchanged: the group stays exact)
    sd = model.state_dict()
    key = "model.layers.0.self_attn.k_proj.weight_scale"
    sd[key] = sd[key] * 1.5
    model.load_state_dict(sd)
    model = model.to(torch.float16).to(torch.bfloat16)
    assert all(g.disabled_reason is None for g in fusion_groups(model))
    ids = _ids()
    with torch.inference_mode():
        eager = model(ids).logits
        compiled = torch.compile(model, backend="eager", fullgraph=True)(ids).logits
    assert torch.equal(eager, compiled)
    k = model.model.layers[0].self_attn.k_proj
    g = k._fusion
    start, stop = g.bounds[k._fusion_index]
    assert torch.equal(g.fused._parameters[PACKED_SCALES][start:stop], k.weight_scale.reshape(1).expand(stop - start))
