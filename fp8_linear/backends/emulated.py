"""The ``emulated`` backend: dequantize to fp32 and matmul. Any device; the numerical reference.

:func:`weight_cache` (a context manager) lets it keep the dequantized ``B`` operand (the FP8 weight
times its scale, fp32 ``[N, K]``) between calls, e.g. while evaluating several quantized models on a
CPU: the product is computed exactly as without the cache, so outputs are bitwise the same; an
entry is recomputed when the weight or its scale is modified in place or replaced.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from .. import ops
from ..quantize import fp8_to_float32, scale_
from .base import Backend, GemmProblem, LinearSpec, quantize_and_gemm

#: Default memory budget of :func:`weight_cache` (fp32 copies; 4x the FP8 weights they stand for).
WEIGHT_CACHE_BYTES = 8 * 2**30

_cache: dict | None = None  # id(b) -> (weakref(b), b._version, weakref(scale_b), scale_b._version, fp32 B)
_cache_room = 0


@contextlib.contextmanager
def weight_cache(max_bytes: int = WEIGHT_CACHE_BYTES):
    """Within the block, the emulated backend reuses the dequantized weight operand of each GEMM.

    Args:
        max_bytes: at most this many bytes of fp32 weights are kept (later weights run uncached).

    Results are bitwise those of uncached runs. Not thread-safe; nesting keeps the outer cache.
    """
    global _cache, _cache_room
    if _cache is not None:
        yield
        return
    _cache, _cache_room = {}, int(max_bytes)
    try:
        yield
    finally:
        _cache, _cache_room = None, 0


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter: never cached
        return None


def _dequantize_b(b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    global _cache_room
    if _cache is None:
        return scale_(fp8_to_float32(b), sb)
    hit = _cache.get(id(b))
    vb, vs = _version(b), _version(sb)
    if hit is not None and hit[0]() is b and hit[1] == vb and hit[2]() is sb and hit[3] == vs and vb is not None:
        return hit[4]
    out = scale_(fp8_to_float32(b), sb)
    if hit is not None:
        _cache.pop(id(b))
        _cache_room += hit[4].numel() * hit[4].element_size()
    size = out.numel() * out.element_size()
    if vb is not None and vs is not None and size <= _cache_room:
        _cache[id(b)] = (weakref.ref(b), vb, weakref.ref(sb), vs, out)
        _cache_room -= size
    return out


def emulated_gemm(a, b, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T + bias`` in fp32, cast to ``out_dtype``.

    a ``[M, K]`` / b ``[N, K]`` FP8; scales of any kind of docs/design.md section 2 (fp32);
    bias ``[N]`` or None. Dequantization is exact (an FP8 value times an fp32 scale).
    """
    out = scale_(fp8_to_float32(a), scale_a) @ _dequantize_b(b, scale_b).t()
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)


class EmulatedBackend(Backend):
    """Dequantize both operands (exactly, in fp32) and multiply in fp32."""

    name = "emulated"
    gemm_op = staticmethod(ops.emulated_gemm)

    def supports(self, device: torch.device) -> tuple[bool, str]:
        return True, "runs anywhere"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        return True, "takes every problem"

    def run(self, problem: GemmProblem) -> torch.Tensor:
        p = problem
        return emulated_gemm(p.a, p.b, p.scale_a, p.scale_b, p.bias, p.out_dtype)

    def can_serve(self, spec: LinearSpec) -> tuple[bool, str]:
        return True, "takes every layer"

    def apply(self, layer, x: torch.Tensor, spec: LinearSpec | None = None) -> torch.Tensor:
        # row-major first: the CPU's BLAS may sum a transposed operand in another order (an AMD EPYC's
        # MKL did, by one fp32 ulp, 2026-12-02), and a layer's output should not depend on its input's strides
        return quantize_and_gemm(layer, x.contiguous(), ops.emulated_gemm, spec)
