"""The MoE experts through ``from_pretrained(..., quantization_config=FP8LinearConfig)``.

Reference: ``quantize_model`` on a copy of the same model (the experts path of docs/moe.md), whose
outputs the quantize-on-load path must reproduce bit for bit (both quantize the weights min-max and
the activations per token).
"""

from __future__ import annotations

import copy

import torch

from fp8_linear import FP8LinearConfig, quantize_model
from fp8_linear.calibration.experts import moe_report
from fp8_linear.moe.experts import FP8Experts
from tiny_moe import NUM_EXPERTS, TINY_QWEN3_MOE, byte_samples, tiny_qwen3_moe

LAYERS = TINY_QWEN3_MOE["num_hidden_layers"]
#: Every Linear-like weight of the tiny model: 4 attention projections + 3 per expert, per layer.
ALL_FP8 = LAYERS * (4 + 3 * NUM_EXPERTS)


def test_from_pretrained_with_fp8_linear_config_quantizes_the_experts(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_qwen3_moe()
    model.save_pretrained(tmp_path / "bf16")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32,
                                                  quantization_config=FP8LinearConfig("fp8-dynamic")).eval()
    rep = moe_report(loaded)
    assert rep.fp8_matrices == ALL_FP8 and sum(isinstance(m, FP8Experts) for m in loaded.modules()) == LAYERS
    ref = quantize_model(copy.deepcopy(model), None, "fp8-dynamic", gptq=False, progress=False)
    ids = torch.stack(byte_samples("eval", 2, 64))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref(ids).logits)
