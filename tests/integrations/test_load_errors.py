"""What ``from_pretrained`` with ``FP8LinearConfig`` refuses: a weight it cannot quantize (NaN / inf), a
Linear weight missing from the checkpoint, and a config.json claiming ``quant_method: "fp8_linear"``;
each error names the layer or says what to do instead."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from fp8_linear import FP8LinearConfig
from fp8_linear.integrations.transformers_quantizer import LoadQuantizationError

from integ_helpers import save_tiny

LAYER = "model.layers.1.mlp.up_proj"


def _load(path, cfg=None, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg or FP8LinearConfig("fp8-dynamic"), **kw)


def _rewrite(folder, edit) -> None:
    f = os.path.join(folder, "model.safetensors")
    tensors = load_file(f)
    edit(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_names_the_layer(tmp_path, bad):
    path = save_tiny(tmp_path / "bad", seed=4)

    def poison(t):
        t[f"{LAYER}.weight"][3, 5] = bad

    _rewrite(path, poison)
    with pytest.raises(LoadQuantizationError, match=f"{LAYER}: could not quantize.*NaN/inf"):
        _load(path, dtype=torch.float32)


def test_missing_weight_names_the_layer(tmp_path):
    path = save_tiny(tmp_path / "missing", seed=4)
    _rewrite(path, lambda t: t.pop(f"{LAYER}.weight"))
    with pytest.raises(LoadQuantizationError, match=f"{LAYER}: could not quantize.*not in the checkpoint"):
        _load(path, dtype=torch.float32)


def test_config_json_with_our_method_is_refused(tmp_path):
    path = save_tiny(tmp_path / "claims", seed=4)
    cfg_file = os.path.join(path, "config.json")
    with open(cfg_file) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = FP8LinearConfig("fp8-dynamic").to_dict()
    with open(cfg_file, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="load_quantized"):
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(path)


def test_static_scheme_refused_before_anything_loads(tiny_bf16_dir):
    with pytest.raises(ValueError, match="quantize_model"):
        _load(tiny_bf16_dir, FP8LinearConfig("fp8-channel"))
