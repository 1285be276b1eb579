"""The end-to-end benchmarks' shared helpers on a small model of the Llama-3-8B architecture (CPU):
the model from a config, calibration and the FP8 swap there and back, weight bytes, prompts, and the
timing helpers off CUDA."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from benchmarks.common import cuda_clock, fp8_swap, random_model, weight_memory
from benchmarks.common.generate_clock import reset_compiled, timed_generate
from fp8_linear import FP8Linear, settings


@pytest.fixture(scope="module")
def tiny():
    return random_model.build_model("llama3-8b", None, "cpu", tiny=True)


def test_model_from_config(tiny):
    cfg = tiny.config
    assert cfg.num_hidden_layers == random_model.full_depth("llama3-8b", tiny=True) == 2
    assert cfg.hidden_size == random_model.TINY["hidden_size"] and cfg.num_key_value_heads == 2
    assert next(tiny.parameters()).dtype == torch.bfloat16 and not tiny.training
    assert random_model.build_model("llama3-8b", 1, "cpu", tiny=True).config.num_hidden_layers == 1
    again = random_model.build_model("llama3-8b", None, "cpu", tiny=True)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), tiny.parameters()))  # seeded
    assert random_model.full_depth("qwen2.5-7b") == 28
    with pytest.raises(KeyError, match="llama3-8b"):
        random_model.build_model("llama-9b", None, "cpu")


def test_prompts_are_the_same_for_one_batch_size():
    a = random_model.prompt_ids(1024, 4, 8, "cpu")
    assert a.shape == (4, 8) and a.dtype == torch.int64 and 0 <= int(a.min()) and int(a.max()) < 1024
    assert torch.equal(a, random_model.prompt_ids(1024, 4, 8, "cpu"))
    assert not torch.equal(a[:1], random_model.prompt_ids(1024, 1, 8, "cpu"))


def test_swap_to_fp8_and_back(tiny):
    bf16 = fp8_swap.decoder_linears(tiny)
    assert len(bf16) == 7 * 2 and all(type(m) is nn.Linear for m in bf16.values())
    assert not any("lm_head" in n for n in bf16)
    amax = fp8_swap.calibrate(tiny, tokens=16)
    assert set(amax) == set(bf16) and all(v > 0 for v in amax.values())
    assert not any(m._forward_pre_hooks for m in bf16.values())  # the hooks are gone
    fp8 = fp8_swap.fp8_layers(bf16, "fp8-tensor", amax)
    fp8_swap.swap_in(tiny, fp8)
    try:
        now = fp8_swap.decoder_linears(tiny)
        assert all(isinstance(m, FP8Linear) for m in now.values()) and list(now) == list(bf16)
        # the FP8 weights (1 byte each, plus scales) take about half of BF16's bytes
        ratio = weight_memory.weight_bytes(now.values()) / weight_memory.weight_bytes(bf16.values())
        assert 0.5 <= ratio < 0.52
    finally:
        fp8_swap.swap_in(tiny, bf16)
    assert all(fp8_swap.decoder_linears(tiny)[n] is m for n, m in bf16.items())


def test_forced_backend_is_restored(monkeypatch):
    monkeypatch.setenv(settings.BACKEND_ENV, "emulated")
    with fp8_swap.forced_backend(None):
        assert settings.BACKEND_ENV not in os.environ
    assert os.environ[settings.BACKEND_ENV] == "emulated"


def test_tensor_bytes():
    assert weight_memory.tensor_bytes(torch.zeros(3, 4, dtype=torch.bfloat16)) == 24
    assert weight_memory.weight_bytes([nn.Linear(4, 2, bias=True)]) == (8 + 2) * 4


def test_clocks_off_cuda(tiny):
    assert not cuda_clock.is_cuda("cpu") and cuda_clock.is_cuda("cuda:0")
    assert cuda_clock.cuda_ms(lambda: sum(range(1000)), 3, "cpu") > 0
    with pytest.raises(ValueError):
        cuda_clock.cuda_ms(lambda: None, 0, "cpu")
    assert cuda_clock.linear_step_ms(list(fp8_swap.decoder_linears(tiny).values()), 2, "cpu") > 0


def test_timed_generate_counts_every_token(tiny):
    ids = random_model.prompt_ids(tiny.config.vocab_size, 2, 5, "cpu")
    with torch.inference_mode():
        t, new = timed_generate(tiny, ids, 4, dict(disable_compile=True))
    assert new.shape == (2, 4) and new.device.type == "cpu"
    assert t["ttft_ms"] > 0 and t["step_ms"] > 0 and t["first_step_ms"] > 0
    reset_compiled(tiny)
    assert "_compiled_call" not in tiny.__dict__
