"""The MoE experts through ``compare_schemes`` and ``quantize_fused_experts`` (the weight-only conversion);
the default ignore list keeps the shared-expert gates in high precision.

Reference: ``quantize_model`` on a copy of the same model (the experts path of docs/moe.md), whose
outputs ``compare_schemes`` must reproduce for every scheme, with and without the save / reload.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, compare_schemes, quantize_model
from fp8_linear.calibration.data import Batch
from fp8_linear.calibration.evaluate import evaluate_models
from fp8_linear.calibration.experts import moe_report
from fp8_linear.moe.convert import quantize_fused_experts
from fp8_linear.moe.experts import FP8Experts
from tiny_moe import NUM_EXPERTS, TINY_QWEN3_MOE, byte_samples, tiny_qwen3_moe

LAYERS = TINY_QWEN3_MOE["num_hidden_layers"]
#: Every Linear-like weight of the tiny model: 4 attention projections + 3 per expert, per layer.
ALL_FP8 = LAYERS * (4 + 3 * NUM_EXPERTS)
#: The KL of two runs of the same quantized model over the same batches agrees to float32 summation order.
KL_RTOL = 1e-4


def _kl(ref, q, batches):
    return evaluate_models({"ref": ref, "q": q}, "ref", batches, progress=False)["q"].kl


@pytest.mark.parametrize("save_reload", [False, True])
def test_compare_schemes_quantizes_the_experts_and_restores_the_model(save_reload, tmp_path):
    model = tiny_qwen3_moe()
    calib, ev = byte_samples("calib", 8, 128), byte_samples("eval", 4, 128)
    with torch.no_grad():
        before = model(ev[0][None]).logits
    table = compare_schemes(model, ev, ("fp8-channel", "fp8-dynamic"), calib, gptq=False, save_reload=save_reload,
                            checkpoint_dir=tmp_path if save_reload else None, progress=False, eval_windows=4,
                            eval_seq_len=128)
    assert not any(isinstance(m, (FP8Experts, FP8Linear)) for m in model.modules()), "the model is left as it was"
    with torch.no_grad():
        assert torch.equal(model(ev[0][None]).logits, before)
    batches = [Batch(torch.stack(ev), torch.ones(4, 128, dtype=torch.int64))]
    rows = {r["scheme"]: r for r in table.rows}
    for scheme in ("fp8-channel", "fp8-dynamic"):
        q = quantize_model(copy.deepcopy(model), calib, scheme, gptq=False, progress=False)
        assert moe_report(q).fp8_matrices == ALL_FP8
        want = _kl(model, q, batches)
        assert rows[scheme]["kl"] == pytest.approx(want, rel=KL_RTOL), (scheme, rows[scheme]["kl"], want)


def test_quantize_fused_experts_refuses_static_schemes_and_honours_ignore():
    model = tiny_qwen3_moe()
    with pytest.raises(ValueError, match="static activation scales"):
        quantize_fused_experts(model, "fp8-channel")
    assert quantize_fused_experts(model, "fp8-dynamic", ignore=("re:.*layers\\.0\\.mlp\\.experts$",)) == [
        "model.layers.1.mlp.experts"]
    assert not isinstance(model.model.layers[0].mlp.experts, FP8Experts)
    assert isinstance(model.model.layers[1].mlp.experts, FP8Experts)


def test_shared_expert_gates_stay_in_high_precision_by_default():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                         shared_expert_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256)
    model = Qwen2MoeForCausalLM(cfg).eval()
    q = quantize_model(copy.deepcopy(model), byte_samples("calib", 4, 64), "fp8-dynamic", progress=False)
    gates = [m for n, m in q.named_modules() if n.endswith("shared_expert_gate")]
    assert len(gates) == 2 and all(type(m) is nn.Linear for m in gates)
    assert all(isinstance(m, FP8Linear) for n, m in q.named_modules() if n.endswith("shared_expert.down_proj"))
    assert sum(isinstance(m, FP8Experts) for m in q.modules()) == 2
    assert {f"model.layers.{i}.mlp.shared_expert_gate.weight" for i in range(2)} <= set(moe_report(q).high_precision)
