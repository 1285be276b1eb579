"""Checkpoints written by llm-compressor load with ``load_quantized`` and reproduce llm-compressor's
own model: tiny fixtures in CI (``tests/fixtures/make_llmcompressor_fixtures.py`` wrote them and
llm-compressor's logits), full-size SmolLM2 where llm-compressor is installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from safetensors.torch import load_file

from ckpt_helpers import FIXTURES, outputs_of

#: llm-compressor scheme -> our preset with the same granularities.
TWINS = {"FP8": "fp8-tensor", "FP8_DYNAMIC": "fp8-dynamic", "FP8_BLOCK": "fp8-block"}
FULL_SIZE_SCHEMES = ("FP8", "FP8_DYNAMIC")
CALIB_SAMPLES, CALIB_LEN = 8, 128
def _installed(name: str) -> bool:
    """A real installed package (a namespace folder such as tests/fixtures/llmcompressor does not count)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None


needs_llmcompressor = pytest.mark.skipif(not (_installed("llmcompressor") and _installed("datasets")),
                                         reason="llm-compressor (with datasets) is not installed (the tiny fixtures cover CI)")


@pytest.mark.parametrize("scheme", sorted(TWINS))
def test_llmcompressor_fixture_matches_their_model(scheme):
    from fp8_linear import FP8Linear, PRESETS, load_quantized

    folder = os.path.join(FIXTURES, "llmcompressor", scheme)
    expected = load_file(os.path.join(folder, "expected.safetensors"))
    model = load_quantized(folder, dtype=torch.float32)
    fp8 = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert fp8 and all(m.scheme == PRESETS[TWINS[scheme]] for m in fp8)
    assert not isinstance(model.lm_head, FP8Linear)
    ours = outputs_of(model, {"input_ids": expected["input_ids"]})
    theirs = expected["logits"]
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    # Both dequantize the same FP8 numbers and multiply in fp32: equal up to fp32 summation order.
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="session")
def smollm2_hf_dir(smollm2, tmp_path_factory) -> str:
    """SmolLM2 as a float32 Hugging Face folder (llm-compressor's oneshot reads the model from disk)."""
    from safetensors.torch import save_model

    model, tok = smollm2
    folder = str(tmp_path_factory.mktemp("smollm2_hf"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the GGUF "quantization" is already dequantized
    config["architectures"] = [type(model).__name__]
    type(model.config).from_dict(config).save_pretrained(folder)
    save_model(model, os.path.join(folder, "model.safetensors"))
    tok.save_pretrained(folder)
    return folder


@needs_llmcompressor
@pytest.mark.parametrize("scheme", FULL_SIZE_SCHEMES)
def test_llmcompressor_smollm2_full_size(scheme, smollm2_hf_dir, smollm2_prompt, tmp_path):
    """oneshot on the real SmolLM2 (calibration split of the embedded corpus), then the same top-1 tokens
    on the 256-token eval prompt from their in-memory model and from ``load_quantized`` of what they saved."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fp8_linear import load_quantized
    from fp8_linear.calibration.data import corpus_text

    tok = AutoTokenizer.from_pretrained(smollm2_hf_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_hf_dir, dtype=torch.float32).eval()
    kw = {}
    if scheme == "FP8":
        ids = tok(corpus_text("calib")[:60000], return_tensors="pt").input_ids[0]
        rows = [ids[i * CALIB_LEN:(i + 1) * CALIB_LEN].tolist() for i in range(CALIB_SAMPLES)]
        kw = dict(dataset=Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * CALIB_LEN] * CALIB_SAMPLES}),
                  num_calibration_samples=CALIB_SAMPLES, max_seq_length=CALIB_LEN, processor=tok)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]), **kw)
    theirs = outputs_of(model, smollm2_prompt)
    model.save_pretrained(tmp_path / "ckpt")
    ours = outputs_of(load_quantized(tmp_path / "ckpt", dtype=torch.float32), smollm2_prompt)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
