"""Hopper (sm_90a) FP8 GEMM kernel: CUDA sources, the JIT builder and the torch op.

Importing this package registers ``torch.ops.fp8_linear.sm90_gemm`` (with a fake implementation for
``torch.compile``) and builds nothing: the CUDA extension is built on the first call.
"""

from __future__ import annotations

import torch

from . import configs as configs_mod
from .configs import CONFIG_BY_ID, CONFIGS, KernelConfig, config, select_config, select_splits

__all__ = ["CONFIGS", "CONFIG_BY_ID", "KernelConfig", "config", "swap_ok", "is_block_scaled", "select_config", "select_splits", "sm90_gemm",
           "sm90_gemm_out", "OP_NAME", "BLOCK_SCALES", "SCALE_BLOCK"]

#: The kernel takes fine-grained scales (1x128 activation groups with 128x128 weight blocks; see
#: :func:`is_block_scaled`), checked on an H200 by tests/kernels/test_sm90_block_gpu.py.
BLOCK_SCALES = True
#: Width of the activation groups and height (and width) of the weight blocks of fine-grained scales.
SCALE_BLOCK = 128

OP_NAME = "fp8_linear::sm90_gemm"
_SCHEMA = (
    "sm90_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
    "ScalarType out_dtype, int config=-1) -> Tensor"
)


def is_block_scaled(scale_a, scale_b, m: int, n: int, k: int) -> bool:
    """Whether ``(scale_a, scale_b)`` are fine-grained scales for an ``[m, k] x [n, k]`` problem: scale_a
    2-D ``[m, ceil(k/128)]`` (fp32, any strides; one scale per token and 128 of K) with scale_b 2-D
    ``[ceil(n/128), ceil(k/128)]`` (one per 128 x 128 weight block). Where these shapes are also per-row /
    per-tensor ones (k <= 128 and n <= 128) the two readings are the same product and the per-row path
    runs (the binding's rule, ``csrc/binding.cpp`` is_block_scaled)."""
    kbn, nbn = -(-k // SCALE_BLOCK), -(-n // SCALE_BLOCK)
    return (scale_a.dim() == 2 and scale_b.dim() == 2 and tuple(scale_a.shape) == (m, kbn)
            and tuple(scale_b.shape) == (nbn, kbn) and not (kbn == 1 and nbn == 1))


def swap_ok(scale_a, out_dtype: torch.dtype) -> bool:
    """Whether a launch suits the swapped large-M configs (:func:`select_config`'s ``swap_ok``): a
    per-tensor ``scale_a`` (one element) and a 16-bit output (their transposed TMA store)."""
    return scale_a.numel() == 1 and out_dtype in (torch.bfloat16, torch.float16)


def sm90_gemm_out(a, b, scale_a, scale_b, bias, out, config: int | str = -1, direct_store: bool = False,
                  splits: int | None = None) -> torch.Tensor:
    """Run the kernel into a preallocated contiguous ``out`` ([M, N]); ``config=-1`` picks by shape and
    :func:`swap_ok` (:func:`select_config`), else a config id or name (``CONFIGS``).
    ``direct_store=True`` forces the register -> global epilogue instead of the TMA store (tests).
    ``splits``: split-K factor (an upper bound; 1 = off); ``None`` picks by shape (:func:`select_splits`).
    Fine-grained scales (:func:`is_block_scaled`) run the configs' block-scaled instances."""
    from . import jit

    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    if isinstance(config, str):
        config = configs_mod.config(config).id
    if config < 0:
        block = is_block_scaled(scale_a, scale_b, m, n, k)
        config = select_config(m, n, k, swap_ok=not block and swap_ok(scale_a, out.dtype), block=block).id
    if splits is None:
        splits = select_splits(CONFIG_BY_ID[config], m, n, k) if config in CONFIG_BY_ID else 1
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
    """``(a @ b.T) * scale_a * scale_b + bias`` through the sm90 kernel (the registered torch op).

    a ``[M, K]``, b ``[N, K]`` fp8 (e4m3 / e5m2), K-contiguous, K % 16 == 0; bias ``[N]`` or None; out
    ``[M, N]`` of ``out_dtype`` (bf16, fp16, fp32). Scales fp32, contiguous: scale_a ``[1]`` or ``[M, 1]``
    with scale_b ``[1]`` or ``[N, 1]``, or fine-grained: scale_a ``[M, ceil(K/128)]`` (1x128 groups) with
    scale_b ``[ceil(N/128), ceil(K/128)]`` (128x128 blocks, contiguous), applied in FP32 at every 128 of K.
    The kernel reads a fine-grained scale_a M-major (strides ``(1, ld)``, ``ld >= M`` a multiple of 4,
    16-byte aligned: the layout the extension's fused 1x128 quantization writes); any other layout
    (row-major, say) is copied into it first, one small extra kernel per call."""
    return torch.ops.fp8_linear.sm90_gemm(a, b, scale_a, scale_b, bias, out_dtype, config)
