"""``FP8LinearConfig``: the transformers quantization config of ``quant_method: "fp8_linear"``.

Pass it to ``from_pretrained`` to quantize a BF16 / FP16 / FP32 checkpoint to FP8 while it loads::

    from transformers import AutoModelForCausalLM
    import fp8_linear

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=fp8_linear.FP8LinearConfig("fp8-dynamic"))

Only schemes without calibration are accepted (dynamic activations: ``fp8-dynamic``, ``fp8-block``, or a
:class:`~fp8_linear.QuantScheme` with ``activation_dynamic=True``); static activation scales need
calibration data, which ``fp8_linear.quantize_model`` takes. The quantizer that does the work is
``transformers_quantizer.FP8LinearHfQuantizer``; both are registered with transformers when
``fp8_linear`` is imported (``fp8_linear/integrations/__init__.py``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from transformers.utils.quantization_config import QuantizationConfigMixin

from ..checkpoint.plan import ignore_patterns
from ..formats import format_name, resolve_format
from ..scheme import QuantScheme, resolve_scheme

#: The ``quant_method`` name we register ("fp8", "compressed-tensors", "fbgemm_fp8", "torchao" are taken).
QUANT_METHOD = "fp8_linear"
#: Weight observer a load-time quantization uses: min-max (round to nearest), the one needing no data.
LOAD_TIME_WEIGHT_OBSERVER = "minmax"


def _backend_names() -> tuple[str, ...]:
    from ..backends import BACKEND_NAMES

    return BACKEND_NAMES


class FP8LinearConfig(QuantizationConfigMixin):
    """Quantize every ``nn.Linear`` of a model to :class:`~fp8_linear.FP8Linear` as its weight loads.

    Args:
        scheme: a preset name without calibration (``"fp8-dynamic"``: per-channel weights, per-token
            dynamic activations; ``"fp8-block"``: 128x128 weight blocks, 1x128 dynamic activation groups)
            or a :class:`~fp8_linear.QuantScheme` with dynamic activations and the ``minmax`` weight
            observer. A static scheme (``fp8-tensor``, ``fp8-channel``) raises ``ValueError`` pointing at
            ``fp8_linear.quantize_model``, which calibrates it.
        ignore: Linear modules kept in high precision, as compressed-tensors writes them: exact module
            names, ``re:<regex>`` (``re.match`` from the start of the name) or class names. Linear layers
            whose weight is tied to another module (the usual ``lm_head``) are never quantized.
        fmt: FP8 format of weights and activations, ``"e4m3"`` or ``"e5m2"``.
        backend: ``None`` (automatic, docs/design.md section 4) or a backend name (``"sm90"``,
            ``"cublaslt"``, ``"emulated"``); a named backend that cannot serve the device the model loads
            onto is refused at ``from_pretrained``.

    Raises:
        ValueError / TypeError: naming the argument, for an unknown or static scheme, a bad ``ignore``,
            an unknown format or backend.
    """

    def __init__(
        self,
        scheme: "str | QuantScheme | dict" = "fp8-dynamic",
        ignore=("lm_head",),
        fmt: str = "e4m3",
        backend: str | None = None,
        **kwargs: Any,
    ):
        self.quant_method = QUANT_METHOD
        self.scheme = asdict(scheme) if isinstance(scheme, QuantScheme) else scheme
        self.ignore = ignore
        self.fmt = fmt
        self.backend = backend
        self.post_init()

    def post_init(self) -> None:
        """Validate the arguments (also called after ``from_dict``)."""
        self.fmt = format_name(resolve_format(self.fmt, "fmt"))
        self.ignore = list(ignore_patterns(self.ignore, python_re=False))  # matched by pattern_matches alone
        if self.backend is not None and self.backend not in _backend_names():
            raise ValueError(f"backend: expected None or one of {list(_backend_names())}, got {self.backend!r}")
        self.quant_scheme  # validates the scheme

    @property
    def quant_scheme(self) -> QuantScheme:
        """The :class:`~fp8_linear.QuantScheme` every quantized Linear gets (``fmt`` applied)."""
        scheme = self.scheme
        if isinstance(scheme, dict):
            try:
                scheme = QuantScheme(**scheme)
            except TypeError as e:
                raise TypeError(f"scheme: expected a preset name or QuantScheme fields, got {scheme!r} ({e})") from None
            if scheme.fmt != self.fmt:
                raise ValueError(f"fmt: the scheme says {scheme.fmt!r} and fmt says {self.fmt!r}; give one format")
        scheme = resolve_scheme(scheme)
        if scheme.static:
            raise ValueError(
                f"scheme: {scheme.name!r} has static activation scales, which need calibration data; "
                f"calibrate it with fp8_linear.quantize_model(model, calib_data, scheme={scheme.name!r}) "
                f"(then fp8_linear.save_quantized), or pick 'fp8-dynamic' or 'fp8-block' for from_pretrained")
        if scheme.weight_observer != LOAD_TIME_WEIGHT_OBSERVER:
            raise ValueError(
                f"scheme: weight_observer {scheme.weight_observer!r} is a calibration choice; from_pretrained "
                f"rounds weights to nearest with min-max scales ('{LOAD_TIME_WEIGHT_OBSERVER}'); use "
                f"fp8_linear.quantize_model for {scheme.weight_observer!r} weight scales")
        return scheme.with_(fmt=self.fmt)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``scheme`` as its preset name or its ``QuantScheme`` fields)."""
        return {"quant_method": self.quant_method, "scheme": self.scheme, "ignore": list(self.ignore),
                "fmt": self.fmt, "backend": self.backend}

    def __iter__(self):
        yield from self.to_dict().items()
