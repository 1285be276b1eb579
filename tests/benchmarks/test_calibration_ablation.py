"""The ablation's two model-side diagnostics (benchmarks/calibration_ablation.py): the down_proj range
migration leaves the model's function unchanged (checked in fp64 against the unchanged model), the
per-token override quantizes exactly the matched layers' activations per token, and the two halves of a
preset's error (activations only: the original weights back; weights only: the activations unquantized)
are what they say."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.calibration_ablation import FakeQuantLinear, fake_quant, smooth_inputs
from fp8_linear.calibration.data import Batch
from fp8_linear.quantize import dequantize_fp8, quantize_fp8


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def _ids(seed=0):
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("site,first", [("down", "mlp.down_proj"), ("norm", "self_attn.q_proj")])
def test_smooth_inputs_keeps_the_function_and_shrinks_only_outlier_channels(site, first):
    model = _tiny_llama().double()
    with torch.no_grad():  # an outlier channel 5 in layer 0's input of the site's consumers
        if site == "down":
            model.model.layers[0].mlp.up_proj.weight[5] *= 50
        else:
            model.model.layers[0].input_layernorm.weight[5] *= 50
    ref = copy.deepcopy(model)
    s = smooth_inputs(model, site, 0.5, [Batch(input_ids=_ids(1), attention_mask=torch.ones(2, 16, dtype=torch.long))])
    want = {f"model.layers.{i}.{first}" for i in range(2)}
    if site == "norm":
        want |= {f"model.layers.{i}.mlp.gate_proj" for i in range(2)}
    assert set(s) == want
    s0 = s[f"model.layers.0.{first}"]
    assert s0.min() >= 1.0 and int(s0.argmax()) == 5 and s0[5] > 5
    with torch.no_grad():
        a, b = model(input_ids=_ids(2)).logits, ref(input_ids=_ids(2)).logits
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-9)  # exact up to fp64 rounding
    assert not torch.equal(model.get_submodule(f"model.layers.0.{first}").weight, ref.get_submodule(f"model.layers.0.{first}").weight)


@pytest.mark.parametrize("pattern,expect", [(r"\.down_proj$", {"down_proj"}), ("", set())])
def test_fake_quant_per_token_override(pattern, expect):
    from fp8_linear import quantize_model

    model = quantize_model(_tiny_llama(), [_ids(3)], "fp8-channel", progress=False)
    fake_quant(model, pattern)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FakeQuantLinear)}
    assert len(layers) == 14
    assert {n.rsplit(".", 1)[1] for n, m in layers.items() if m.granularity == "token"} == expect
    m = layers["model.layers.0.mlp.down_proj"]
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4))
    x[0] *= 1000  # one loud token: the static scale clips it, its own per-token scale does not
    x = x.bfloat16()
    want_gran, want_scale = ("token", None) if expect else ("tensor", m.input_scale)
    q, sc = quantize_fp8(x.float(), m.scheme.fmt, want_gran, scale=want_scale)
    want = torch.nn.functional.linear(dequantize_fp8(q, sc, torch.float32).bfloat16().float(), m.w.float())
    with torch.no_grad():
        got = m(x).float()
    # the bf16 GEMM's output rounding (2^-8 relative) and accumulation; the other mode is off by far more
    for row in range(3):
        assert torch.allclose(got[row], want[row], rtol=2 ** -6, atol=2 ** -6 * float(want[row].abs().max()))


@pytest.mark.parametrize("half", ["activations only", "weights only"])
def test_fake_quant_error_halves(half):
    from fp8_linear import quantize_model

    base = _tiny_llama()
    model = quantize_model(copy.deepcopy(base), [_ids(3)], "fp8-dynamic", progress=False)
    if half == "activations only":
        fake_quant(model, weights_from=base)
    else:
        fake_quant(model, quantize_activations=False)
    name = "model.layers.1.mlp.gate_proj"
    m, orig = model.get_submodule(name), base.get_submodule(name)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    with torch.no_grad():
        got = m(x).float()
    if half == "activations only":
        assert torch.equal(m.w, orig.weight.detach().bfloat16())  # the bf16 weight itself
        q, sc = quantize_fp8(x.float(), m.scheme.fmt, "token")
        xin, w = dequantize_fp8(q, sc, torch.float32).bfloat16().float(), orig.weight.float()
    else:
        assert not torch.equal(m.w, orig.weight.detach().bfloat16())  # FP8 (GPTQ-rounded) weights
        xin, w = x.float(), m.w.float()
    want = torch.nn.functional.linear(xin, w)
    # bf16 GEMM output rounding (2^-8 relative) and accumulation over 64 terms
    assert torch.allclose(got, want, rtol=2 ** -6, atol=2 ** -6 * float(want.abs().max()))
    # the per-element bound above also admits the other half's FP8 rounding (2^-4 per operand element,
    # averaged over 64 terms); over the whole output the two separate: bf16 rounding of the operand and of
    # the output is <= 2^-8 in relative norm, the wrong half (or both halves) 0.02-0.03 on these inputs
    assert float((got - want).norm() / want.norm()) <= 2 ** -7


@pytest.mark.parametrize("names", [("nope",), (), ("stdlib", "choose ")])
def test_eval_texts_refuses_unknown_names(names):
    from benchmarks.calibration_ablation import eval_texts

    with pytest.raises(ValueError, match="non-empty subset of choose, report, stdlib"):
        eval_texts(None, 1, names)
