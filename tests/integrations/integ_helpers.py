"""Helpers of the transformers-integration tests: tiny Llama-shaped checkpoints built from a config
(no download), bitwise state-dict comparison, and greedy generation."""

from __future__ import annotations

import os

import torch

#: A 2-layer Llama whose Linear shapes are awkward on purpose (192 / 320: not multiples of 128, so
#: ``fp8-block`` has ragged last blocks); tied embeddings, so ``lm_head`` is never quantized.
TINY = dict(vocab_size=256, hidden_size=192, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
#: Widen the default init (std 0.02) so the tiny random model has well-separated top-1 tokens.
WEIGHT_GAIN = 5.0
#: Linear layers per Llama decoder layer (q, k, v, o, gate, up, down).
LINEARS_PER_LAYER = 7


def tiny_llama(seed: int = 0, **overrides):
    """A seeded random ``LlamaForCausalLM`` (fp32, eval) of :data:`TINY` plus ``overrides``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**dict(TINY, **overrides))).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(WEIGHT_GAIN)
    return model


def save_tiny(path, dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides) -> str:
    """Save :func:`tiny_llama` in ``dtype`` as an HF folder at ``path``; returns the path."""
    tiny_llama(seed, **overrides).to(dtype).save_pretrained(path)
    return os.fspath(path)


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as raw bytes (so FP8 / NaN payloads compare bitwise with ``torch.equal``)."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def assert_same_state(a, b) -> None:
    """Two models (or state dicts) hold the same names, dtypes, shapes and bytes."""
    sa = a if isinstance(a, dict) else a.state_dict()
    sb = b if isinstance(b, dict) else b.state_dict()
    assert sorted(sa) == sorted(sb), sorted(set(sa) ^ set(sb))
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, (k, sa[k].dtype, sb[k].dtype, sa[k].shape, sb[k].shape)
        assert torch.equal(bits(sa[k]), bits(sb[k])), k


def greedy(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The ``new_tokens`` greedy continuation of ``ids`` ``[1, T]`` (``[new_tokens]`` int64).

    On the emulated backend the dequantized weights are kept across decode steps (``weight_cache``:
    bitwise the outputs of uncached runs), so each weight is dequantized once, not once per token.
    """
    from fp8_linear.backends.emulated import weight_cache

    with torch.inference_mode(), weight_cache():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1]:]


def random_ids(shape, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    """Seeded random token ids of ``shape`` (int64)."""
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))
