"""A Qwen3-MoE checkpoint written by compressed-tensors itself (the library llm-compressor saves with), in the
per-expert module layout llm-compressor's MoE calibration produces (experts as a list of
``gate_proj`` / ``up_proj`` / ``down_proj`` Linear layers; routers ignored with ``re:.*mlp.gate$``).

The fused model's experts are unfused into that layout with the same weights; compressed-tensors applies
the preset (``FP8``, ``FP8_DYNAMIC``, ``FP8_BLOCK``) to every Linear, the scales are set the way
llm-compressor's min-max observers set them (weights: ``amax / 448`` per tensor / channel / 128x128
block; static inputs: ``amax / 448`` of each Linear's calibration inputs, through the unfused
experts' own forward), and ``ModelCompressor`` compresses the weights and writes the config.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

E4M3_MAX = 448.0
BLOCK = 128


class PerExpertMLP(nn.Module):
    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act):
        super().__init__()
        self.gate_proj = nn.Linear(gate.shape[1], gate.shape[0], bias=False)
        self.up_proj = nn.Linear(up.shape[1], up.shape[0], bias=False)
        self.down_proj = nn.Linear(down.shape[1], down.shape[0], bias=False)
        for lin, w in ((self.gate_proj, gate), (self.up_proj, up), (self.down_proj, down)):
            lin.weight.data.copy_(w)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PerExpertList(nn.ModuleList):
    """Qwen3-MoE experts as a list of MLPs (what llm-compressor calibrates), with the fused module's call signature."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e, mlp in enumerate(self):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel():
                out.index_add_(0, tok, mlp(hidden_states[tok]) * top_k_weights[tok, pos, None])
        return out


def unfuse(model) -> None:
    """Replace every ``Qwen3MoeExperts`` of ``model`` by a :class:`PerExpertList` of the same weights."""
    for layer in model.model.layers:
        ex = layer.mlp.experts
        i = ex.down_proj.shape[2]
        layer.mlp.experts = PerExpertList(
            [PerExpertMLP(ex.gate_up_proj[e, :i], ex.gate_up_proj[e, i:], ex.down_proj[e], ex.act_fn)
             for e in range(ex.gate_up_proj.shape[0])])


def _weight_scale(w: torch.Tensor, strategy: str) -> torch.Tensor:
    a = w.detach().float().abs()
    if strategy == "tensor":
        amax = a.amax().reshape(1)
    elif strategy == "channel":
        amax = a.amax(dim=1, keepdim=True)
    else:
        r, c = -(-a.shape[0] // BLOCK), -(-a.shape[1] // BLOCK)
        pad = torch.zeros(r * BLOCK, c * BLOCK)
        pad[: a.shape[0], : a.shape[1]] = a
        amax = pad.reshape(r, BLOCK, c, BLOCK).amax(dim=(1, 3))
    return (amax / E4M3_MAX).clamp(min=1e-12)


def write(model, folder: str, preset: str, calib_ids: torch.Tensor):
    """Unfuse ``model`` (a fp32 Qwen3-MoE, changed in place), quantize it with compressed-tensors' ``preset``
    and write the compressed checkpoint into ``folder``; returns the ``ModelCompressor`` (its
    ``decompress_model(model)`` gives compressed-tensors' own dequantized weights)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from safetensors.torch import save_file

    unfuse(model)
    qc = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                            ignore=["lm_head", "re:.*mlp.gate$"])
    static = not qc.config_groups["group_0"].input_activations.dynamic
    amax: dict[str, float] = {}
    if static:
        hooks = [m.register_forward_pre_hook(
            lambda mod, args, n=n: amax.__setitem__(n, max(amax.get(n, 0.0), float(args[0].abs().max()))))
            for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
        with torch.no_grad():
            model(calib_ids)
        for h in hooks:
            h.remove()
    apply_quantization_config(model, qc)
    strategy = qc.config_groups["group_0"].weights.strategy
    with torch.no_grad():
        for n, m in model.named_modules():
            if getattr(m, "quantization_scheme", None) is None:
                continue
            m.weight_scale.data = _weight_scale(m.weight, strategy).reshape(m.weight_scale.shape)
            if static:
                # a Linear of an expert no calibration token reached: llm-compressor leaves the initial scale
                m.input_scale.data.fill_(max(amax.get(n, 0.0), 1e-8) / E4M3_MAX)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["architectures"] = [type(model).__name__]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    compressor.update_config(folder)
    return compressor
