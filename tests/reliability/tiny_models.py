"""Tiny real transformers models built from a config (no download), for the catalogue's
calibration and checkpoint cases."""

from __future__ import annotations

import torch

#: A 2-layer Llama with hidden size 64 and tied embeddings: 14 Linear layers plus the tied lm_head.
TINY_LLAMA = dict(
    vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
)
VOCAB = TINY_LLAMA["vocab_size"]


def tiny_llama(seed: int = 0, **overrides):
    """A fresh ``LlamaForCausalLM`` of :data:`TINY_LLAMA` (fp32, eval mode, seeded init)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **overrides})).eval()


def token_batch(batch: int = 2, seq: int = 16, seed: int = 0) -> torch.Tensor:
    """Random token ids ``[batch, seq]`` int64 inside the tiny vocabulary."""
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
