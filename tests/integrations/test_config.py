"""``FP8LinearConfig``: what it accepts, what it refuses (typed errors naming the argument), and its
dict round trip (the form transformers stores and rebuilds it from)."""

from __future__ import annotations

import json

import pytest

import fp8_linear
from fp8_linear import PRESETS, FP8LinearConfig, QuantScheme


@pytest.mark.parametrize("preset", ["fp8-dynamic", "fp8-block"])
def test_schemes_without_calibration_are_accepted(preset):
    cfg = FP8LinearConfig(scheme=preset)
    assert cfg.quant_method == "fp8_linear"
    assert cfg.quant_scheme == PRESETS[preset]
    assert cfg.ignore == ["lm_head"] and cfg.fmt == "e4m3" and cfg.backend is None


def test_default_is_fp8_dynamic():
    assert FP8LinearConfig().quant_scheme == PRESETS["fp8-dynamic"]
    assert fp8_linear.FP8LinearConfig is FP8LinearConfig


@pytest.mark.parametrize("preset", ["fp8-tensor", "fp8-channel"])
def test_static_schemes_are_refused_naming_quantize_model(preset):
    with pytest.raises(ValueError, match="quantize_model") as e:
        FP8LinearConfig(scheme=preset)
    assert preset in str(e.value) and "calibration" in str(e.value)


def test_custom_dynamic_scheme_and_fmt():
    mine = QuantScheme("mine", "tensor", True, "token")
    cfg = FP8LinearConfig(scheme=mine)
    assert cfg.quant_scheme == mine
    e5 = FP8LinearConfig(scheme="fp8-block", fmt="E5M2")
    assert e5.fmt == "e5m2" and e5.quant_scheme == PRESETS["fp8-block"].with_(fmt="e5m2")


def test_custom_static_scheme_refused():
    with pytest.raises(ValueError, match="quantize_model"):
        FP8LinearConfig(scheme=QuantScheme("static", "channel", False, "tensor"))


def test_calibrating_weight_observer_refused():
    with pytest.raises(ValueError, match="weight_observer 'mse'.*quantize_model"):
        FP8LinearConfig(scheme=PRESETS["fp8-dynamic"].with_(weight_observer="mse"))


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(scheme="fp8-nope"), ValueError, "scheme: expected one of"),
    (dict(scheme=3), ValueError, "scheme: expected one of"),
    (dict(scheme={"name": "x", "weight_granularity": "row"}), TypeError, "scheme: expected a preset name or QuantScheme fields"),
    (dict(fmt="e3m4"), ValueError, "fmt: expected one of"),
    (dict(backend="cutlass"), ValueError, "backend: expected None or one of"),
    (dict(ignore=[1]), TypeError, "ignore: expected module names"),
    (dict(ignore=5), TypeError, "ignore: expected a list"),
    (dict(scheme=PRESETS["fp8-dynamic"].with_(fmt="e5m2")), ValueError, "fmt: the scheme says 'e5m2' and fmt says 'e4m3'"),
])
def test_bad_arguments_raise_typed_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        FP8LinearConfig(**kwargs)


def test_single_ignore_string_is_a_list_of_one():
    assert FP8LinearConfig(ignore="re:.*mlp.*").ignore == ["re:.*mlp.*"]


@pytest.mark.parametrize("scheme", ["fp8-block", PRESETS["fp8-dynamic"].with_(name="mine")])
def test_dict_round_trip_through_json(scheme):
    cfg = FP8LinearConfig(scheme=scheme, ignore=["lm_head", "re:.*down_proj"], fmt="e4m3", backend="emulated")
    d = json.loads(json.dumps(cfg.to_dict()))
    back = FP8LinearConfig.from_dict(d)
    assert back.to_dict() == cfg.to_dict() and back.quant_scheme == cfg.quant_scheme
    assert dict(cfg) == cfg.to_dict()
    assert "fp8_linear" in repr(cfg)
