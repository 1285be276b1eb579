"""Shared fixtures of the calibration tests: tiny real models and a real word-level tokenizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calib_helpers import tiny_llama_config

WORDS = "the a of to and in is it that for on with as was by be this are or from at an not".split()


class EmbedLinear(nn.Module):
    """Embedding -> Linear -> Linear: the input amax of ``lin`` is exactly max |embedding rows used|."""

    def __init__(self, vocab: int = 64, hidden: int = 16, out: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lin = nn.Linear(hidden, out)
        self.head = nn.Linear(out, vocab, bias=False)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.lin(self.emb(input_ids)))


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return EmbedLinear().eval()


@pytest.fixture(scope="session")
def word_tokenizer():
    """A real ``PreTrainedTokenizerFast`` over a small word-level vocabulary (pad id 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]")


@pytest.fixture
def tiny_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config()).eval()
