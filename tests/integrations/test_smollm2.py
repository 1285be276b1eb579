"""The bundled SmolLM2-135M (CPU): ``from_pretrained`` with ``FP8LinearConfig(scheme=...)`` from a bf16
folder gives the model, and so the first 32 greedy tokens, that ``quantize_model`` gives with the same
preset and round-to-nearest weights (GPTQ off), for both schemes without calibration."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fp8_linear
from fp8_linear import FP8Linear, FP8LinearConfig

from integ_helpers import assert_same_state, greedy

PROMPT = "The Python statement `with` is used to"
NEW_TOKENS = 32
#: SmolLM2-135M: 30 decoder layers of 7 Linear layers; lm_head is tied to the embeddings.
SMOLLM2_LINEARS = 30 * 7


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "fp8-block"])
def test_same_32_greedy_tokens_as_quantize_model(smollm2_bf16_dir, scheme):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_bf16_dir)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    ours = AutoModelForCausalLM.from_pretrained(smollm2_bf16_dir, dtype=torch.float32,
                                                quantization_config=FP8LinearConfig(scheme=scheme))
    ref = AutoModelForCausalLM.from_pretrained(smollm2_bf16_dir, dtype=torch.float32)
    fp8_linear.quantize_model(ref, None, scheme, gptq=False, progress=False)
    assert sum(isinstance(m, FP8Linear) for m in ours.modules()) == SMOLLM2_LINEARS
    assert type(ours.lm_head) is nn.Linear
    assert_same_state(ours, ref)
    a, b = greedy(ours, ids, NEW_TOKENS), greedy(ref, ids, NEW_TOKENS)
    assert a.shape == (NEW_TOKENS,)
    assert torch.equal(a, b), (tok.decode(a), tok.decode(b))
