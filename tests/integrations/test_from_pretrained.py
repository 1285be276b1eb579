"""``from_pretrained(..., quantization_config=FP8LinearConfig(...))`` on tiny Llama-shaped checkpoints:
the model it builds is bitwise the one ``quantize_model`` (GPTQ off) makes from the same checkpoint,
for every scheme without calibration, every load dtype, and the ``ignore`` patterns; it runs and generates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fp8_linear
from fp8_linear import FP8Linear, FP8LinearConfig, PRESETS, QuantScheme

from integ_helpers import LINEARS_PER_LAYER, TINY, assert_same_state, greedy, random_ids

SCHEMES = ["fp8-dynamic", "fp8-block"]


def _load(path, cfg=None, **kw):
    from transformers import AutoModelForCausalLM

    kw = {"quantization_config": cfg, **kw} if cfg is not None else kw
    return AutoModelForCausalLM.from_pretrained(path, **kw)


def _reference(path, scheme, dtype, ignore=("lm_head",)):
    """The unquantized model of ``path`` in ``dtype``, quantized by ``quantize_model`` with round-to-nearest weights."""
    model = _load(path, dtype=dtype)
    return fp8_linear.quantize_model(model, None, scheme, ignore=ignore, gptq=False, progress=False)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_model_as_quantize_model(tiny_bf16_dir, scheme, dtype):
    ours = _load(tiny_bf16_dir, FP8LinearConfig(scheme=scheme), dtype=dtype)
    ref = _reference(tiny_bf16_dir, scheme, dtype)
    fp8 = [n for n, m in ours.named_modules() if isinstance(m, FP8Linear)]
    assert len(fp8) == LINEARS_PER_LAYER * TINY["num_hidden_layers"]
    assert type(ours.lm_head) is nn.Linear and ours.lm_head.weight is ours.model.embed_tokens.weight
    assert all(m.scheme == PRESETS[scheme] for m in ours.modules() if isinstance(m, FP8Linear))
    assert ours.model.embed_tokens.weight.dtype == dtype and ours.model.norm.weight.dtype == dtype
    assert_same_state(ours, ref)
    ids = random_ids((2, 24), seed=1)
    with torch.inference_mode():
        a, b = ours(ids).logits, ref(ids).logits
    assert a.dtype == dtype and torch.equal(a, b)
    assert torch.equal(greedy(ours, ids[:1], 8), greedy(ref, ids[:1], 8))


def test_dtype_auto_keeps_the_checkpoint_dtype(tiny_bf16_dir):
    model = _load(tiny_bf16_dir, FP8LinearConfig("fp8-block"), dtype="auto")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn


def test_fp32_checkpoint_and_e5m2(tmp_path):
    from integ_helpers import save_tiny

    path = save_tiny(tmp_path / "fp32", dtype=torch.float32, seed=2)
    ours = _load(path, FP8LinearConfig("fp8-dynamic", fmt="e5m2"), dtype=torch.float32)
    ref = _reference(path, PRESETS["fp8-dynamic"].with_(fmt="e5m2"), torch.float32)
    assert ours.model.layers[1].self_attn.o_proj.weight.dtype == torch.float8_e5m2
    assert_same_state(ours, ref)


def test_ignore_patterns_as_quantize_model(tiny_bf16_dir):
    ignore = ["lm_head", "re:.*mlp\\.down_proj", "model.layers.0.self_attn.q_proj"]
    ours = _load(tiny_bf16_dir, FP8LinearConfig("fp8-dynamic", ignore=ignore), dtype=torch.float32)
    ref = _reference(tiny_bf16_dir, "fp8-dynamic", torch.float32, ignore=ignore)
    kept = sorted(n for n, m in ours.named_modules() if type(m) is nn.Linear)
    assert kept == ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    assert_same_state(ours, ref)


def test_custom_per_tensor_dynamic_scheme(tiny_bf16_dir):
    mine = QuantScheme("tensor-dynamic", "tensor", True, "token")
    ours = _load(tiny_bf16_dir, FP8LinearConfig(mine), dtype=torch.float32)
    assert_same_state(ours, _reference(tiny_bf16_dir, mine, torch.float32))
    assert ours.model.layers[0].self_attn.k_proj.weight_scale.shape == (1,)


def test_untied_lm_head_quantized_when_not_ignored(tmp_path):
    from integ_helpers import save_tiny

    path = save_tiny(tmp_path / "untied", tie_word_embeddings=False, seed=3)
    ours = _load(path, FP8LinearConfig("fp8-dynamic", ignore=()), dtype=torch.float32)
    assert isinstance(ours.lm_head, FP8Linear)
    assert_same_state(ours, _reference(path, "fp8-dynamic", torch.float32, ignore=()))


def test_everything_ignored_is_refused(tiny_bf16_dir):
    with pytest.raises(ValueError, match="leaves no nn.Linear"):
        _load(tiny_bf16_dir, FP8LinearConfig("fp8-dynamic", ignore=["Linear"]))


def test_config_after_loading_is_the_compressed_tensors_one(tiny_bf16_dir):
    model = _load(tiny_bf16_dir, FP8LinearConfig("fp8-block"), dtype=torch.float32)
    qc = model.config.quantization_config
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
    assert qc["config_groups"]["group_0"]["weights"]["strategy"] == "block" and qc["ignore"] == ["lm_head"]
    assert model.hf_quantizer.quantization_config.quant_scheme == PRESETS["fp8-block"]
    assert model.is_quantized
