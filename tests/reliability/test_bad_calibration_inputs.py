"""Bad-input catalogue for ``fp8_linear.quantize_model`` and ``compare_schemes``, on a tiny real Llama.

The calibration engineer's tests (tests/calibration) check the behaviour; these check the
message contract: error type, and the argument, expected and actual value named."""

from __future__ import annotations

import pytest
import torch
from catalogue import Bad, check_bad, params
from tiny_models import VOCAB, tiny_llama, token_batch
from torch import nn

from fp8_linear import CalibrationError, compare_schemes, quantize_model

IDS = token_batch()
Q_PROJ = "model.layers.0.self_attn.q_proj"


def _quantize(data, scheme="fp8-tensor", model=None, **kw):
    return lambda: quantize_model(model if model is not None else tiny_llama(), data, scheme, progress=False, **kw)


def _poisoned(module_path: str, value: float):
    """A tiny Llama whose ``module_path`` weight has one ``value`` (NaN/inf) entry."""
    m = tiny_llama()
    with torch.no_grad():
        m.get_submodule(module_path).weight.view(-1)[0] = value
    return m


def _compare(eval_data, schemes=("fp8-dynamic",), model=None, **kw):
    return lambda: compare_schemes(model if model is not None else tiny_llama(), eval_data, schemes, calib_data=[IDS],
                                   save_reload=False, progress=False, **kw)


COMPARE = [
    Bad("compare-empty-eval", _compare([]), CalibrationError, "eval_data", "at least one non-padding token", "0 real tokens"),
    Bad("compare-all-padding-eval", _compare([{"input_ids": IDS, "attention_mask": torch.zeros_like(IDS)}]),
        CalibrationError, "eval_data", "at least one non-padding token", "0 real tokens"),
    Bad("compare-float-ids", _compare([IDS.float()]), TypeError, "input_ids", "integer", "torch.float32"),
    Bad("compare-no-schemes", _compare([IDS], schemes=()), ValueError, "schemes", "at least one scheme", "none"),
    Bad("compare-duplicate-schemes", _compare([IDS], schemes=("fp8-dynamic", "fp8-dynamic")), ValueError, "schemes",
        "distinct", "['fp8-dynamic', 'fp8-dynamic']"),
    Bad("compare-unknown-scheme", _compare([IDS], schemes=("fp8-row",)), ValueError, "scheme", "'fp8-block'", "'fp8-row'"),
    Bad("compare-model-not-module", _compare([IDS], model="HuggingFaceTB/SmolLM2-135M"), TypeError, "model", "torch.nn.Module", "str"),
    Bad("compare-eval-windows-zero", _compare([IDS], eval_windows=0), ValueError, "eval_windows", "positive", "0"),
]

CASES = [
    Bad("calib-empty-list", _quantize([]), CalibrationError, "calib_data", "at least one non-padding token", "0 real tokens"),
    Bad("calib-all-padding", _quantize([{"input_ids": IDS, "attention_mask": torch.zeros_like(IDS)}]),
        CalibrationError, "calib_data", "at least one non-padding token", "0 real tokens"),
    Bad("calib-nan-activation", _quantize([torch.zeros(8, dtype=torch.long)], model=_poisoned("model.embed_tokens", float("nan"))),
        CalibrationError, f"layer '{Q_PROJ}'", "finite", "NaN/inf"),
    Bad("calib-inf-activation", _quantize([IDS], model=_poisoned("model.layers.1.mlp.up_proj", float("inf"))),
        CalibrationError, "layer 'model.layers.1.mlp.down_proj'", "finite", "NaN/inf"),
    Bad("calib-float-ids", _quantize([IDS.float()]), TypeError, "input_ids", "integer", "torch.float32"),
    Bad("calib-3d-ids", _quantize([IDS.reshape(1, 2, 16)]), ValueError, "input_ids", "[B, T]", "[1, 2, 16]"),
    Bad("calib-mask-shape", _quantize([{"input_ids": IDS, "attention_mask": torch.ones(2, 15)}]),
        ValueError, "attention_mask", "[2, 16]", "[2, 15]"),
    Bad("calib-text-no-tokenizer", _quantize(["some text"]), ValueError, "tokenizer", "needs a tokenizer", "None"),
    Bad("calib-not-iterable", _quantize(5), TypeError, "calib_data", "a DataLoader", "int"),
    Bad("calib-mapping-keys", _quantize([{"ids": IDS}]), ValueError, "calib_data", "'input_ids'", "['ids']"),
    Bad("calib-unknown-scheme", _quantize([IDS], scheme="fp8-row"), ValueError, "scheme", "'fp8-channel'", "'fp8-row'"),
    Bad("calib-model-not-module", lambda: quantize_model("HuggingFaceTB/SmolLM2-135M", [IDS], progress=False),
        TypeError, "model", "torch.nn.Module", "str"),
    Bad("calib-no-linear", lambda: quantize_model(nn.Sequential(nn.Embedding(4, 4)), [IDS], progress=False),
        ValueError, "model", "at least one nn.Linear", "has none"),
    Bad("calib-max-samples-zero", _quantize([IDS], max_samples=0), ValueError, "max_samples", "positive", "/0"),
    Bad("calib-seq-len-negative", _quantize([IDS], seq_len=-5), ValueError, "seq_len", "positive", "-5/"),
    Bad("calib-batch-size-zero", _quantize([IDS], batch_size=0), ValueError, "batch_size", "positive", "0"),
    Bad("calib-batch-size-float", _quantize([IDS], batch_size=2.5), ValueError, "batch_size", "positive int", "2.5"),
    Bad("calib-ignore-int", _quantize([IDS], ignore=5), TypeError, "ignore", "strings", "5"),
    Bad("calib-ignore-module", _quantize([IDS], ignore=[nn.Linear]), TypeError, "ignore", "strings", "Linear"),
    Bad("calib-everything-ignored", _quantize([IDS], ignore=("re:.*",)), ValueError, "model", "at least one nn.Linear", "ignored"),
]


@params(CASES)
def test_bad_calibration_input(case):
    check_bad(case)


@params(COMPARE)
def test_bad_compare_input(case):
    check_bad(case)


def test_out_of_vocabulary_ids_are_not_silently_accepted():
    with pytest.raises((IndexError, ValueError)):
        quantize_model(tiny_llama(), [torch.tensor([VOCAB + 6, 3])], "fp8-tensor", progress=False)
