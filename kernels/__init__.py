"""Hopper (sm_90a) FP8 GEMM kernel: CUDA sources, the JIT builder and the torch op.

Importing this package registers ``torch.ops.fp8_linear.sm90_gemm`` (with a fake implementation for
``torch.compile``) and builds nothing: the CUDA extension is built on the first call.
"""

from __future__ import annotations

import torch

from .configs import CONFIGS, KernelConfig, select_config, select_splits

__all__ = ["CONFIGS", "KernelConfig", "swap_ok", "select_config", "select_splits", "sm90_gemm", "sm90_gemm_out",
           "OP_NAME"]

OP_NAME = "fp8_linear::sm90_gemm"
_SCHEMA = (
    "sm90_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
    "ScalarType out_dtype, int config=-1) -> Tensor"
)


def swap_ok(scale_a, out_dtype: torch.dtype) -> bool:
    """Whether a launch suits the swapped large-M configs (:func:`select_config`'s ``swap_ok``): a
    per-tensor ``scale_a`` (one element) and a 16-bit output (their transposed TMA store)."""
    return scale_a.numel() == 1 and out_dtype in (torch.bfloat16, torch.float16)


def sm90_gemm_out(a, b, scale_a, scale_b, bias, out, config: int = -1, direct_store: bool = False,
                  splits: int | None = None) -> torch.Tensor:
    """Run the kernel into a preallocated contiguous ``out`` ([M, N]); ``config=-1`` picks by shape and
    :func:`swap_ok` (:func:`select_config`).
    ``direct_store=True`` forces the register -> global epilogue instead of the TMA store (tests).
    ``splits``: split-K factor (an upper bound; 1 = off); ``None`` picks by shape (:func:`select_splits`)."""
    from . import jit

    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    if config < 0:
        config = select_config(m, n, k, swap_ok=swap_ok(scale_a, out.dtype)).id
    if splits is None:
        splits = select_splits(CONFIGS[config], m, n, k) if 0 <= config < len(CONFIGS) else 1
    jit.load().gemm_out(a, b, scale_a, scale_b, bias, out, int(config), 1 if direct_store else 0, int(splits))
    return out


def _impl(a, b, scale_a, scale_b, bias, out_dtype, config=-1):
    out = torch.empty((a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    return sm90_gemm_out(a, b, scale_a, scale_b, bias, out, config)


def _fake(a, b, scale_a, scale_b, bias, out_dtype, config=-1):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _register() -> None:
    ns = torch.ops.fp8_linear if hasattr(torch.ops, "fp8_linear") else None
    try:
        if ns is not None and hasattr(ns, "sm90_gemm"):
            return  # already registered (module reloaded)
    except Exception:  # pragma: no cover - torch.ops lookups raise on some versions
        pass
    global _lib
    _lib = torch.library.Library("fp8_linear", "FRAGMENT")
    _lib.define(_SCHEMA)
    _lib.impl("sm90_gemm", _impl, "CUDA")
    torch.library.register_fake(OP_NAME, _fake, lib=_lib)


_lib = None
_register()


def sm90_gemm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16, config: int = -1) -> torch.Tensor:
    """``(a @ b.T) * scale_a * scale_b + bias`` through the sm90 kernel (the registered torch op)."""
    return torch.ops.fp8_linear.sm90_gemm(a, b, scale_a, scale_b, bias, out_dtype, config)
