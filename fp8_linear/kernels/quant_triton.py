"""Fused activation quantization for CUDA tensors (Triton): one launch instead of ~4-12 torch ops.

Same formula as the torch path in ``fp8_linear.quantize``, bitwise equal to the CPU path (FP8 bits
and scales; tests/core/test_fused_quant_gpu.py):
``q = cast_rne(clamp(x_fp32 / scale, -fmt_max, fmt_max))`` with IEEE division; for dynamic modes
``scale = max(amax_finite / fmt_max, MIN_SCALE)`` per row (token) or per 1x128 group.

Modes (``x`` is 2-D ``[rows, K]``, any float dtype, last dim contiguous):

- ``MODE_STATIC``: ``scale`` is a given fp32 ``[1]``;
- ``MODE_TOKEN``: returns scales ``[rows, 1]``;
- ``MODE_GROUP``: returns scales ``[rows, ceil(K/128)]``.

Triton is imported lazily; :func:`available` says whether this path can run and why not.
The path is on by default for CUDA tensors; ``FP8_LINEAR_FUSED_QUANT=0`` turns it off (torch ops;
the switch is read once by ``fp8_linear.settings``, not here). Under ``torch.compile`` this kernel
runs inside the ``fp8_linear::quantize_static`` / ``quantize_dynamic`` custom ops
(``fp8_linear/ops.py``), so dynamo never traces the launcher.
"""

from __future__ import annotations

import functools

import torch

MODE_STATIC, MODE_TOKEN, MODE_GROUP = 0, 1, 2
#: Elements of a row each program handles per step (token / static modes).
ROW_BLOCK = 1024
#: Group width of the 1x128 activation groups (docs/design.md section 2).
GROUP = 128
#: Switch (read by fp8_linear.settings): ``0`` turns the fused path off (torch ops instead). On by
#: default since it matched the CPU path bitwise on the GPU (torch's own CUDA ops do not: they divide
#: by a Python scalar through a reciprocal and can differ by one ulp in the scale).
ENV_DISABLE = "FP8_LINEAR_FUSED_QUANT"


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def quant_rows(x_ptr, q_ptr, s_ptr, K, stride_x, fmt_max, min_scale, n_groups,
                   MODE: tl.constexpr, BLOCK: tl.constexpr):
        # fmt_max / min_scale arrive as fp32 from a Python-float launch but as fp64 when inductor
        # launches the kernel (torch.compile); fp64 -> fp8 rtne has no lowering, so fix them at fp32
        # (a no-op for eager launches: the same bits as before).
        fmt_max = fmt_max.to(tl.float32)
        min_scale = min_scale.to(tl.float32)
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        q_row = q_ptr + row * K
        if MODE == 2:
            for g in range(0, n_groups):
                offs = g * BLOCK + tl.arange(0, BLOCK)
                mask = offs < K
                v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                a = tl.abs(v)
                a = tl.where((a == float("inf")) | (a != a), 0.0, a)
                scale = tl.maximum(tl.div_rn(tl.max(a, 0), fmt_max), min_scale)
                tl.store(s_ptr + row * n_groups + g, scale)
                y = tl.div_rn(v, scale)
                y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -fmt_max), fmt_max))
                tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
        else:
            if MODE == 0:
                scale = tl.load(s_ptr)
            else:
                amax = tl.zeros([BLOCK], dtype=tl.float32)
                for k0 in range(0, K, BLOCK):
                    offs = k0 + tl.arange(0, BLOCK)
                    v = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
                    a = tl.abs(v)
                    a = tl.where((a == float("inf")) | (a != a), 0.0, a)
                    amax = tl.maximum(amax, a)
                scale = tl.maximum(tl.div_rn(tl.max(amax, 0), fmt_max), min_scale)
                tl.store(s_ptr + row, scale)
            for k0 in range(0, K, BLOCK):
                offs = k0 + tl.arange(0, BLOCK)
                mask = offs < K
                v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                y = tl.div_rn(v, scale)
                y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -fmt_max), fmt_max))
                tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

    return quant_rows


@functools.lru_cache(maxsize=None)
def _triton_status() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return False, f"triton not importable: {e}"
    return True, "triton available"


def available(x: torch.Tensor) -> tuple[bool, str]:
    """Whether the fused path can quantize ``x`` (CUDA, 2-D, last dim contiguous, Triton present)."""
    if x.device.type != "cuda":
        return False, f"needs a CUDA tensor, got {x.device.type}"
    if x.dim() != 2 or x.stride(-1) != 1:
        return False, "needs a 2-D tensor with a contiguous last dimension"
    return _triton_status()


def quantize_rows(x: torch.Tensor, dtype: torch.dtype, mode: int, fmt_max: float, min_scale: float,
                  scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize 2-D CUDA ``x`` ``[rows, K]`` to FP8 ``dtype`` in one launch; returns ``(q, scale)``.

    ``mode`` is :data:`MODE_STATIC` (``scale`` fp32 ``[1]`` given), :data:`MODE_TOKEN` or
    :data:`MODE_GROUP` (scales computed and returned, ``[rows, 1]`` / ``[rows, ceil(K/128)]``).
    """
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=dtype, device=x.device)
    n_groups = -(-k // GROUP)
    if mode == MODE_STATIC:
        s = scale
    elif mode == MODE_TOKEN:
        s = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    else:
        s = torch.empty((rows, n_groups), dtype=torch.float32, device=x.device)
    if rows and k:
        block = GROUP if mode == MODE_GROUP else min(ROW_BLOCK, max(16, 1 << (k - 1).bit_length()))
        _kernel()[(rows,)](x, q, s, k, x.stride(0), fmt_max, min_scale, n_groups,
                           MODE=mode, BLOCK=block, num_warps=4 if block >= 512 else 1)
    return q, s
