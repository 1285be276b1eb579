"""``FP8Linear``: an ``nn.Linear`` replacement with FP8 weights (docs/design.md section 3).

State-dict contract (compressed-tensors ``float-quantized``):

============== ====================================== =========================================
key            dtype / shape                          meaning
============== ====================================== =========================================
``weight``     float8_e4m3fn/e5m2 ``[out, in]``       quantized weight
``weight_scale`` fp32 ``[1]``, ``[out, 1]`` or blocks  ``W ~= weight * weight_scale``
``input_scale`` fp32 ``[1]`` (static schemes only)     static activation scale
``bias``       float ``[out]`` (when the Linear had one)
============== ====================================== =========================================
"""

from __future__ import annotations

import torch
from torch import nn

from . import settings
from .backends import plan_layer
from .backends.base import BACKEND_SLOTS, SHARED_PLANS
from .errors import BackendUnavailableError, ScaleError, ShapeError
from .formats import FP8_DTYPES, SCALE_DTYPE, format_name, resolve_format, scale_from_amax
from .quantize import dequantize_fp8, quantize_fp8, scale_shape, validate_scale
from .scheme import QuantScheme, resolve_scheme

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_compiling = torch.compiler.is_compiling


def _spec_fits(spec, w: torch.Tensor) -> bool:
    """Whether ``spec`` (a ``LinearSpec``) was made for a weight of ``w``'s device, dtype and shape (static
    facts under ``torch.compile``: tracing this adds no guard beyond dynamo's own on ``w``)."""
    return spec.device == w.device and spec.weight_dtype == w.dtype and (spec.n, spec.k) == tuple(w.shape)


def set_plan(layer: "FP8Linear", plan) -> None:
    """Store ``plan`` (a ``LayerPlan`` or ``None``) on ``layer``: the object as ``_plan`` and its key as the
    plain int ``_plan_key``, the one value of the layer a compiled forward reads besides its tensors
    (:func:`_traced_forward`). An int in the module's own ``__dict__`` is a constant dynamo's guards can
    skip while the dict is unchanged (``torch._dynamo.config.use_recursive_dict_tags_for_guards``); an
    attribute of a Python object (``_plan.key``) makes the layer, and every module above it, evaluate its
    whole guard subtree on every call."""
    layer.__dict__["_plan"] = plan
    layer.__dict__["_plan_key"] = None if plan is None else plan.key


