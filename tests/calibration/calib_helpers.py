"""Helpers shared by the calibration tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch

WORDS = "the a of to and in is it that for on with as was by be this are or from at an not".split()


def make_word_tokenizer():
    """A real ``PreTrainedTokenizerFast`` over a small word-level vocabulary (pad id 0, unknown id 1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


def tiny_llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    base.update(kw)
    return LlamaConfig(**base)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2 sum(xy) / sum(x^2 + y^2) in fp64 (0 = identical)."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
