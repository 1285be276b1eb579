"""Shared fixtures of the calibration tests: tiny real models and a real word-level tokenizer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calib_helpers import make_word_tokenizer, tiny_llama_config


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
    return make_word_tokenizer()


@pytest.fixture
def tiny_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config()).eval()
