"""Mixed precision to a KL budget (``quantize_model(..., max_kl=...)``) on a tiny real Llama."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, quantize_model
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.mixed_precision import (
    layer_sensitivity,
    measure_kl,
    reference_logprobs,
    split_holdout,
)
from fp8_linear.calibration.quantize import apply_quantization, select_linears

from calib_helpers import tiny_llama_config


def _llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=3)).eval()
    with torch.no_grad():  # a few large weights make some layers clearly more sensitive than others
        model.model.layers[1].mlp.down_proj.weight[:, :4] *= 30
    return model


def _rows(n=16, t=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 64, (t,), generator=g) for _ in range(n)]


def _all_fp8_kl(model, rows):
    """KL of the all-FP8 model on the same held-out batches the budget search uses."""
    batches = materialize_batches(rows, batch_size=4)
    cal, hold = split_holdout(batches)
    refs = reference_logprobs(model, hold)
    q = quantize_model(copy.deepcopy(model), [r for b in cal for r in b.input_ids], "fp8-tensor", progress=False)
    return measure_kl(q, hold, refs)


def test_budget_met_with_fewest_layers():
    model, rows = _llama(), _rows()
    kl_all = _all_fp8_kl(model, rows)
    budget = kl_all / 3
    q = quantize_model(copy.deepcopy(model), rows, "fp8-tensor", max_kl=budget, progress=False)
    rep = q.fp8_mixed_precision
    assert rep.kl_all_fp8 == pytest.approx(kl_all, rel=1e-3)
    assert 0 < len(rep.kept) < 21 and rep.kl <= budget
    kept_types = {n for n, m in q.named_modules() if type(m) is nn.Linear and n != "lm_head"}
    assert kept_types == set(rep.kept)
    assert sum(isinstance(m, FP8Linear) for m in q.modules()) == 21 - len(rep.kept)
    # fewest: putting back one layer fewer (the least sensitive of the kept) misses the budget
    batches = materialize_batches(rows, batch_size=4)
    _, hold = split_holdout(batches)
    refs = reference_logprobs(model, hold)
    fp8 = quantize_model(copy.deepcopy(model), rows[:12], "fp8-tensor", progress=False)
    order = sorted(rep.sensitivity, key=rep.sensitivity.get, reverse=True)
    for name in order[:len(rep.kept) - 1]:
        parent, _, child = name.rpartition(".")
        setattr(fp8.get_submodule(parent), child, model.get_submodule(name))
    assert measure_kl(fp8, hold, refs) > budget
    # memory: FP8 bytes for the quantized layers, dense bytes for the kept ones
    dense = sum(model.get_submodule(n).weight.numel() * 4 for n in rep.kept)
    assert rep.weight_bytes_all_fp8 < rep.weight_bytes < rep.weight_bytes_unquantized
    assert rep.weight_bytes - rep.weight_bytes_all_fp8 < dense
    assert "kept in high precision" in rep.summary()


def test_loose_budget_keeps_nothing():
    model, rows = _llama(), _rows()
    q = quantize_model(copy.deepcopy(model), rows, "fp8-channel", max_kl=10.0, progress=False)
    assert q.fp8_mixed_precision.kept == []
    assert sum(isinstance(m, FP8Linear) for m in q.modules()) == 21


def test_sensitivity_predicts_single_layer_restores():
    """The first-order ranking agrees with measuring each restore: the most sensitive layer by the
    gradient estimate is among the three whose restore lowers the measured KL most."""
    model, rows = _llama(), _rows()
    batches = materialize_batches(rows, batch_size=4)
    cal, hold = split_holdout(batches)
    refs = reference_logprobs(model, hold)
    q = copy.deepcopy(model)
    originals = {n: copy.deepcopy(m) for n, m in select_linears(q).items()}
    quantize_model(q, [r for b in cal for r in b.input_ids], "fp8-tensor", progress=False)
    sens = layer_sensitivity(q, originals, hold, refs)
    kl_all = measure_kl(q, hold, refs)
    drop = {}
    for n in sens:
        parent, _, child = n.rpartition(".")
        fp8 = q.get_submodule(n)
        setattr(q.get_submodule(parent), child, originals[n])
        drop[n] = kl_all - measure_kl(q, hold, refs)
        setattr(q.get_submodule(parent), child, fp8)
    best = max(sens, key=sens.get)
    assert best in sorted(drop, key=drop.get, reverse=True)[:3]


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.1"])
def test_bad_budget_raises(bad):
    with pytest.raises(ValueError, match="max_kl"):
        quantize_model(_llama(), _rows(), "fp8-tensor", max_kl=bad, progress=False)


def test_budget_needs_two_batches():
    from fp8_linear import CalibrationError

    with pytest.raises(CalibrationError, match="held out"):
        quantize_model(_llama(), _rows(4), "fp8-tensor", max_kl=0.01, batch_size=4, progress=False)


def test_budget_checkpoint_round_trip(tmp_path):
    from fp8_linear import load_quantized, save_quantized

    model, rows = _llama(), _rows()
    q = quantize_model(copy.deepcopy(model), rows, "fp8-tensor", max_kl=_all_fp8_kl(model, rows) / 3, progress=False)
    kept = q.fp8_mixed_precision.kept
    assert kept
    save_quantized(q, tmp_path / "ckpt")
    r = load_quantized(tmp_path / "ckpt", dtype=torch.float32)
    assert {n for n, m in r.named_modules() if type(m) is nn.Linear and n != "lm_head"} == set(kept)
    x = torch.randint(2, 64, (1, 16))
    with torch.inference_mode():
        torch.testing.assert_close(r(x).logits, q(x).logits, rtol=1e-4, atol=1e-4)
