"""The ``sm90`` backend: our Hopper (sm_90a) FP8 GEMM kernel (docs/design.md section 5).

Importing this module needs no CUDA and builds nothing. ``supports`` checks the device and the
toolchain; the extension is built lazily on the first ``run`` (once, behind a lock, cached on disk
under ``FP8_LINEAR_CACHE``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import threading

import torch

from .base import SCALE_ROW, SCALE_TENSOR, Backend, GemmProblem

#: Compute capability the kernel is built for (wgmma / setmaxnreg need sm_90a exactly).
CAPABILITY = (9, 0)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)
_BIAS = (torch.bfloat16, torch.float16, torch.float32)
_INT32_MAX = 2**31 - 1

_kernels_lock = threading.Lock()
_kernels_mod = None


def kernels_module():
    """``fp8_linear.kernels`` (installed via package-dir), or the source tree's ``kernels/`` folder."""
    global _kernels_mod
    if _kernels_mod is not None:
        return _kernels_mod
    with _kernels_lock:
        if _kernels_mod is not None:
            return _kernels_mod
        try:
            mod = importlib.import_module("fp8_linear.kernels")
        except ImportError:
            src = pathlib.Path(__file__).resolve().parents[2] / "kernels"
            init = src / "__init__.py"
            if not init.is_file():
                raise
            spec = importlib.util.spec_from_file_location(
                "fp8_linear.kernels", init, submodule_search_locations=[str(src)]
            )
            mod = importlib.util.module_from_spec(spec)
            sys.modules["fp8_linear.kernels"] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop("fp8_linear.kernels", None)
                raise
        _kernels_mod = mod
        return mod


class Sm90Backend(Backend):
    """TMA + wgmma, warp-specialized, persistent; per-tensor / per-row scales, bias, 3 out dtypes."""

    name = "sm90"

    def supports(self, device: torch.device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"needs a CUDA device, got {device.type}"
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        cc = torch.cuda.get_device_capability(device)
        if tuple(cc) != CAPABILITY:
            return False, f"needs compute capability 9.0, device has {cc[0]}.{cc[1]}"
        try:
            jit = importlib.import_module(kernels_module().__name__ + ".jit")
        except ImportError as e:
            return False, f"kernel sources unavailable: {e}"
        if jit.is_loaded():
            return True, "compute capability 9.0, kernel built"
        ok, why = jit.toolchain_status()
        if not ok:
            return False, why
        return True, "compute capability 9.0, nvcc and ninja available"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        p = problem
        if p.scale_a_kind not in (SCALE_TENSOR, SCALE_ROW):
            return False, f"scale_a kind {p.scale_a_kind!r} is not supported by sm90 (per-tensor or per-row only)"
        if p.scale_b_kind not in (SCALE_TENSOR, SCALE_ROW):
            return False, f"scale_b kind {p.scale_b_kind!r} is not supported by sm90 (per-tensor or per-channel only)"
        if p.a.dtype not in _FP8 or p.b.dtype not in _FP8:
            return False, f"a/b dtypes {p.a.dtype}/{p.b.dtype} are not float8_e4m3fn/float8_e5m2"
        if p.a.dim() != 2 or p.b.dim() != 2:
            return False, "a and b must be 2-D"
        if p.out_dtype not in _OUT:
            return False, f"out_dtype {p.out_dtype} is not bf16, fp16 or fp32"
        m, n, k = p.m, p.n, p.k
        if m == 0 or n == 0 or k == 0:
            return False, f"empty problem M={m}, N={n}, K={k}"
        if k % 16 != 0:
            return False, f"K={k} is not a multiple of 16 (TMA needs 16-byte row strides)"
        if max(m, n, k) > _INT32_MAX:
            return False, f"M={m}, N={n}, K={k}: each must be below 2**31"
        if not p.a.is_contiguous() or not p.b.is_contiguous():
            return False, "a and b must be contiguous (K-major rows)"
        if p.a.data_ptr() % 16 or p.b.data_ptr() % 16:
            return False, "a and b data pointers must be 16-byte aligned (TMA)"
        if p.a.device.type != "cuda" or p.b.device != p.a.device:
            return False, f"a and b must be on one CUDA device, got {p.a.device} and {p.b.device}"
        for nm, s, rows in (("scale_a", p.scale_a, m), ("scale_b", p.scale_b, n)):
            if s.device != p.a.device:
                return False, f"{nm} is on {s.device}, not {p.a.device}"
            if s.numel() not in (1, rows):
                return False, f"{nm} has {s.numel()} elements, expected 1 or {rows}"
        if p.bias is not None:
            if p.bias.numel() != n:
                return False, f"bias has {p.bias.numel()} elements, expected N={n}"
            if p.bias.device != p.a.device:
                return False, f"bias is on {p.bias.device}, not {p.a.device}"
            if not p.bias.is_floating_point():
                return False, f"bias dtype {p.bias.dtype} is not a float type"
        # The device itself (capability 9.0, toolchain or built kernel) is `supports`' question,
        # which the dispatcher asks first and caches per device; it is not re-asked per GEMM.
        return True, "per-tensor/per-row scales, K % 16 == 0"

    def run(self, problem: GemmProblem) -> torch.Tensor:
        p = problem
        kern = kernels_module()
        sa = p.scale_a.to(torch.float32).contiguous().reshape(-1)
        sb = p.scale_b.to(torch.float32).contiguous().reshape(-1)
        bias = p.bias
        if bias is not None:
            bias = bias.reshape(-1)
            if bias.dtype not in _BIAS:
                bias = bias.to(torch.float32)
            bias = bias.contiguous()
        return kern.sm90_gemm(p.a, p.b, sa, sb, bias, p.out_dtype)
