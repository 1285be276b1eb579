"""Our checkpoints load with transformers + compressed-tensors (their loader, not ours) on CPU and
give the same logits as our model (up to fp32 summation order, and e4m3 rounding flips that order can
cause, bounded as in test_llmcompressor.py) and so the same top-1 tokens; our config validates as theirs."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ckpt_helpers import PRESET_NAMES, TINY_LLAMA, outputs_of, quantize_tiny, random_ids, tiny_llama
from helpers import calc_diff
from test_llmcompressor import FP32_ORDER_BAR, assert_matches_up_to_flips, assert_top1_agrees, flip_candidates

pytest.importorskip("compressed_tensors")

#: compressed-tensors preset that each of our presets twins (``fp8-channel`` has none: FP8 with channel weights).
CT_TWIN = {"fp8-tensor": "FP8", "fp8-dynamic": "FP8_DYNAMIC", "fp8-block": "FP8_BLOCK"}


def _assert_same_logits_up_to_flips(model, batch: dict, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """``[B, T, V]`` logits of the same checkpoint from our loader and theirs: every token within fp32
    summation order of theirs, or, where a summation-order change moved an activation across an e4m3
    rounding midpoint, within the flip bars of test_llmcompressor.py (the census of flip candidates, one
    more forward pass, runs only then); top-1 equal wherever it is decided."""
    worst = max(calc_diff(ours[i, j], theirs[i, j]) for i in range(ours.shape[0]) for j in range(ours.shape[1]))
    if worst <= FP32_ORDER_BAR:
        assert_top1_agrees(ours, theirs)
        return
    assert_matches_up_to_flips(ours, theirs, flip_candidates(model, batch["input_ids"]))


def _their_outputs(path: str, batch: dict) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return outputs_of(model, batch)


def test_smollm2_transformers_loader_same_top1_256_tokens(smollm2_ckpts, smollm2_prompt):
    """``fp8-dynamic`` (their ``FP8_DYNAMIC``) on the 256-token prompt of the eval split; one preset only,
    as a 256-token emulated forward of SmolLM2 costs about 20 s on 2 CPU cores. Every preset runs through
    their loader on the tiny model below (SmolLM2's hidden size 576 is not a multiple of 128, which
    compressed-tensors' 1x128 activation groups cannot take, so ``fp8-block`` could not run here anyway)."""
    from fp8_linear import load_quantized

    path = smollm2_ckpts["fp8-dynamic"].path
    model = load_quantized(path, dtype=torch.float32)
    ours = outputs_of(model, smollm2_prompt)
    theirs = _their_outputs(path, smollm2_prompt)
    assert ours.shape[1] == 256
    _assert_same_logits_up_to_flips(model, smollm2_prompt, ours, theirs)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_tiny_llama_transformers_loader_every_preset(preset, tmp_path):
    from fp8_linear import save_quantized

    model = quantize_tiny(tiny_llama(seed=3), preset)
    batch = {"input_ids": random_ids((2, 48), TINY_LLAMA["vocab_size"], seed=4)}
    ours = outputs_of(model, batch)
    theirs = _their_outputs(save_quantized(model, tmp_path / "ckpt"), batch)
    _assert_same_logits_up_to_flips(model, batch, ours, theirs)


@pytest.mark.parametrize("preset", sorted(CT_TWIN))
def test_config_validates_as_compressed_tensors_preset(preset, tmp_path):
    """compressed-tensors parses our ``quantization_config`` and finds its own preset's arguments."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    from fp8_linear import save_quantized

    model = quantize_tiny(tiny_llama(seed=5, num_hidden_layers=1), preset)
    path = save_quantized(model, tmp_path / "ckpt")
    with open(os.path.join(path, "config.json")) as f:
        qc = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    twin = preset_name_to_scheme(CT_TWIN[preset], ["Linear"])
    group = qc.config_groups["group_0"]
    for part in ("weights", "input_activations"):
        ours, theirs = getattr(group, part), getattr(twin, part)
        for field in ("num_bits", "type", "symmetric", "strategy", "dynamic", "group_size", "block_structure"):
            assert getattr(ours, field) == getattr(theirs, field), (part, field)
    assert qc.ignore == ["lm_head"] and qc.quant_method == "compressed-tensors" and qc.format == "float-quantized"
