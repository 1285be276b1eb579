"""Bad-input catalogue for the core public API: quantize_fp8, dequantize_fp8, fp8_gemm, FP8Linear,
QuantScheme. Each case: the error type, and a message naming the argument, expected and actual value."""

from __future__ import annotations

import pytest
import torch
from catalogue import Bad, check_bad, params
from torch import nn

from fp8_linear import (
    PRESETS,
    FP8Linear,
    fmt_max,
    QuantScheme,
    ScaleError,
    ShapeError,
    dequantize_fp8,
    fp8_gemm,
    quantize_fp8,
    resolve_scheme,
)

E4 = torch.float8_e4m3fn
M, N, K = 4, 72, 48
NAN, INF = float("nan"), float("inf")


def _a(m=M, k=K, device="cpu"):
    return (torch.randn(m, k) * 4).to(E4).to(device)


def _b(n=N, k=K, device="cpu"):
    return (torch.randn(n, k) * 4).to(E4).to(device)


def _gemm(**over):
    """``fp8_gemm`` on valid operands with some arguments replaced."""
    args = dict(a=_a(), b=_b(), scale_a=torch.ones(1), scale_b=torch.full((N, 1), 0.01), bias=None)
    args.update(over)
    return lambda: fp8_gemm(**args)


def _scale_with(value, shape=(N, 1)):
    s = torch.full(shape, 0.01)
    s.view(-1)[shape[0] // 2] = value
    return s


def _linear(preset="fp8-channel", k=K, n=N, amax=4.0):
    return FP8Linear.from_linear(nn.Linear(k, n), preset, input_amax=amax)


def _with_param(mod, name, value):
    getattr(mod, name).data = value
    return mod


def _nan_linear():
    lin = nn.Linear(K, N)
    with torch.no_grad():
        lin.weight[3, 5] = NAN
    return lin


QUANTIZE = [
    Bad("quantize-x-list", lambda: quantize_fp8([1.0, 2.0]), TypeError, "x", "torch.Tensor", "list"),
    Bad("quantize-x-int", lambda: quantize_fp8(torch.ones(4, dtype=torch.int32)), TypeError, "x", "floating", "torch.int32"),
    Bad("quantize-x-fp8", lambda: quantize_fp8(torch.ones(4).to(E4)), TypeError, "x", "floating", "float8_e4m3fn"),
    Bad("quantize-fmt-name", lambda: quantize_fp8(torch.ones(4), fmt="e3m4"), ValueError, "fmt", "e4m3", "'e3m4'"),
    Bad("quantize-fmt-dtype", lambda: quantize_fp8(torch.ones(4), fmt=torch.float16), TypeError, "fmt", "e4m3", "torch.float16"),
    Bad("quantize-granularity", lambda: quantize_fp8(torch.ones(4), granularity="row"), ValueError, "granularity", "'channel'", "'row'"),
    Bad("quantize-rounding", lambda: quantize_fp8(torch.ones(4), rounding="up"), ValueError, "rounding", "'stochastic'", "'up'"),
    Bad("quantize-channel-3d", lambda: quantize_fp8(torch.ones(2, 3, 4), granularity="channel"), ShapeError, "x", "2-D", "[2, 3, 4]"),
    Bad("quantize-block-1d", lambda: quantize_fp8(torch.ones(300), granularity="block"), ShapeError, "x", "2-D", "[300]"),
    Bad("quantize-scale-shape", lambda: quantize_fp8(torch.ones(N, K), granularity="channel", scale=torch.ones(5)),
        ScaleError, "scale", f"[{N}, 1]", "[5]"),
    Bad("quantize-scale-nan", lambda: quantize_fp8(torch.ones(N, K), granularity="channel", scale=_scale_with(NAN)),
        ScaleError, "scale", "finite positive", "nan"),
    Bad("quantize-scale-inf", lambda: quantize_fp8(torch.ones(4), scale=torch.tensor([INF])), ScaleError, "scale", "finite positive", "inf"),
    Bad("quantize-scale-zero", lambda: quantize_fp8(torch.ones(4), scale=torch.zeros(1)), ScaleError, "scale", "finite positive", "0.0"),
    Bad("quantize-scale-negative", lambda: quantize_fp8(torch.ones(4), scale=torch.tensor([-2.0])), ScaleError, "scale", "finite positive", "-2.0"),
    Bad("quantize-scale-int", lambda: quantize_fp8(torch.ones(4), scale=torch.ones(1, dtype=torch.int64)), TypeError, "scale", "float32", "torch.int64"),
    Bad("quantize-scale-not-tensor", lambda: quantize_fp8(torch.ones(4), scale=0.5), TypeError, "scale", "torch.Tensor", "float"),
    Bad("quantize-scale-device", lambda: quantize_fp8(torch.ones(4), scale=torch.ones(1, device="meta")),
        ValueError, "scale", "device cpu", "meta"),
    Bad("dequantize-scale-device", lambda: dequantize_fp8(_b(), torch.ones(1, device="meta")), ValueError, "scale", "device cpu", "meta"),
    Bad("dequantize-scale-not-tensor", lambda: dequantize_fp8(_b(), 0.5), TypeError, "scale", "torch.Tensor", "float"),
    Bad("dequantize-q-fp32", lambda: dequantize_fp8(torch.ones(4, 5), torch.ones(1)), TypeError, "q", "FP8", "torch.float32"),
    Bad("dequantize-scale-shape", lambda: dequantize_fp8(_b(300, 500), torch.ones(3)), ScaleError, "scale", "[300, 1]", "[3]"),
]

GEMM = [
    Bad("gemm-a-fp32", _gemm(a=torch.randn(M, K)), TypeError, "a", "float8_e4m3fn", "torch.float32"),
    Bad("gemm-b-bf16", _gemm(b=torch.randn(N, K, dtype=torch.bfloat16)), TypeError, "b", "float8_e4m3fn", "torch.bfloat16"),
    Bad("gemm-a-not-tensor", _gemm(a=[[1.0]]), TypeError, "a", "torch.Tensor", "list"),
    Bad("gemm-a-3d", _gemm(a=_a().reshape(2, 2, K)), ShapeError, "a", "2-D", f"[2, 2, {K}]"),
    Bad("gemm-k-mismatch", _gemm(b=_b(N, 64)), ShapeError, "b", f"K={K}", f"[{N}, 64]"),
    Bad("gemm-b-device", _gemm(b=_b(device="meta")), ValueError, "b", "device cpu", "meta"),
    Bad("gemm-scale_a-shape", _gemm(scale_a=torch.ones(M - 1, 1)), ScaleError, "scale_a", f"[{M}, 1]", f"[{M - 1}, 1]"),
    Bad("gemm-scale_b-shape", _gemm(scale_b=torch.ones(N)), ScaleError, "scale_b", f"[{N}, 1]", f"[{N}]"),
    Bad("gemm-scale_b-group-not-block", _gemm(scale_b=torch.ones(N, 2), b=_b(N, 256), a=_a(M, 256)),
        ScaleError, "scale_b", "[1, 2]", f"[{N}, 2]"),
    Bad("gemm-scale_a-nan", _gemm(scale_a=torch.tensor([NAN])), ScaleError, "scale_a", "finite positive", "nan"),
    Bad("gemm-scale_b-inf", _gemm(scale_b=_scale_with(INF)), ScaleError, "scale_b", "finite positive", "inf"),
    Bad("gemm-scale_a-zero", _gemm(scale_a=torch.zeros(M, 1)), ScaleError, "scale_a", "finite positive", "0.0"),
    Bad("gemm-scale_b-negative", _gemm(scale_b=_scale_with(-0.5)), ScaleError, "scale_b", "finite positive", "-0.5"),
    Bad("gemm-scale_a-device", _gemm(scale_a=torch.ones(1, device="meta")), ValueError, "scale_a", "device cpu", "meta"),
    Bad("gemm-scale_b-int", _gemm(scale_b=torch.ones(1, dtype=torch.int32)), TypeError, "scale_b", "float32", "torch.int32"),
    Bad("gemm-scale_a-not-tensor", _gemm(scale_a=1.0), TypeError, "scale_a", "torch.Tensor", "float"),
    Bad("gemm-bias-shape", _gemm(bias=torch.ones(N - 1)), ShapeError, "bias", f"[{N}]", f"[{N - 1}]"),
    Bad("gemm-bias-int", _gemm(bias=torch.ones(N, dtype=torch.int64)), TypeError, "bias", "float32", "torch.int64"),
    Bad("gemm-bias-device", _gemm(bias=torch.ones(N, device="meta")), ValueError, "bias", "device cpu", "meta"),
    Bad("gemm-bias-list", _gemm(bias=[0.0] * N), TypeError, "bias", "torch.Tensor", "list"),
    Bad("gemm-out-dtype", lambda: fp8_gemm(_a(), _b(), torch.ones(1), torch.ones(1), out_dtype=torch.int8),
        TypeError, "out_dtype", "torch.bfloat16", "torch.int8"),
]

MODULE = [
    Bad("linear-x-last-dim", lambda: _linear()(torch.randn(3, K - 1)), ShapeError, "x", f"last dimension {K}", f"[3, {K - 1}]"),
    Bad("linear-x-scalar", lambda: _linear()(torch.tensor(1.0)), ShapeError, "x", f"last dimension {K}", "[]"),
    Bad("linear-x-int", lambda: _linear()(torch.ones(3, K, dtype=torch.int64)), TypeError, "x", "bfloat16", "torch.int64"),
    Bad("linear-x-fp64", lambda: _linear()(torch.ones(3, K, dtype=torch.float64)), TypeError, "x", "float32", "torch.float64"),
    Bad("linear-x-fp8", lambda: _linear()(torch.ones(3, K).to(E4)), TypeError, "x", "float16", "torch.float8_e4m3fn"),
    Bad("linear-x-device", lambda: _linear()(torch.ones(3, K, device="meta")), ValueError, "x", "device cpu", "meta"),
    Bad("linear-x-list", lambda: _linear()([[0.0] * K]), TypeError, "x", "torch.Tensor", "list"),
    Bad("from_linear-conv", lambda: FP8Linear.from_linear(nn.Conv1d(4, 4, 1)), TypeError, "linear", "torch.nn.Linear", "Conv1d"),
    Bad("from_linear-module-list", lambda: FP8Linear.from_linear(nn.Sequential(nn.Linear(K, N))), TypeError, "linear", "torch.nn.Linear", "Sequential"),
    Bad("from_linear-static-no-amax", lambda: FP8Linear.from_linear(nn.Linear(K, N), "fp8-tensor"), ValueError, "input_amax", "fp8-tensor", "None"),
    Bad("from_linear-amax-nan", lambda: _linear(amax=NAN), ScaleError, "input_amax", "finite non-negative", "nan"),
    Bad("from_linear-amax-inf", lambda: _linear(amax=INF), ScaleError, "input_amax", "finite non-negative", "inf"),
    Bad("from_linear-amax-negative", lambda: _linear(amax=-1.0), ScaleError, "input_amax", "finite non-negative", "-1.0"),
    Bad("from_linear-amax-two-values", lambda: _linear(amax=torch.tensor([1.0, 2.0])), ScaleError, "input_amax", "one", "[1., 2.]"),
    Bad("from_linear-nan-weight", lambda: FP8Linear.from_linear(_nan_linear(), "fp8-dynamic"), ValueError, "linear.weight", "finite", "NaN"),
    Bad("from_linear-scheme", lambda: FP8Linear.from_linear(nn.Linear(K, N), "fp8-row"), ValueError, "scheme", "'fp8-channel'", "'fp8-row'"),
    Bad("from_linear-weight_scale-shape", lambda: FP8Linear.from_linear(nn.Linear(K, N), "fp8-dynamic", weight_scale=torch.ones(1, N)),
        ScaleError, "weight_scale", f"[{N}, 1]", f"[1, {N}]"),
    Bad("from_linear-weight_scale-negative", lambda: FP8Linear.from_linear(nn.Linear(K, N), "fp8-dynamic", weight_scale=_scale_with(-1.0)),
        ScaleError, "weight_scale", "finite positive", "-1.0"),
    Bad("linear-zero-features", lambda: FP8Linear(0, N), ShapeError, "in_features", "positive", f"0/{N}"),
    Bad("linear-check-weight_scale-shape", lambda: _with_param(_linear(), "weight_scale", torch.ones(3)).check(),
        ScaleError, "weight_scale", f"[{N}, 1]", "[3]"),
    Bad("linear-check-weight_scale-nan", lambda: _with_param(_linear(), "weight_scale", _scale_with(NAN)).check(),
        ScaleError, "weight_scale", "finite positive", "nan"),
    Bad("linear-check-input_scale-zero", lambda: _with_param(_linear(), "input_scale", torch.zeros(1)).check(),
        ScaleError, "input_scale", "finite positive", "0.0"),
    Bad("linear-check-weight-dtype", lambda: _with_param(_linear(), "weight", torch.ones(N, K)).check(),
        TypeError, "weight", "FP8", "torch.float32"),
    Bad("linear-check-weight-shape", lambda: _with_param(_linear(), "weight", torch.ones(K, N).to(E4)).check(),
        ShapeError, "weight", f"[{N}, {K}]", f"[{K}, {N}]"),
]

FORMAT = [
    Bad("fmt_max-fp32", lambda: fmt_max(torch.float32), TypeError, "dtype", "FP8 dtype", "torch.float32"),
    Bad("fmt_max-name", lambda: fmt_max("fp8"), ValueError, "dtype", "'e4m3'", "'fp8'"),
]

SCHEME = [
    Bad("scheme-weight-granularity", lambda: QuantScheme("x", "row", False, "tensor"), ValueError, "weight_granularity", "'channel'", "'row'"),
    Bad("scheme-activation-granularity", lambda: QuantScheme("x", "tensor", True, "block"), ValueError, "activation_granularity", "'token'", "'block'"),
    Bad("scheme-static-per-token", lambda: QuantScheme("x", "channel", False, "token"), ValueError, "activation_granularity", "per-tensor", "'token'"),
    Bad("scheme-fmt", lambda: QuantScheme("x", "tensor", False, "tensor", fmt="fp8"), ValueError, "fmt", "'e4m3'", "'fp8'"),
    Bad("scheme-observer", lambda: QuantScheme("x", "tensor", False, "tensor", weight_observer="max"), ValueError, "weight_observer", "'mse'", "'max'"),
    Bad("scheme-with-bad-field", lambda: PRESETS["fp8-channel"].with_(activation_observer="p99"), ValueError, "activation_observer", "'minmax'", "'p99'"),
    Bad("scheme-resolve-int", lambda: resolve_scheme(3), ValueError, "scheme", "'fp8-block'", "3"),
]

CASES = QUANTIZE + GEMM + MODULE + FORMAT + SCHEME


@params(CASES)
def test_bad_input(case):
    check_bad(case)


def test_catalogue_ids_unique():
    assert len({c.id for c in CASES}) == len(CASES)