class FP8Linear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` stored in FP8; the numerics of :func:`fp8_linear.fp8_gemm`.

    Input ``x``: ``[..., in_features]`` in bf16/fp16/fp32; output ``[..., out_features]`` in ``x``'s dtype.
    Activations are quantized with the static ``input_scale`` (``[1]``) when it is set, else
    dynamically per token (``[tokens, 1]``) or per 1x128 group, as the scheme says.

    The layer's backend (docs/design.md section 4) is chosen once per device and settings
    (:meth:`prepare`, kept as the plain attribute ``_plan``) and runs each call as custom ops, so
    ``torch.compile(fullgraph=True)`` traces a call with no graph break and CUDA graphs capture it.
    Under autograd (an input that requires grad) the gradient with respect to ``x`` is the
    straight-through estimator ``grad_y @ (weight * weight_scale)``; the FP8 tensors get none.
    ``load_state_dict`` refuses a weight of another dtype and non-positive or non-finite scales,
    naming the tensor.

    ``.to(dtype)`` / ``.half()`` on a model leave the FP8 weight and the fp32 scales untouched
    (only the bias follows); device moves apply to everything.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        scheme: "str | QuantScheme" = "fp8-channel",
        device=None,
        bias_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        set_plan(self, None)  # the backend's LayerPlan, chosen on first use (plain attribute, not state)
        self.scheme = resolve_scheme(scheme)
        if in_features <= 0 or out_features <= 0:
            raise ShapeError(f"in_features/out_features: expected positive sizes, got {in_features}/{out_features}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        fp8 = resolve_format(self.scheme.fmt)
        kw = dict(device=device, requires_grad=False)
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=fp8, device=device), requires_grad=False)
        wshape = scale_shape((out_features, in_features), self.scheme.weight_granularity)
        self.weight_scale = nn.Parameter(torch.ones(wshape, dtype=SCALE_DTYPE, **kw), requires_grad=False)
        if self.scheme.static:
            self.input_scale = nn.Parameter(torch.ones(1, dtype=SCALE_DTYPE, **kw), requires_grad=False)
        else:
            self.register_parameter("input_scale", None)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, **kw), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        scheme: "str | QuantScheme" = "fp8-channel",
        input_amax: "float | torch.Tensor | None" = None,
        weight_scale: torch.Tensor | None = None,
    ) -> "FP8Linear":
        """Quantize an ``nn.Linear`` (weight ``[out, in]``) into an ``FP8Linear``.

        Args:
            linear: the layer to convert (any float dtype, any device).
            scheme: a preset name or :class:`QuantScheme`.
            input_amax: calibrated absolute max of the layer's input (static schemes); required
                for static schemes: ``input_scale = input_amax / fmt_max``.
            weight_scale: a precomputed weight scale of the scheme's shape (e.g. from an MSE
                observer); default: min-max (``amax / fmt_max``) per the scheme's granularity.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected torch.nn.Linear, got {type(linear).__name__}")
        scheme = resolve_scheme(scheme)
        fp8 = resolve_format(scheme.fmt)
        w = linear.weight.detach()
        if not torch.isfinite(w).all():
            raise ValueError(f"linear.weight: expected finite values, got NaN/inf in a [{w.shape[0]}, {w.shape[1]}] weight")
        mod = cls(
            linear.in_features, linear.out_features, linear.bias is not None, scheme,
            device=w.device, bias_dtype=linear.bias.dtype if linear.bias is not None else torch.float32,
        )
        gran = scheme.weight_granularity
        if weight_scale is not None:
            # Validate under the argument's own name (quantize_fp8 would call it "scale").
            weight_scale = validate_scale(weight_scale, scale_shape(tuple(w.shape), gran), "weight_scale").to(w.device)
        q, s = quantize_fp8(w.float(), fp8, gran, scale=weight_scale)
        mod.weight.data.copy_(q)
        mod.weight_scale.data.copy_(s.reshape(mod.weight_scale.shape))
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach())
        if scheme.static:
            if input_amax is None:
                raise ValueError(f"input_amax: scheme {scheme.name!r} has static activations and needs a calibrated amax, got None")
            amax = torch.as_tensor(input_amax, dtype=SCALE_DTYPE).reshape(-1)
            if amax.numel() != 1 or not torch.isfinite(amax).all() or amax.item() < 0:
                raise ScaleError(f"input_amax: expected one finite non-negative value, got {input_amax}")
            mod.input_scale.data.copy_(scale_from_amax(amax, fp8).to(w.device))
        mod._try_prepare()
        return mod

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in ACT_DTYPES:
            raise TypeError(f"x: expected dtype bfloat16/float16/float32, got {x.dtype}")
        try:
            k = x.shape[-1]
        except IndexError:  # a 0-d tensor
            k = None
        w = self._parameters["weight"]
        traced = _compiling()
        want = w.shape[1] if traced else self.in_features  # traced: a static fact of the weight's tensor guard
        if k != want:
            raise ShapeError(f"x: expected last dimension {want}, got shape {list(x.shape)}")
        if x.device != w.device:
            raise ValueError(f"x: expected device {w.device} (that of weight), got {x.device}")
        if traced:
            return _traced_forward(self, x, w)
        plan = self.current_plan()
        if x.requires_grad and torch.is_grad_enabled():
            return _StraightThrough.apply(x, self)
        return plan.backend.apply(self, x)

    def current_plan(self):
        """The layer's plan (backend and spec) for its weight and the current settings, made again where the
        weight parameter was replaced or the settings reloaded (eager callers; a traced call reads the shared
        plans instead)."""
        plan = self._plan
        if plan is None or plan.weight is not self._parameters["weight"] or plan.generation != settings.GENERATION:
            plan = self.prepare()
        return plan

    def prepare(self):
        """Choose this layer's backend for its device and the current settings and let it prepare the
        tensors (``fp8_linear.backends.plan_layer``); returns the plan. Called on first use, after
        device moves and after ``check()``; a replaced weight parameter or :func:`fp8_linear.settings.reload`
        makes the next call choose again."""
        plan = plan_layer(self)
        set_plan(self, plan)
        return plan

    @property
    def backend(self) -> str:
        """Name of the backend that runs this layer (chosen now if not yet)."""
        plan = self._plan
        if plan is None or plan.weight is not self._parameters["weight"] or plan.generation != settings.GENERATION:
            plan = self.prepare()
        return plan.backend.name

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``weight * weight_scale`` ``[out, in]`` in ``dtype`` (what the layer multiplies by)."""
        return dequantize_fp8(self.weight, self.weight_scale, dtype)

    # ------------------------------------------------------------------ housekeeping
    def check(self) -> None:
        """Validate the loaded tensors: FP8 weight ``[out, in]``, finite positive scales of the right shape."""
        if self.weight.dtype not in FP8_DTYPES:
            raise TypeError(f"weight: expected an FP8 dtype, got {self.weight.dtype}")
        if tuple(self.weight.shape) != (self.out_features, self.in_features):
            raise ShapeError(f"weight: expected shape [{self.out_features}, {self.in_features}], got {list(self.weight.shape)}")
        wshape = scale_shape((self.out_features, self.in_features), self.scheme.weight_granularity)
        validate_scale(self.weight_scale, wshape, "weight_scale")
        if self.input_scale is not None:
            validate_scale(self.input_scale, (1,), "input_scale")
        self._try_prepare()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        """``load_state_dict`` validates what it copies as :meth:`check` does (a copy would otherwise
        cast a bf16 weight to FP8 or take a zero scale silently): an FP8 weight of this layer's format,
        fp32-representable finite positive scales of the right shapes; the error names the tensor."""
        fmt = self.weight.dtype
        wshape = scale_shape((self.out_features, self.in_features), self.scheme.weight_granularity)
        for pname, shape in (("weight", None), ("weight_scale", wshape), ("input_scale", (1,))):
            key = prefix + pname
            t = state_dict.get(key)
            if t is None or self._parameters.get(pname) is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{key}: expected a torch.Tensor, got {type(t).__name__}")
            if pname == "weight":
                if t.dtype != fmt:
                    raise TypeError(f"{key}: expected dtype {fmt} (the layer's FP8 format), got {t.dtype}")
                continue
            if t.device.type != "meta":
                validate_scale(t, shape, key)  # also refuses wider floats that over- or underflow fp32
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self._try_prepare()  # planned now, not inside a first compiled call

    def _apply(self, fn, recurse=True):
        if not torch.is_inference_mode_enabled():
            # A parameter made under torch.inference_mode has no version counter; a move outside it writes a
            # normal tensor into it (``param.data = new``) and every later view of it raises ("Inference
            # tensors do not track version counter"). Such parameters are renewed (copied) first.
            for key, p in self._parameters.items():
                if p is not None and p.is_inference():
                    self._parameters[key] = nn.Parameter(p.clone(), requires_grad=p.requires_grad)
        keep = [p for p in (self.weight, self.weight_scale, self.input_scale) if p is not None]

        def keep_dtype(t):
            out = fn(t)
            if any(t is p for p in keep) and isinstance(out, torch.Tensor) and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out

        out = super()._apply(keep_dtype, recurse)
        set_plan(self, None)
        self._try_prepare()  # tensors moved or changed: choose the backend for their device now
        return out

    def _try_prepare(self) -> None:
        """:meth:`prepare` now (so that a first call under ``torch.compile`` finds its plan made), except on
        the meta device or where no backend can run the layer (the first call then raises with the reason)."""
        if self._parameters["weight"].device.type == "meta":
            return
        try:
            self.prepare()
        except BackendUnavailableError:
            set_plan(self, None)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_plan"] = state["_plan_key"] = None  # a copy (deepcopy, pickle) chooses its backend on first use
        return state

    def __setstate__(self, state):
        state.setdefault("_plan_key", None)  # pickled before the key was kept
        super().__setstate__(state)

    def extra_repr(self) -> str:
        act = f"static input_scale={self.input_scale.item():.4g}" if self.input_scale is not None and self.input_scale.numel() == 1 and self.input_scale.device.type != "meta" else (
            "static" if self.input_scale is not None else f"dynamic per-{self.scheme.activation_granularity}")
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"scheme={self.scheme.name}, format={format_name(self.weight.dtype)}, "
            f"weight_scale={self.scheme.weight_granularity}{list(self.weight_scale.shape)}, activations={act}"
        )


def _traced_forward(self: "FP8Linear", x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """:meth:`FP8Linear.forward` as ``torch.compile`` traces it: what dynamo must guard on every call of the compiled
    model is one integer of this layer (``_plan_key``, :func:`set_plan`) beside its tensors. The plan's backend, spec
    and generation are read from the module-level ``SHARED_PLANS`` / ``BACKEND_SLOTS`` (one source for
    every layer of one spec: guarded once per spec, no aliasing check per layer); the caller checked the
    input's width against the weight's shape (a static fact of the tensor guard). No object-identity test
    either: a replaced weight of another device, dtype or shape fails dynamo's tensor guards, recompiles,
    and is re-planned here; one with the same properties is read fresh from ``_parameters`` by the
    backend's ops, as the plan allows."""
    key = self._plan_key
    shared = None if key is None else SHARED_PLANS[key]
    if shared is None or shared.generation != settings.GENERATION or not _spec_fits(shared.spec, w):
        shared = SHARED_PLANS[self.prepare().key]
    if x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, self)
    return BACKEND_SLOTS[shared.slot].apply(self, x, shared.spec)


class _StraightThrough(torch.autograd.Function):
    """``FP8Linear`` under autograd: the forward is the layer's quantized output; the gradient with
    respect to the input is the straight-through estimator ``grad_x = grad_y @ (weight * weight_scale)``
    (the activation quantization taken as the identity). The FP8 weights and scales are frozen and get
    no gradient."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        with torch.no_grad():
            return layer._plan.backend.apply(layer, x.detach())

    @staticmethod
    def backward(ctx, grad_out):
        w = ctx.layer.dequantized_weight(torch.float32)
        return (grad_out.to(torch.float32) @ w).to(grad_out.dtype), None
