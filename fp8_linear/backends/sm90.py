"""The ``sm90`` backend: our Hopper (sm_90a) FP8 GEMM kernel (docs/design.md section 5).

Importing this module needs no CUDA and builds nothing. ``supports`` checks the device and the
toolchain; the extension is built on first use (once, behind a lock, cached on disk under
``FP8_LINEAR_CACHE``): at the first GEMM, or when an ``FP8Linear`` on an sm_90 device is planned.

An ``FP8Linear`` runs as one host call (:func:`sm90_linear`): the extension's ``linear_fwd``
quantizes the activation (static per-tensor or per-token; ``fp8_linear/kernels/csrc/act_quant.cu``, the formula
of ``fp8_linear/kernels/quant_triton.py`` bit for bit) and launches the GEMM with the config
:func:`fp8_linear.kernels.select_config` gives (kept per shape). At decode sizes a layer's time is
the host's, so eager mode calls it directly; under ``torch.compile`` the same function runs as the
``fp8_linear::sm90_linear`` custom op. Fine-grained scales (1x128 activation groups with 128x128
weight blocks) run on the kernel when ``fp8_linear.kernels.BLOCK_SCALES`` says it has them, in the same
one call: ``linear_fwd`` mode 2 quantizes the activation in one pass (group amax, scale, cast) and the
GEMM takes ``scale_a`` ``[M, ceil(K/128)]`` and ``scale_b`` ``[ceil(N/128), ceil(K/128)]``
(docs/design.md section 4).
"""

from __future__ import annotations

import threading

import torch

from ..formats import MIN_SCALE, fmt_max
from .base import (
    MODE_DYNAMIC_TENSOR,
    MODE_GROUP,
    MODE_STATIC,
    MODE_TOKEN,
    ROW_KINDS,
    SCALE_BLOCK,
    SCALE_GROUP,
    SCALE_TENSOR,
    Backend,
    GemmProblem,
    LinearSpec,
    expand_scale_a_to_groups,
    quantize_and_gemm,
)

#: Compute capability the kernel is built for (wgmma / setmaxnreg need sm_90a exactly).
CAPABILITY = (9, 0)
#: TMA needs 16-byte row strides (K % 16 == 0 for FP8 rows) and 16-byte aligned base pointers.
TMA_ALIGN = 16
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)
_BIAS = (torch.bfloat16, torch.float16, torch.float32)
_INT32_MAX = 2**31 - 1
#: Bias dtypes the kernel's epilogue adds as they are.
BIAS_DTYPES = _BIAS
#: Kernel config choices kept by :func:`sm90_linear` (one per distinct problem); cleared when full.
MAX_CACHED_CONFIGS = 4096
#: FP8 format codes of the extension's act_quant.
_FMT_CODE = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
_FMT_MAX = {dt: fmt_max(dt) for dt in _FP8}

_dynamo_compiling = torch.compiler.is_dynamo_compiling
_ext = None
_ext_lock = threading.Lock()
_configs: dict[tuple, tuple[int, int]] = {}


def kernels_module():
    """``fp8_linear.kernels``, the installed kernel package (imported on first use: it registers the op)."""
    import fp8_linear.kernels as kernels

    return kernels


def block_scales_available() -> tuple[bool, str]:
    """Whether the kernel runs fine-grained scales (``fp8_linear.kernels.BLOCK_SCALES``), with the reason."""
    if getattr(kernels_module(), "BLOCK_SCALES", False):
        return True, "the kernel has 1x128 / 128x128 block scales"
    return False, "the sm90 kernel has no 1x128 / 128x128 block scales yet (fp8_linear.kernels.BLOCK_SCALES is False)"


def extension():
    """The built extension (``fp8_linear.kernels.jit.load()``), kept after the first call."""
    global _ext
    if _ext is None:
        with _ext_lock:
            if _ext is None:
                from fp8_linear.kernels import jit

                _ext = jit.load()
    return _ext


def _choice(m: int, n: int, k: int, mode: int, dtype: torch.dtype) -> tuple[int, int]:
    """(config id, split-K factor) for a linear call of ``m`` tokens, chosen as ``sm90_gemm_out`` would
    and kept under the key ``(m * k, n, k, mode, dtype)`` (the input's element count: no division per call)."""
    key = (m * k, n, k, mode, dtype)
    hit = _configs.get(key)
    if hit is None:
        if len(_configs) >= MAX_CACHED_CONFIGS:  # many distinct prompt lengths: keep the cache bounded
            _configs.clear()
        kern = kernels_module()
        # the generic path's kernels.swap_ok: a one-element scale_a (static, or per token at M = 1,
        # where a swapped decode config is taken either way) and a 16-bit output
        swap = mode == MODE_STATIC and dtype in (torch.bfloat16, torch.float16)
        if mode == MODE_GROUP:  # 1x128 groups with 128x128 weight blocks: the configs with block instances
            config = kern.select_config(m, n, k, swap_ok=False, block=True)
        else:
            config = kern.select_config(m, n, k, swap_ok=swap)
        hit = _configs[key] = (config.id, kern.select_splits(config, m, n, k))
    return hit


