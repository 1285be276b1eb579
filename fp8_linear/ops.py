"""The package's ``torch.library`` custom ops: what ``torch.compile`` sees of ``FP8Linear`` (docs/design.md section 4).

Every kernel of ours that ``FP8Linear`` launches is one of these ops (or the kernel package's
``fp8_linear::sm90_gemm``), each with a fake implementation, so ``torch.compile(fullgraph=True)``
traces an ``FP8Linear`` call with no graph break and CUDA graphs capture it: the ops allocate their
outputs, mutate no input and never synchronize with the host.

=================================== ==========================================================================
op                                  meaning
=================================== ==========================================================================
``quantize_static(x, scale, fp8)``  ``x [M, K]`` -> FP8 ``[M, K]`` with the given per-tensor fp32 ``scale [1]``
``quantize_dynamic(x, fp8, gran)``  ``x [M, K]`` -> (FP8 ``[M, K]``, fp32 scales ``[1]`` (``tensor``),
                                    ``[M, 1]`` (``token``) or ``[M, ceil(K/128)]`` (``group``))
``emulated_gemm(a, b, sa, sb, ...)`` the emulated backend's GEMM (dequantize, fp32 matmul)
``cublaslt_gemm(a, b, sa, sb, ...)`` the cuBLASLt backend's GEMM (``torch._scaled_mm`` / ``scaled_mm``)
``sm90_linear(x, w, si, sw, b, m)`` the sm90 backend's whole linear: activation quantization (mode 0 static,
                                    1 per token, 2 1x128 groups) + our GEMM (``block``: 128x128 weight
                                    blocks), ``[..., K] -> [..., N]``
=================================== ==========================================================================

Each op's Python wrapper below calls the implementation directly in eager mode (no dispatcher
round trip: at decode sizes that is most of a layer's host time) and the registered op while
``torch.compile`` traces; both run the same code, so compiled outputs are bitwise the eager ones.
The exception is the static and per-token activation quantization, which is traced as torch ops
(:mod:`fp8_linear.graph_quant`) so that inductor fuses it into the kernel that produces the
activation; those ops compute the kernels' bits (the IEEE fp32 quotient through an fp64 reciprocal product).
"""

from __future__ import annotations

import math

import torch

from . import graph_quant
from .formats import GROUP_SIZE

NAMESPACE = "fp8_linear"
_SCHEMAS = {
    "quantize_static": "quantize_static(Tensor x, Tensor scale, ScalarType fp8) -> Tensor",
    "quantize_dynamic": "quantize_dynamic(Tensor x, ScalarType fp8, str granularity) -> (Tensor, Tensor)",
    "emulated_gemm": ("emulated_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
                      "ScalarType out_dtype) -> Tensor"),
    "cublaslt_gemm": ("cublaslt_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
                      "ScalarType out_dtype) -> Tensor"),
    "sm90_linear": ("sm90_linear(Tensor x, Tensor weight, Tensor? input_scale, Tensor weight_scale, Tensor? bias, "
                    "int mode, bool block=False) -> Tensor"),
}


# ---------------------------------------------------------------- implementations (lazy imports: no cycles)
def _quantize_static_impl(x, scale, fp8):
    from .quantize import quantize_unchecked

    return quantize_unchecked(x, fp8, scale)


def _quantize_dynamic_impl(x, fp8, granularity):
    from .quantize import dynamic_quantize

    return dynamic_quantize(x, fp8, granularity)


def _emulated_gemm_impl(a, b, scale_a, scale_b, bias, out_dtype):
    from .backends.emulated import emulated_gemm

    return emulated_gemm(a, b, scale_a, scale_b, bias, out_dtype)


def _cublaslt_gemm_impl(a, b, scale_a, scale_b, bias, out_dtype):
    from .backends.cublaslt import cublaslt_gemm

    return cublaslt_gemm(a, b, scale_a, scale_b, bias, out_dtype)


def _sm90_linear_impl(x, weight, input_scale, weight_scale, bias, mode, block=False):
    from .backends.sm90 import sm90_linear

    return sm90_linear(x, weight, input_scale, weight_scale, bias, mode, block)


