"""``FP8Linear`` compiled as transformers' decode step compiles it (``fullgraph=True``, the parameters as
graph inputs): the compiled call holds no object-identity guard on the layer's plan (it would run in
Python on every call), yet a replaced weight is served correctly — one of the same device, dtype and
shape is read fresh by the backend's ops, one of another dtype or shape recompiles and is re-planned.
CPU, emulated backend, ``aot_eager`` (the traced graph run as it is), outputs bitwise against eager.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear
from fp8_linear.scheme import resolve_scheme

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic"]
K, N = 96, 64


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _layer(preset: str, seed: int, fmt: str = "e4m3") -> FP8Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(K, N, bias=True)
    scheme = dataclasses.replace(resolve_scheme(preset), fmt=fmt)
    return FP8Linear.from_linear(lin, scheme, input_amax=6.0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("preset", PRESETS)
def test_replaced_weight_of_same_properties_is_read_fresh(preset):
    layer = _layer(preset, 0)
    f = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(5, K)
    with torch.inference_mode():
        assert torch.equal(_bits(f(x)), _bits(layer(x)))
        other = _layer(preset, 1)
        for name in ("weight", "weight_scale", "input_scale", "bias"):
            if getattr(other, name) is not None:
                setattr(layer, name, nn.Parameter(getattr(other, name).detach().clone(), requires_grad=False))
        want = other(x)
        assert torch.equal(_bits(f(x)), _bits(want))
        assert torch.equal(_bits(layer(x)), _bits(want))


def test_replaced_weight_of_another_format_recompiles_and_replans():
    layer = _layer("fp8-dynamic", 0)
    f = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, K)
    with torch.inference_mode():
        f(x)
        other = _layer("fp8-dynamic", 2, fmt="e5m2")
        layer.weight = nn.Parameter(other.weight.detach().clone(), requires_grad=False)
        layer.weight_scale = nn.Parameter(other.weight_scale.detach().clone(), requires_grad=False)
        layer.bias = nn.Parameter(other.bias.detach().clone(), requires_grad=False)
        out = f(x)
    assert layer._plan.spec.weight_dtype == torch.float8_e5m2
    assert torch.equal(_bits(out), _bits(other(x)))


def test_compiled_call_has_no_identity_guard_on_the_plan():
    """The old check ``plan.weight is w`` became ``LAMBDA_GUARD: L['self']._parameters['weight'] is
    L['self']._plan.weight``, a Python guard evaluated on every call (about 4 us a layer on a 2-core CPU)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    layer = _layer("fp8-tensor", 0)
    f = torch.compile(layer, backend="aot_eager", fullgraph=True)
    with torch.inference_mode():
        f(torch.randn(2, K))
    entries = _debug_get_cache_entry_list(type(layer).forward.__code__)
    assert len(entries) == 1
    text = str(entries[0].guard_manager)
    assert "_plan" in text and "_parameters['weight']" in text  # the guards of the plan and the weight are there
    assert "_plan.weight" not in text and "LAMBDA_GUARD: L['self']._parameters" not in text
