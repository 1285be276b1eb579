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

from . import fast_path
from .errors import ScaleError, ShapeError
from .formats import FP8_DTYPES, SCALE_DTYPE, format_name, resolve_format, scale_from_amax
from .gemm import make_problem, run_problem
from .quantize import dynamic_quantize, quantize_fp8, quantize_unchecked, scale_shape, validate_scale
from .scheme import QuantScheme, resolve_scheme

_WEIGHT_TO_QUANT_GRAN = {"tensor": "tensor", "channel": "channel", "block": "block"}
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class FP8Linear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` stored in FP8 and run through :func:`fp8_linear.fp8_gemm`.

    Input ``x``: ``[..., in_features]`` in bf16/fp16/fp32; output ``[..., out_features]`` in ``x``'s dtype.
    Activations are quantized with the static ``input_scale`` (``[1]``) when it is set, else
    dynamically per token (``[tokens, 1]``) or per 1x128 group, as the scheme says.

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
        self.scheme = resolve_scheme(scheme)
        if in_features <= 0 or out_features <= 0:
            raise ShapeError(f"in_features/out_features: expected positive sizes, got {in_features}/{out_features}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        fp8 = resolve_format(self.scheme.fmt)
        kw = dict(device=device, requires_grad=False)
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=fp8, device=device), requires_grad=False)
        wshape = scale_shape((out_features, in_features), _WEIGHT_TO_QUANT_GRAN[self.scheme.weight_granularity])
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
        gran = _WEIGHT_TO_QUANT_GRAN[scheme.weight_granularity]
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
        return mod

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in ACT_DTYPES:
            raise TypeError(f"x: expected dtype bfloat16/float16/float32, got {x.dtype}")
        if x.shape[-1:] != (self.in_features,):
            raise ShapeError(f"x: expected last dimension {self.in_features}, got shape {list(x.shape)}")
        if x.device != self.weight.device:
            raise ValueError(f"x: expected device {self.weight.device} (that of weight), got {x.device}")
        if x.is_cuda and not torch.compiler.is_compiling():
            # Eager CUDA: quantize + sm90 GEMM in one host call when the generic path would take sm90
            # anyway (bitwise the same result; fp8_linear/fast_path.py); None: not eligible.
            out = fast_path.forward(self, x)
            if out is not None:
                return out
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        fp8 = self.weight.dtype
        if self.input_scale is not None:
            q, sa = quantize_unchecked(x2, fp8, self.input_scale), self.input_scale
        else:
            q, sa = dynamic_quantize(x2, fp8, self.scheme.activation_granularity)
        problem = make_problem(q, self.weight, sa, self.weight_scale, self.bias, x.dtype, check_values=False)
        return run_problem(problem).reshape(*lead, self.out_features)

    # ------------------------------------------------------------------ housekeeping
    def check(self) -> None:
        """Validate the loaded tensors: FP8 weight ``[out, in]``, finite positive scales of the right shape."""
        if self.weight.dtype not in FP8_DTYPES:
            raise TypeError(f"weight: expected an FP8 dtype, got {self.weight.dtype}")
        if tuple(self.weight.shape) != (self.out_features, self.in_features):
            raise ShapeError(f"weight: expected shape [{self.out_features}, {self.in_features}], got {list(self.weight.shape)}")
        wshape = scale_shape((self.out_features, self.in_features), _WEIGHT_TO_QUANT_GRAN[self.scheme.weight_granularity])
        validate_scale(self.weight_scale, wshape, "weight_scale")
        if self.input_scale is not None:
            validate_scale(self.input_scale, (1,), "input_scale")

    def _apply(self, fn, recurse=True):
        fast_path.forget(self)  # tensors move or change: decide the fast path again
        keep = [p for p in (self.weight, self.weight_scale, self.input_scale) if p is not None]

        def keep_dtype(t):
            out = fn(t)
            if any(t is p for p in keep) and isinstance(out, torch.Tensor) and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_dtype, recurse)

    def extra_repr(self) -> str:
        act = f"static input_scale={self.input_scale.item():.4g}" if self.input_scale is not None and self.input_scale.numel() == 1 and self.input_scale.device.type != "meta" else (
            "static" if self.input_scale is not None else f"dynamic per-{self.scheme.activation_granularity}")
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"scheme={self.scheme.name}, format={format_name(self.weight.dtype)}, "
            f"weight_scale={self.scheme.weight_granularity}{list(self.weight_scale.shape)}, activations={act}"
        )
