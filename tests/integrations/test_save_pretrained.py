"""``model.save_pretrained(path)`` of a model quantized on load writes our compressed-tensors checkpoint:
the same config and the same tensor bytes as ``fp8_linear.save_quantized``; ``load_quantized`` reads it
back bitwise, and transformers' own compressed-tensors loader reads it too."""

from __future__ import annotations

import json
import os

import pytest
import torch

import fp8_linear
from fp8_linear import FP8LinearConfig

from helpers import calc_diff
from integ_helpers import assert_same_state, random_ids

#: calc_diff of two fp32 sums of the same products in different orders (relative error ~ K * 2**-24 per
#: output, K <= 320 here, so calc_diff ~ 1e-10; the bar leaves room).
FP32_REORDER_BAR = 1e-8


def _quantized(path, scheme, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=FP8LinearConfig(scheme))


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, fn)))
    return out


def _qc(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["quantization_config"]


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8-block"])
def test_save_pretrained_writes_what_save_quantized_writes(tiny_bf16_dir, tmp_path, scheme):
    model = _quantized(tiny_bf16_dir, scheme)
    model.save_pretrained(tmp_path / "hf")
    fp8_linear.save_quantized(model, tmp_path / "ours")
    assert _qc(tmp_path / "hf") == _qc(tmp_path / "ours")
    assert _qc(tmp_path / "hf")["quant_method"] == "compressed-tensors"
    assert_same_state(_tensors(tmp_path / "hf"), _tensors(tmp_path / "ours"))
    stored = _tensors(tmp_path / "hf")
    assert stored["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.layers.0.mlp.up_proj.weight_scale"].dtype == torch.float32
    assert not any(k.endswith("input_scale") for k in stored)
    assert "lm_head.weight" not in stored  # tied to the embeddings, as in the source checkpoint
    # the model itself is left as it was: its config still describes the checkpoint it would write
    assert model.config.quantization_config == _qc(tmp_path / "hf")


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8-block"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_quantized_reads_it_back_bitwise(tiny_bf16_dir, tmp_path, scheme, dtype):
    model = _quantized(tiny_bf16_dir, scheme, dtype)
    model.save_pretrained(tmp_path / "ckpt")
    back = fp8_linear.load_quantized(tmp_path / "ckpt", dtype=dtype)
    assert_same_state(back, model)
    ids = random_ids((2, 20), seed=5)
    with torch.inference_mode():
        assert torch.equal(back(ids).logits, model(ids).logits)


def test_transformers_compressed_tensors_loader_reads_it(tiny_bf16_dir, tmp_path):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    model = _quantized(tiny_bf16_dir, "fp8-dynamic")
    model.save_pretrained(tmp_path / "ckpt")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    ids = random_ids((2, 20), seed=6)
    with torch.inference_mode():
        a, b = model(ids).logits, theirs(ids).logits
    # the same FP8 products summed in another order: fp32 rounding differences only
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert calc_diff(a, b) < FP32_REORDER_BAR