def sm90_linear(x, weight, input_scale, weight_scale, bias, mode: int, block: bool = False) -> torch.Tensor:
    """``FP8Linear`` on the sm90 kernel: ``x`` ``[..., K]`` (bf16/fp16/fp32, CUDA) -> ``[..., N]`` in x's dtype.

    weight ``[N, K]`` FP8 (K % 16 == 0, contiguous); weight_scale fp32 contiguous ``[1]`` / ``[N, 1]``
    or, with ``block``, 128x128 blocks ``[ceil(N/128), ceil(K/128)]``; input_scale fp32 ``[1]`` (mode 0)
    or None; bias ``[N]`` fp32/bf16/fp16 or None; mode 0 static, 1 per token, 2 1x128 groups (with
    ``block``). Activations are quantized to the weight's FP8 format.
    """
    n, k = weight.shape
    return _linear(x, weight, input_scale, weight_scale, bias, mode, block, n, k)


def _linear(x, weight, input_scale, weight_scale, bias, mode: int, block: bool, n: int, k: int) -> torch.Tensor:
    """:func:`sm90_linear` with ``weight``'s ``[N, K]`` given (the layer's plan knows them: no shape reads per call)."""
    numel = x.numel()
    if numel == 0:
        out = x.new_zeros((*x.shape[:-1], n))
        return out if bias is None else out + bias.to(x.dtype)
    if not x.is_contiguous() and x.stride(-1) != 1:
        x = x.contiguous()
    ext = _ext if _ext is not None else extension()
    fp8 = weight.dtype
    if block and mode != MODE_GROUP:
        # Block weights with a static / per-token activation scale (loaded checkpoints): one quantization
        # pass, the scale spread over the 1x128 groups, then the block-scaled GEMM.
        x2 = x.reshape(-1, k)
        m = x2.shape[0]
        q, sa = ext.act_quant(x2, _FMT_CODE[fp8], mode, input_scale, _FMT_MAX[fp8], MIN_SCALE)
        sa = expand_scale_a_to_groups(sa, m, k)
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        kernels_module().sm90_gemm_out(q, weight, sa, weight_scale, bias, out)
        return out.reshape(*x.shape[:-1], n)
    dtype = x.dtype
    choice = _configs.get((numel, n, k, mode, dtype))
    if choice is None:
        choice = _choice(numel // k, n, k, mode, dtype)
    return ext.linear_fwd(x, weight, input_scale, weight_scale, bias, mode, choice[0], _FMT_MAX[fp8], MIN_SCALE,
                          choice[1])


def _gemm_op(q, weight, scale_a, weight_scale, bias, out_dtype) -> torch.Tensor:
    """The kernel's registered GEMM op (``fp8_linear::sm90_gemm``) on a quantized activation ``q`` ``[M, K]``
    with a per-tensor ``scale_a`` ``[1]`` (spread over the 1x128 groups for block weights)."""
    if weight_scale.dim() == 2 and weight_scale.shape[1] > 1:
        scale_a = expand_scale_a_to_groups(scale_a, q.shape[0], q.shape[1])
    else:
        scale_a, weight_scale = scale_a.reshape(-1), weight_scale.reshape(-1)
    return kernels_module().sm90_gemm(q, weight, scale_a, weight_scale, bias, out_dtype)


class Sm90Backend(Backend):
    """TMA + wgmma, warp-specialized, persistent; per-tensor / per-token / per-channel scales (and
    1x128 / 128x128 block scales where the kernel has them), bias, 3 out dtypes."""

    name = "sm90"
    gemm_op = staticmethod(_gemm_op)

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
            from fp8_linear.kernels import jit
        except ImportError as e:
            return False, f"kernel sources unavailable: {e}"
        if jit.is_loaded():
            return True, "compute capability 9.0, kernel built"
        ok, why = jit.toolchain_status()
        if not ok:
            return False, why
        return True, "compute capability 9.0, nvcc and ninja available"

    @staticmethod
    def _kinds_ok(ka: str, kb: str) -> tuple[bool, str]:
        if kb == SCALE_BLOCK or ka == SCALE_GROUP:
            if kb != SCALE_BLOCK:
                return False, f"scales {ka}/{kb}: 1x128 groups pair only with 128x128 weight blocks"
            return block_scales_available()
        if ka not in (SCALE_TENSOR, *ROW_KINDS) or kb not in (SCALE_TENSOR, *ROW_KINDS):
            return False, f"scales {ka}/{kb} are not per-tensor / per-token / per-channel"
        return True, "per-tensor / per-token / per-channel scales"

    def can_run(self, problem: GemmProblem) -> tuple[bool, str]:
        p = problem
        ok, kinds = self._kinds_ok(p.scale_a_kind, p.scale_b_kind)
        if not ok:
            return False, kinds
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
        if p.a.data_ptr() % TMA_ALIGN or p.b.data_ptr() % TMA_ALIGN:
            return False, "a and b data pointers must be 16-byte aligned (TMA)"
        if p.a.device.type != "cuda" or p.b.device != p.a.device:
            return False, f"a and b must be on one CUDA device, got {p.a.device} and {p.b.device}"
        for nm, s in (("scale_a", p.scale_a), ("scale_b", p.scale_b)):
            if s.device != p.a.device:
                return False, f"{nm} is on {s.device}, not {p.a.device}"
        if p.bias is not None:
            if p.bias.numel() != n:
                return False, f"bias has {p.bias.numel()} elements, expected N={n}"
            if p.bias.device != p.a.device:
                return False, f"bias is on {p.bias.device}, not {p.a.device}"
            if not p.bias.is_floating_point():
                return False, f"bias dtype {p.bias.dtype} is not a float type"
        # The device itself (capability 9.0, toolchain or built kernel) is `supports`' question,
        # which the dispatcher asks first and caches per device; it is not re-asked per GEMM.
        return True, f"{kinds}, K % 16 == 0"

    def run(self, problem: GemmProblem) -> torch.Tensor:
        p = problem
        kern = kernels_module()
        block = p.scale_b_kind == SCALE_BLOCK
        sa, sb = p.scale_a.to(torch.float32), p.scale_b.to(torch.float32).contiguous()
        if p.scale_a_kind != SCALE_GROUP:  # 1x128 groups keep their layout: the kernel reads them M-major
            sa = sa.contiguous()
        if block:
            if p.scale_a_kind != SCALE_GROUP:
                sa = expand_scale_a_to_groups(sa, p.m, p.k)
        else:
            sa, sb = sa.reshape(-1), sb.reshape(-1)
        bias = p.bias
        if bias is not None:
            bias = bias.reshape(-1)
            if bias.dtype not in _BIAS:
                bias = bias.to(torch.float32)
            bias = bias.contiguous()
        return kern.sm90_gemm(p.a, p.b, sa, sb, bias, p.out_dtype)

    # ------------------------------------------------------------------ linear layer
    def can_serve(self, spec: LinearSpec) -> tuple[bool, str]:
        ok, kinds = self._kinds_ok(spec.activation_kind, spec.weight_kind)
        if not ok:
            return False, kinds
        if spec.k % 16:
            return False, f"K={spec.k} is not a multiple of 16 (TMA needs 16-byte row strides)"
        if max(spec.n, spec.k) > _INT32_MAX:
            return False, f"N={spec.n}, K={spec.k}: each must be below 2**31"
        if spec.bias_dtype is not None and spec.bias_dtype not in _BIAS:
            return False, f"bias dtype {spec.bias_dtype} is not fp32, bf16 or fp16"
        try:
            extension()
        except Exception as e:  # a failed build: the dispatcher takes the next backend and says why
            return False, f"extension not loadable: {e}"
        return True, f"{kinds}, K % 16 == 0"

    def process_weights(self, layer) -> None:
        super().process_weights(layer)
        w = layer._parameters["weight"]
        if w.data_ptr() % TMA_ALIGN:
            layer._parameters["weight"] = torch.nn.Parameter(w.detach().clone(), requires_grad=False)

    def apply(self, layer, x: torch.Tensor, spec: LinearSpec | None = None) -> torch.Tensor:
        p = layer._parameters
        if spec is None:
            spec = layer._plan.spec
        if spec.mode == MODE_DYNAMIC_TENSOR:  # no fused mode: torch-op quantization, then the GEMM op
            return quantize_and_gemm(layer, x, _gemm_op, spec)
        if _dynamo_compiling():
            if spec.mode in (MODE_STATIC, MODE_TOKEN) and spec.weight_kind != SCALE_BLOCK:
                # traced quantization (fp8_linear.graph_quant: inductor fuses it into the kernel that
                # produces x) + the GEMM op: one launch per layer inside the graph instead of two
                return quantize_and_gemm(layer, x, _gemm_op, spec)
            return torch.ops.fp8_linear.sm90_linear(x, p["weight"], p["input_scale"], p["weight_scale"], p["bias"],
                                                    spec.mode, spec.weight_kind == SCALE_BLOCK)
        return _linear(x, p["weight"], p["input_scale"], p["weight_scale"], p["bias"], spec.mode,
                       spec.weight_kind == SCALE_BLOCK, spec.n, spec.k)