# ---------------------------------------------------------------- fake (meta) implementations
def _quantize_static_fake(x, scale, fp8):
    return x.new_empty(x.shape, dtype=fp8)


def _quantize_dynamic_fake(x, fp8, granularity):
    if granularity == "tensor":
        return x.new_empty(x.shape, dtype=fp8), x.new_empty((1,), dtype=torch.float32)
    cols = 1 if granularity == "token" else math.ceil(x.shape[-1] / GROUP_SIZE)
    return x.new_empty(x.shape, dtype=fp8), x.new_empty((*x.shape[:-1], cols), dtype=torch.float32)


def _gemm_fake(a, b, scale_a, scale_b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _sm90_linear_fake(x, weight, input_scale, weight_scale, bias, mode, block=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_IMPLS = {
    "quantize_static": (_quantize_static_impl, _quantize_static_fake, ("CPU", "CUDA")),
    "quantize_dynamic": (_quantize_dynamic_impl, _quantize_dynamic_fake, ("CPU", "CUDA")),
    "emulated_gemm": (_emulated_gemm_impl, _gemm_fake, ("CPU", "CUDA")),
    "cublaslt_gemm": (_cublaslt_gemm_impl, _gemm_fake, ("CUDA",)),
    "sm90_linear": (_sm90_linear_impl, _sm90_linear_fake, ("CUDA",)),
}

_lib: torch.library.Library | None = None


def _register() -> None:
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        impl, fake, keys = _IMPLS[name]
        lib.define(schema)
        for key in keys:
            lib.impl(name, impl, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    _lib = lib


_register()
_ops = torch.ops.fp8_linear
_compiling = torch.compiler.is_dynamo_compiling


# ---------------------------------------------------------------- callers: eager -> impl, traced -> op
def quantize_static(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """``x`` ``[M, K]`` (bf16/fp16/fp32) quantized to ``fp8`` with the per-tensor fp32 ``scale`` ``[1]``."""
    if _compiling():  # torch ops that inductor fuses into x's producer (bitwise the kernels' result)
        return graph_quant.quantize_static(x, scale, fp8)
    return _quantize_static_impl(x, scale, fp8)


def quantize_dynamic(x: torch.Tensor, fp8: torch.dtype, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of ``x`` ``[M, K]``: per ``tensor`` (scale ``[1]``), per ``token`` (``[M, 1]``) or 1x128
    ``group`` (``[M, ceil(K/128)]``), the scales computed from ``x`` itself."""
    if _compiling():
        if granularity == "token":  # as quantize_static
            return graph_quant.quantize_per_token(x, fp8)
        return _ops.quantize_dynamic(x, fp8, granularity)
    return _quantize_dynamic_impl(x, fp8, granularity)


def emulated_gemm(a, b, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """The emulated GEMM (``fp8_linear.backends.emulated.emulated_gemm``) as an op."""
    if _compiling():
        return _ops.emulated_gemm(a, b, scale_a, scale_b, bias, out_dtype)
    return _emulated_gemm_impl(a, b, scale_a, scale_b, bias, out_dtype)


def cublaslt_gemm(a, b, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """The cuBLASLt GEMM (``fp8_linear.backends.cublaslt.cublaslt_gemm``) as an op."""
    if _compiling():
        return _ops.cublaslt_gemm(a, b, scale_a, scale_b, bias, out_dtype)
    return _cublaslt_gemm_impl(a, b, scale_a, scale_b, bias, out_dtype)


def sm90_linear(x, weight, input_scale, weight_scale, bias, mode: int, block: bool = False) -> torch.Tensor:
    """The sm90 backend's linear (``fp8_linear.backends.sm90.sm90_linear``) as an op."""
    if _compiling():
        return _ops.sm90_linear(x, weight, input_scale, weight_scale, bias, mode, block)
    return _sm90_linear_impl(x, weight, input_scale, weight_scale, bias, mode, block)


__all__ = ["NAMESPACE", "cublaslt_gemm", "emulated_gemm", "quantize_dynamic", "quantize_static", "sm90_linear"]
