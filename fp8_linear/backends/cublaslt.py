"""The ``cublaslt`` backend: ``torch._scaled_mm`` / ``torch.nn.functional.scaled_mm`` (cuBLASLt), compute capability >= 8.9.

Scales it runs: per-tensor and row-wise (``token`` x ``channel``, a per-tensor side broadcast), and
1x128 activation groups x 128x128 weight blocks through ``scaled_mm(a, b.t(), scale_a,
ScalingType.BlockWise1x128, scale_b.t(), ScalingType.BlockWise128x128)`` with ``scale_a`` ``[M, K/128]``
column-major. cuBLASLt refuses M = 1 there (``CUBLAS_STATUS_NOT_SUPPORTED``): the activation and its
scales are padded with zero rows to a multiple of :data:`BLOCK_M_ALIGN` tokens, and the extra rows of
the output dropped. Whether this torch and cuBLAS run block scales at all (and which ``scale_b``
layout they want) is probed once per device on a small problem against the emulated result; where
the probe fails the backend refuses block layers and problems with the probe's errors as the reason.
"""

from __future__ import annotations

import threading

import torch

from .. import ops
from ..formats import GROUP_SIZE
from .base import (
    ROW_KINDS,
    SCALE_BLOCK,
    SCALE_GROUP,
    SCALE_TENSOR,
    Backend,
    GemmProblem,
    LinearSpec,
    expand_scale_a_to_groups,
    quantize_and_gemm,
    scale_kinds,
)

#: First compute capability with FP8 tensor cores (Ada).
MIN_CAPABILITY = (8, 9)
#: cuBLASLt FP8 needs leading dimensions that are multiples of 16 bytes.
ALIGN = 16
#: Block scales: token count padded to a multiple of this (the column-major ``scale_a``'s leading
#: dimension is the token count, 16 bytes = 4 fp32).
BLOCK_M_ALIGN = 4
#: Block scales: the row stride of ``scale_b`` (``[ceil(N/128), ceil(K/128)]``) padded to a multiple of this.
BLOCK_KB_ALIGN = 4
#: Bias dtypes cuBLASLt's FP8 epilogue adds (it refuses a bias with fp32 output).
FUSED_BIAS_DTYPES = (torch.bfloat16, torch.float16)
#: Output dtype that every torch._scaled_mm build writes for row-wise and block scales.
SAFE_OUT_DTYPE = torch.bfloat16
ROWWISE_SAFE_DTYPE = SAFE_OUT_DTYPE
#: (device, scale family, out_dtype, fused bias) combinations this torch refused; written in bf16 instead.
_refused: set[tuple[str, str, torch.dtype, bool]] = set()
#: device -> (ok, reason, scale_b layout) of the block-scale probe.
_block_probe: dict[str, tuple[bool, str, str]] = {}
#: The probe's result must match the emulated GEMM within this calc_diff (bf16 output rounding is ~1e-5).
PROBE_BAR = 1e-4
_probe_lock = threading.Lock()


def _pad_rows(t: torch.Tensor, rows: int, fill: float) -> torch.Tensor:
    """``t`` ``[M, C]`` with rows appended up to ``rows`` (FP8 zeros or ``fill`` scales)."""
    out = (t.new_zeros if fill == 0 else t.new_ones)((rows, t.shape[1]))
    out[: t.shape[0]] = t
    return out


#: Layouts of the ``scale_b`` argument (the transpose of our ``[Nb, Kb]`` block scales) that torch
#: versions have asked for, tried in this order by the probe: ``padded``, ``[round_up(Kb, 4), Nb]`` whose
#: rows past Kb are padding (torch 2.11's ``_scaled_mm_v2``: "scale_b must have shape 8 x 2" for Kb = 5);
#: ``strided``, ``[Kb, Nb]`` with the columns of a ``[Nb, round_up(Kb, 4)]`` buffer; ``contiguous``,
#: ``[Kb, Nb]`` of the contiguous ``[Nb, Kb]``.
BLOCK_B_LAYOUTS = ("padded", "strided", "contiguous")


