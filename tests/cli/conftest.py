"""Fixtures of the CLI tests: tiny real models saved with save_pretrained, and text files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibration"))
from calib_helpers import WORDS, make_word_tokenizer, tiny_llama_config  # noqa: E402

_SUITE_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The CLI's ``main`` sets torch's thread count for its run (``fp8_linear.cli.threads``); restore
    the suite's own count (``OMP_NUM_THREADS``) after each test so later tests run with the threads
    the test run was started with (read at collection, before session fixtures run ``main``)."""
    yield
    torch.set_num_threads(_SUITE_THREADS)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny Llama (2 layers, hidden 32) and its word-level tokenizer in an HF folder."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(d)
    make_word_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory):
    """A tiny GPT-2: its blocks use Conv1D, so its only nn.Linear is the tied lm_head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    d = tmp_path_factory.mktemp("tiny_gpt2")
    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2)).save_pretrained(d)
    make_word_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    """A text file of 40 paragraphs of vocabulary words (deterministic)."""
    g = torch.Generator().manual_seed(0)
    paras = [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (30,), generator=g).tolist()) for _ in range(40)]
    p = tmp_path_factory.mktemp("data") / "text.txt"
    p.write_text("\n\n".join(paras))
    return p


@pytest.fixture(scope="session")
def tiny_fp8_checkpoint(tiny_llama_dir, text_file, tmp_path_factory):
    """``tiny_llama_dir`` quantized with fp8-channel by ``fp8-linear quantize`` (with its tokenizer)."""
    from fp8_linear.cli import EXIT_OK, main

    out = tmp_path_factory.mktemp("ckpt") / "tiny-fp8"
    rc = main(["quantize", "--model", str(tiny_llama_dir), "--scheme", "fp8-channel", "--calib", str(text_file),
               "--samples", "8", "--seq-len", "32", "-o", str(out), "-q"])
    assert rc == EXIT_OK
    return out
