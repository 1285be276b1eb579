"""Each preset on the real SmolLM2-135M and all-MiniLM-L6-v2: quantize, save, load in a fresh
process, outputs bitwise equal to the model before saving; the saved layout is compressed-tensors'."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from ckpt_helpers import PRESET_NAMES


#: Weight-scale shape per weight granularity for a ``[out, in]`` weight (docs/design.md section 2).
SCALE_SHAPE = {
    "tensor": lambda o, i: [1],
    "channel": lambda o, i: [o, 1],
    "block": lambda o, i: [-(-o // 128), -(-i // 128)],
}


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_smollm2_fresh_process_logits_bitwise(preset, smollm2_ckpts, fresh_outputs):
    saved = smollm2_ckpts[preset]
    assert torch.equal(fresh_outputs[("smollm2", preset)], saved.outputs)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_minilm_fresh_process_hidden_states_bitwise(preset, minilm_ckpts, fresh_outputs):
    saved = minilm_ckpts[preset]
    assert torch.equal(fresh_outputs[("minilm", preset)], saved.outputs)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_smollm2_checkpoint_layout(preset, smollm2_ckpts):
    """Read the files directly: F8_E4M3 weights [out, in], fp32 scales of the preset's shape,
    input_scale only for static presets, lm_head tied (not stored), the compressed-tensors config."""
    from fp8_linear import FP8Linear, PRESETS

    saved, scheme = smollm2_ckpts[preset], PRESETS[preset]
    with open(os.path.join(saved.path, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg["quantization_config"]
    assert (qc["quant_method"], qc["format"], qc["quantization_status"]) == ("compressed-tensors", "float-quantized", "compressed")
    assert qc["ignore"] == ["lm_head"] and list(qc["config_groups"]) == ["group_0"]
    group = qc["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    assert group["weights"]["strategy"] == scheme.weight_granularity and group["weights"]["dynamic"] is False
    assert group["input_activations"]["dynamic"] is scheme.activation_dynamic
    assert group["input_activations"]["strategy"] == scheme.activation_granularity
    assert os.path.exists(os.path.join(saved.path, "tokenizer.json"))
    files = [f for f in os.listdir(saved.path) if f.endswith(".safetensors")]
    header = {}
    for fn in files:
        with safe_open(os.path.join(saved.path, fn), "pt") as f:
            header.update({k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()})
    assert "lm_head.weight" not in header and header["model.embed_tokens.weight"][0] == "F32"
    fp8_modules = {n: m for n, m in saved.model.named_modules() if isinstance(m, FP8Linear)}
    assert len(fp8_modules) == 30 * 7
    for name, m in fp8_modules.items():
        o, i = m.out_features, m.in_features
        assert header[f"{name}.weight"] == ("F8_E4M3", [o, i])
        assert header[f"{name}.weight_scale"] == ("F32", SCALE_SHAPE[scheme.weight_granularity](o, i))
        assert (f"{name}.input_scale" in header) is scheme.static
        if scheme.static:
            assert header[f"{name}.input_scale"] == ("F32", [1])


def test_load_restores_schemes_and_ties(smollm2_ckpts):
    """In process: every FP8Linear comes back with the exact scheme; lm_head shares embed_tokens' weight;
    FP8 weights stay FP8 and scales fp32 while the rest takes ``dtype``."""
    from fp8_linear import FP8Linear, load_quantized

    saved = smollm2_ckpts["fp8-block"]
    loaded = load_quantized(saved.path)  # default dtype bfloat16
    want = {n: m.scheme for n, m in saved.model.named_modules() if isinstance(m, FP8Linear)}
    got = {n: m for n, m in loaded.named_modules() if isinstance(m, FP8Linear)}
    assert {n: m.scheme for n, m in got.items()} == want
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    m = got["model.layers.0.mlp.down_proj"]
    assert m.weight.dtype == torch.float8_e4m3fn and m.weight_scale.dtype == torch.float32
    assert not any(p.device.type == "meta" for p in loaded.parameters())


#: Peak RSS added by loading, as a multiple of the checkpoint's safetensors bytes (measured 0.98 for
#: SmolLM2 fp8-dynamic in bf16: 205 MB for a 210 MB checkpoint; a bf16 copy of the model would be 258 MB more).
LOAD_RSS_FACTOR = 1.15


def test_smollm2_load_peak_memory_about_checkpoint_size(smollm2_ckpts):
    from ckpt_helpers import run_fresh_loads

    (rep,) = run_fresh_loads([{"ckpt": smollm2_ckpts["fp8-dynamic"].path, "dtype": "bfloat16"}])
    added = rep["rss_after_mb"] - rep["rss_before_mb"]
    print(f"SmolLM2 load: peak RSS +{added:.0f} MB for a {rep['ckpt_mb']:.0f} MB checkpoint ({rep['load_s']:.2f} s)")
    assert added <= LOAD_RSS_FACTOR * rep["ckpt_mb"]
