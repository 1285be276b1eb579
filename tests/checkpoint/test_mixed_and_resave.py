"""Checkpoints with several schemes in one model, e5m2 weights, and re-saving a loaded checkpoint
(an llm-compressor or foreign one becomes ours): outputs stay bitwise equal."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ckpt_helpers import FIXTURES, TINY_LLAMA, fast_scheme, outputs_of, random_ids, tiny_llama

BATCH = {"input_ids": random_ids((2, 24), TINY_LLAMA["vocab_size"], seed=31)}


def _mixed_model():
    """Attention in fp8-dynamic, MLP in fp8-tensor (static), lm_head unquantized."""
    from fp8_linear import quantize_model

    model = tiny_llama(seed=30)
    calib = list(random_ids((4, 32), TINY_LLAMA["vocab_size"], seed=32))
    quantize_model(model, calib, fast_scheme("fp8-dynamic"), ignore=["lm_head", "re:.*mlp.*"], progress=False,
                   gptq=False)
    return quantize_model(model, calib, fast_scheme("fp8-tensor"), progress=False, gptq=False)


def test_mixed_schemes_round_trip(tmp_path):
    from fp8_linear import FP8Linear, load_quantized, save_quantized

    model = _mixed_model()
    path = save_quantized(model, tmp_path / "ckpt")
    with open(os.path.join(path, "config.json")) as f:
        groups = json.load(f)["quantization_config"]["config_groups"]
    assert len(groups) == 2
    assert sorted(len(g["targets"]) for g in groups.values()) == [2 * 3, 2 * 4]  # exact module names
    loaded = load_quantized(path, dtype=torch.float32)
    want = {n: m.scheme for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert {n: m.scheme for n, m in loaded.named_modules() if isinstance(m, FP8Linear)} == want
    assert torch.equal(outputs_of(loaded, BATCH), outputs_of(model, BATCH))


def test_mixed_schemes_transformers_loader(tmp_path):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    from fp8_linear import save_quantized

    model = _mixed_model()
    theirs = AutoModelForCausalLM.from_pretrained(save_quantized(model, tmp_path / "ckpt")).eval()
    ours = outputs_of(model, BATCH)
    assert torch.equal(outputs_of(theirs, BATCH).argmax(-1), ours.argmax(-1))


def test_e5m2_round_trip(tmp_path):
    """compressed-tensors has no e5m2 FP8: the format is kept in our namespaced extras and the tensors."""
    from safetensors import safe_open

    from fp8_linear import FP8Linear, PRESETS, load_quantized, quantize_model, save_quantized

    model = quantize_model(tiny_llama(seed=33, num_hidden_layers=1), None,
                           PRESETS["fp8-dynamic"].with_(fmt="e5m2", weight_observer="minmax"), progress=False, gptq=False)
    path = save_quantized(model, tmp_path / "ckpt")
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.0.mlp.up_proj.weight").get_dtype() == "F8_E5M2"
    loaded = load_quantized(path, dtype=torch.float32)
    assert all(m.weight.dtype == torch.float8_e5m2 for m in loaded.modules() if isinstance(m, FP8Linear))
    assert torch.equal(outputs_of(loaded, BATCH), outputs_of(model, BATCH))


@pytest.mark.parametrize("source", ["llmcompressor/FP8", "llmcompressor/FP8_BLOCK", "foreign:finegrained", "foreign:fbgemm"])
def test_resave_loaded_checkpoint(source, tmp_path):
    """load_quantized -> save_quantized -> load_quantized: same schemes, bitwise-equal outputs."""
    import importlib.util

    from fp8_linear import FP8Linear, load_quantized, save_quantized

    if source.startswith("foreign:"):
        spec = importlib.util.spec_from_file_location("mff", os.path.join(FIXTURES, "make_foreign_fixtures.py"))
        mff = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mff)
        src = str(tmp_path / "src")
        mff.write_fixture(source.split(":")[1], src)
    else:
        src = os.path.join(FIXTURES, source)
    first = load_quantized(src, dtype=torch.float32)
    again = load_quantized(save_quantized(first, tmp_path / "ours"), dtype=torch.float32)
    assert [m.scheme for m in again.modules() if isinstance(m, FP8Linear)] == \
        [m.scheme for m in first.modules() if isinstance(m, FP8Linear)]
    assert torch.equal(outputs_of(again, BATCH), outputs_of(first, BATCH))
    with open(os.path.join(src, "config.json")) as f:
        source_method = json.load(f)["quantization_config"]["quant_method"]
    assert first.config.quantization_config["quant_method"] == source_method  # save restored the model's config