def _block_scale_b(sb: torch.Tensor, layout: str) -> torch.Tensor:
    """The ``scale_b`` argument of ``scaled_mm`` for our block scales ``sb`` ``[Nb, Kb]`` in ``layout``
    (:data:`BLOCK_B_LAYOUTS`); always a transposed view of a row-major buffer."""
    nb, kb = sb.shape
    kb4 = -(-kb // BLOCK_KB_ALIGN) * BLOCK_KB_ALIGN
    if layout == "contiguous" or kb4 == kb:
        return sb.contiguous().t()
    buf = sb.new_ones((nb, kb4))
    buf[:, :kb] = sb
    return buf.t() if layout == "padded" else buf[:, :kb].t()


def _block_mm(a, b, sa, sb, out_dtype, layout: str) -> torch.Tensor:
    from torch.nn.functional import ScalingType, scaled_mm

    m = a.shape[0]
    rows = -(-m // BLOCK_M_ALIGN) * BLOCK_M_ALIGN
    if rows != m:
        a, sa = _pad_rows(a, rows, 0.0), _pad_rows(sa, rows, 1.0)
    sa_cm = sa.t().contiguous().t()  # [M, K/128] column-major
    out = scaled_mm(a, b.t(), sa_cm, ScalingType.BlockWise1x128, _block_scale_b(sb, layout),
                    ScalingType.BlockWise128x128, output_dtype=out_dtype)
    return out[:m] if rows != m else out


def _block_layout(device: torch.device) -> tuple[bool, str, str]:
    """Probe (once per device) whether block scales run here and with which ``scale_b`` layout: an
    M = 1, N = 256, K = 640 problem (5 k-blocks: not a multiple of 4) against the emulated GEMM."""
    key = str(device)
    hit = _block_probe.get(key)
    if hit is not None:
        return hit
    with _probe_lock:
        if key in _block_probe:
            return _block_probe[key]
        from .emulated import emulated_gemm

        if not hasattr(torch.nn.functional, "scaled_mm"):
            res = (False, "this torch has no torch.nn.functional.scaled_mm (block scales)", "")
        else:
            g = torch.Generator(device="cpu").manual_seed(0)
            m, n, k = 1, 256, 640
            a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn).to(device)
            b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn).to(device)
            sa = (torch.rand(m, k // GROUP_SIZE, generator=g) + 0.5).to(device)
            sb = (torch.rand(n // GROUP_SIZE, k // GROUP_SIZE, generator=g) + 0.5).to(device)
            ref = emulated_gemm(a, b, sa, sb, None, torch.float32).double()
            errors = []
            res = None
            for layout in BLOCK_B_LAYOUTS:
                try:
                    out = _block_mm(a, b, sa, sb, SAFE_OUT_DTYPE, layout).double()
                except Exception as e:  # noqa: BLE001 - torch / cuBLASLt refusals (RuntimeError, ValueError): next layout
                    errors.append(f"{layout} scale_b: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                    continue
                err = float(1 - 2 * (out * ref).sum() / (out * out + ref * ref).sum())
                if err < PROBE_BAR:
                    res = (True, f"block scales ({layout} scale_b)", layout)
                    break
                errors.append(f"{layout} scale_b: wrong result (calc_diff {err:.3g})")
            if res is None:
                res = (False, "cuBLASLt block scales unavailable: " + "; ".join(errors), "")
        _block_probe[key] = res
        return res


#: cuBLASLt's row-wise scale pointers must be 16-byte aligned (torch does not check; a row slice of a
#: larger scale tensor, e.g. one expert's tokens, may start mid-vector: pytorch/pytorch#159957).
SCALE_ALIGN_BYTES = 16


def aligned_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` itself, or a copy where its data pointer is not SCALE_ALIGN_BYTES-aligned."""
    return scale if scale.data_ptr() % SCALE_ALIGN_BYTES == 0 else scale.clone()


def cublaslt_gemm(a, b, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ b.T * scales + bias`` through cuBLASLt: a ``[M, K]`` / b ``[N, K]`` FP8 on CUDA, scales of
    a pair this backend runs (see the module docstring), bias ``[N]`` or None; ``[M, N]`` of ``out_dtype``."""
    m, n = a.shape[0], b.shape[0]
    ka, kb = scale_kinds(scale_a, scale_b, m, n)
    if kb == SCALE_BLOCK:
        family = "block"
        if ka != SCALE_GROUP:
            scale_a = expand_scale_a_to_groups(scale_a, m, a.shape[1])
        layout = _block_layout(a.device)[2]
        sa = sb = None
    elif ka in ROW_KINDS or kb in ROW_KINDS:
        # torch._scaled_mm takes both scales row-wise ([M, 1] and [1, N]) or both per-tensor.
        family = "row"
        sa = aligned_scale(scale_a.float().reshape(-1, 1).expand(m, 1).contiguous())
        sb = aligned_scale(scale_b.float().reshape(1, -1).expand(1, n).contiguous())
    else:
        family = "tensor"
        sa, sb = scale_a.float().reshape(()), scale_b.float().reshape(())
    # Fuse the bias only when that loses nothing: cuBLASLt takes a bf16/fp16 bias of the output
    # dtype. Otherwise multiply into fp32, add the bias in fp32, and round once at the end.
    fuse = family != "block" and bias is not None and bias.dtype == out_dtype and out_dtype in FUSED_BIAS_DTYPES
    want = out_dtype if bias is None or fuse else torch.float32
    key = (str(a.device), family, want, fuse)

    def mm(dtype, with_bias):
        if family == "block":
            return _block_mm(a, b, scale_a, scale_b, dtype, layout)
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias if with_bias else None, out_dtype=dtype)

    out = None
    if family == "tensor" or want == SAFE_OUT_DTYPE or key not in _refused:
        try:
            out = mm(want, fuse)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError):  # torch >= 2.10 reports some refusals as ValueError
            if family == "tensor" or want == SAFE_OUT_DTYPE:
                raise
            _refused.add(key)  # older builds write row-wise / block results in bf16 only
    if out is None:
        out, fuse = mm(SAFE_OUT_DTYPE, False), False
    if bias is not None and not fuse:
        out = out.float() + bias.float()
    return out.to(out_dtype)


class CublasLtBackend(Backend):
    """Per-tensor, row-wise and block scales through cuBLASLt."""

    name = "cublaslt"
    gemm_op = staticmethod(ops.cublaslt_gemm)

    def supports(self, device: torch.device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"needs a CUDA device, got {device.type}"
        if not hasattr(torch, "_scaled_mm"):
            return False, "this torch has no torch._scaled_mm"
        cc = torch.cuda.get_device_capability(device)
        if cc < MIN_CAPABILITY:
            return False, f"needs compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, device has {cc[0]}.{cc[1]}"
        return True, f"compute capability {cc[0]}.{cc[1]}"

    @staticmethod
    def _kinds_ok(ka: str, kb: str, device: torch.device, fa: torch.dtype, fb: torch.dtype) -> tuple[bool, str]:
        if fa == torch.float8_e5m2 and fb == torch.float8_e5m2:
            return False, "cuBLASLt has no e5m2 x e5m2 FP8 GEMM"
        if kb == SCALE_BLOCK:
            if fa != torch.float8_e4m3fn or fb != torch.float8_e4m3fn:
                return False, "cuBLASLt block scales take e4m3 operands only"
            if device.type != "cuda":
                return False, f"needs a CUDA device, got {device.type}"
            ok, why, _ = _block_layout(device)
            return ok, why
        if ka == SCALE_GROUP:
            return False, f"scales {ka}/{kb}: 1x128 groups pair only with 128x128 weight blocks"
        return True, "per-tensor / row-wise scales"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        p = problem
        if p.k % ALIGN or p.n % ALIGN:
            return False, f"K={p.k} and N={p.n} must be multiples of {ALIGN}"
        if p.m == 0:
            return False, "M=0"
        if p.a.data_ptr() % ALIGN or p.b.data_ptr() % ALIGN:
            return False, f"a and b data pointers must be {ALIGN}-byte aligned (a view at an odd offset)"
        ok, why = self._kinds_ok(p.scale_a_kind, p.scale_b_kind, p.device, p.a.dtype, p.b.dtype)
        return ok, (f"{why}, 16-aligned K and N" if ok else why)

    def run(self, problem: GemmProblem) -> torch.Tensor:
        p = problem
        return cublaslt_gemm(p.a, p.b, p.scale_a, p.scale_b, p.bias, p.out_dtype)

    def can_serve(self, spec: LinearSpec) -> tuple[bool, str]:
        if spec.k % ALIGN or spec.n % ALIGN:
            return False, f"K={spec.k} and N={spec.n} must be multiples of {ALIGN}"
        return self._kinds_ok(spec.activation_kind, spec.weight_kind, spec.device, spec.weight_dtype, spec.weight_dtype)

    def process_weights(self, layer) -> None:
        super().process_weights(layer)
        if layer._parameters["weight"].data_ptr() % ALIGN:
            w = layer._parameters["weight"]
            layer._parameters["weight"] = torch.nn.Parameter(w.detach().clone(), requires_grad=False)

    def apply(self, layer, x: torch.Tensor, spec: LinearSpec | None = None) -> torch.Tensor:
        return quantize_and_gemm(layer, x, ops.cublaslt_gemm, spec)


__all__ = ["CublasLtBackend", "cublaslt_gemm", "SCALE_TENSOR"]
