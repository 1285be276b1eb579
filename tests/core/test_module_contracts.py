"""``FP8Linear``'s module contracts: autograd (straight-through estimator), ``load_state_dict``
validation, the backend plan (chosen once, refreshed on moves, replaced weights and settings
reloads, never state), and ``fp8_linear.settings`` read once."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from helpers import calc_diff
from torch import nn

from fp8_linear import FP8Linear, ScaleError, ShapeError, settings
from fp8_linear.backends import BackendUnavailableError, layer_candidates

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]


def _layer(preset="fp8-dynamic", k=160, n=96, bias=True) -> FP8Linear:
    return FP8Linear.from_linear(nn.Linear(k, n, bias=bias), preset, input_amax=6.0)


# --------------------------------------------------------------------------- autograd
@pytest.mark.parametrize("preset", PRESETS)
def test_input_gradient_is_the_straight_through_estimator(preset):
    mod = _layer(preset)
    x = (torch.randn(2, 7, 160, dtype=torch.float64) * 2).float().requires_grad_(True)
    y = mod(x)
    assert y.requires_grad
    with torch.no_grad():
        assert torch.equal(y, mod(x))  # the forward is the quantized output itself
    g = torch.randn_like(y)
    y.backward(g)
    w64 = mod.weight.double() * mod.weight_scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:96, :160] \
        if preset == "fp8-block" else mod.weight.double() * mod.weight_scale.double().reshape(-1, 1)
    ref = g.double() @ w64  # independent fp64 dequantization
    assert calc_diff(x.grad, ref) < 1e-10
    assert mod.weight.grad is None and mod.weight_scale.grad is None


def test_no_grad_inputs_build_no_graph():
    mod = _layer()
    y = mod(torch.randn(3, 160))
    assert not y.requires_grad and y.grad_fn is None


def test_gradient_flows_through_a_model_of_fp8_layers():
    a, b = _layer("fp8-tensor", 64, 64), _layer("fp8-block", 64, 32)
    x = torch.randn(5, 64, requires_grad=True)
    b(torch.relu(a(x))).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


# --------------------------------------------------------------------------- load_state_dict
def test_load_state_dict_round_trip():
    src, dst = _layer("fp8-channel"), _layer("fp8-channel")
    dst.load_state_dict(src.state_dict())
    x = torch.randn(4, 160)
    assert torch.equal(src(x), dst(x))


def test_load_state_dict_refuses_a_bf16_weight_by_name():
    mod = _layer()
    sd = mod.state_dict()
    sd["weight"] = torch.randn(96, 160, dtype=torch.bfloat16)
    before = mod.weight.clone()
    with pytest.raises(TypeError, match=r"weight: expected dtype torch.float8_e4m3fn.*got torch.bfloat16"):
        mod.load_state_dict(sd)
    assert torch.equal(mod.weight.view(torch.uint8), before.view(torch.uint8))  # nothing copied


@pytest.mark.parametrize("bad,what", [(0.0, "positive"), (float("nan"), "finite"), (-1.0, "positive"), (float("inf"), "finite")])
def test_load_state_dict_refuses_bad_weight_scales_by_name(bad, what):
    mod = _layer("fp8-channel")
    sd = mod.state_dict()
    sd["weight_scale"] = torch.full_like(sd["weight_scale"], bad)
    with pytest.raises(ScaleError, match=rf"weight_scale: expected finite positive values"):
        mod.load_state_dict(sd)


def test_load_state_dict_names_the_prefixed_tensor_in_a_model():
    model = nn.Sequential(nn.Identity(), _layer("fp8-tensor"))
    sd = model.state_dict()
    sd["1.input_scale"] = torch.zeros(1)
    with pytest.raises(ScaleError, match=r"1\.input_scale"):
        model.load_state_dict(sd)
    sd = model.state_dict()
    sd["1.weight_scale"] = torch.ones(96, 1)  # a per-channel scale into a per-tensor layer
    with pytest.raises(ScaleError, match=r"1\.weight_scale: expected shape \[1\]"):
        model.load_state_dict(sd)


def test_load_state_dict_refuses_float64_scales_that_underflow_fp32():
    mod = _layer("fp8-tensor")
    sd = mod.state_dict()
    sd["weight_scale"] = torch.tensor([1e-50], dtype=torch.float64)
    with pytest.raises(ScaleError, match="weight_scale"):
        mod.load_state_dict(sd)


def test_load_state_dict_of_wrong_shape_weight():
    mod = _layer()
    sd = mod.state_dict()
    sd["weight"] = sd["weight"][:, :128].contiguous()
    with pytest.raises((RuntimeError, ShapeError), match="weight"):
        mod.load_state_dict(sd)


# --------------------------------------------------------------------------- the plan
def test_plan_is_chosen_once_and_is_not_state():
    mod = _layer()
    plan = mod._plan
    assert plan is not None and plan.backend.name == "emulated" and "takes every layer" in plan.reason
    for _ in range(3):
        mod(torch.randn(2, 160))
    assert mod._plan is plan
    assert not any("plan" in k for k in mod.state_dict())
    assert copy.deepcopy(mod)._plan is None  # a copy plans on its first call
    buf = io.BytesIO()
    torch.save(mod, buf)
    buf.seek(0)
    twin = torch.load(buf, weights_only=False)
    x = torch.randn(3, 160)
    assert torch.equal(twin(x), mod(x)) and twin._plan is not None


def test_moves_and_casts_plan_again_and_keep_fp8():
    mod = _layer()
    plan = mod._plan
    mod.to(torch.float16)
    assert mod._plan is not plan and mod.weight.dtype == torch.float8_e4m3fn and mod.bias.dtype == torch.float16


def test_settings_are_read_once_and_reload_replans(fp8_env, monkeypatch):
    mod = _layer()
    plan = mod._plan
    monkeypatch.setenv(settings.BACKEND_ENV, "cublaslt")  # not read yet...
    mod(torch.randn(1, 160))
    assert mod._plan is plan and settings.get().backend is None
    settings.reload()  # ...until the settings are read again: then the forced backend refuses the CPU
    with pytest.raises(BackendUnavailableError, match="FP8_LINEAR_BACKEND=cublaslt cannot run FP8Linear.*needs a CUDA device"):
        mod(torch.randn(1, 160))
    fp8_env(FP8_LINEAR_BACKEND="emulated")
    mod(torch.randn(1, 160))
    assert mod._plan.reason == "forced by FP8_LINEAR_BACKEND"


def test_settings_parse_the_switches():
    s = settings.Settings.from_environ({settings.BACKEND_ENV: "  sm90 ", settings.FUSED_QUANT_ENV: "0"})
    assert s == settings.Settings(backend="sm90", fused_quant=False)
    assert settings.Settings.from_environ({}) == settings.Settings(backend=None, fused_quant=True)
    g = settings.GENERATION
    settings.reload()
    assert settings.GENERATION == g + 1


def test_layer_candidates_give_each_backends_reason():
    verdicts = {name: (ok, why) for name, ok, why in layer_candidates(_layer("fp8-block"))}
    assert verdicts["emulated"][0]
    assert not verdicts["sm90"][0] and "CUDA" in verdicts["sm90"][1]
    assert not verdicts["cublaslt"][0] and "CUDA" in verdicts["cublaslt"][1]


@pytest.mark.parametrize("value", [1e-50, 1e300])
def test_wide_float_scales_that_do_not_fit_fp32_are_refused_everywhere(value):
    from fp8_linear import fp8_gemm, quantize_fp8

    s = torch.tensor([value], dtype=torch.float64)
    with pytest.raises(ScaleError, match="scale_a: torch.float64 value .* overflows or underflows float32"):
        fp8_gemm(torch.ones(2, 32).to(torch.float8_e4m3fn), torch.ones(16, 32).to(torch.float8_e4m3fn), s, torch.ones(1))
    with pytest.raises(ScaleError, match="scale: torch.float64"):
        quantize_fp8(torch.randn(4, 8), scale=s)
    with pytest.raises(ScaleError, match="weight_scale"):
        FP8Linear.from_linear(nn.Linear(8, 4), "fp8-tensor", input_amax=1.0, weight_scale=s)
