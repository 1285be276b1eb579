"""A tiny Qwen3-MoE built from a config (no download) and real text as byte tokens, for the MoE tests.

2 decoder layers, 8 experts (top-2) of intermediate size 128 on a hidden size of 128: the layout of
Qwen3-30B-A3B (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``, a softmax top-k router) at toy size.
The vocabulary is the 256 byte values, so ``pydoc_data.topics`` (real English that ships with Python)
tokenizes as its UTF-8 bytes without a tokenizer.
"""

from __future__ import annotations

import torch

TINY_QWEN3_MOE = dict(
    vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, max_position_embeddings=512, tie_word_embeddings=False, decoder_sparse_step=1,
)
NUM_EXPERTS = TINY_QWEN3_MOE["num_experts"]


def tiny_qwen3_moe(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A fresh ``Qwen3MoeForCausalLM`` of :data:`TINY_QWEN3_MOE` (seeded init, eval mode)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**TINY_QWEN3_MOE, **overrides})).to(dtype).eval()


def byte_samples(split: str, samples: int, seq: int) -> list[torch.Tensor]:
    """``samples`` consecutive windows of ``seq`` byte tokens ``[seq]`` of the corpus split (``calib`` / ``eval``)."""
    from fp8_linear.calibration.data import corpus_text

    data = torch.tensor(list(corpus_text(split).encode("utf-8")), dtype=torch.int64)
    return [data[i * seq:(i + 1) * seq] for i in range(samples)]
