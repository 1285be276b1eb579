"""``QuantScheme``: what to quantize and how (docs/design.md section 3 presets)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .formats import format_name, resolve_format

WEIGHT_GRANULARITIES = ("tensor", "channel", "block")
ACTIVATION_GRANULARITIES = ("tensor", "token", "group")
OBSERVERS = ("minmax", "percentile", "mse")


@dataclass(frozen=True)
class QuantScheme:
    """A quantization recipe for every ``nn.Linear`` it is applied to.

    Attributes:
        name: preset name or a user label.
        weight_granularity: ``"tensor"`` (scale ``[1]``), ``"channel"`` (``[out, 1]``) or ``"block"``
            (128x128, ``[ceil(out/128), ceil(in/128)]``).
        activation_dynamic: ``False`` = static per-tensor ``input_scale`` from calibration;
            ``True`` = computed from each batch at run time.
        activation_granularity: ``"tensor"`` (static), ``"token"`` or ``"group"`` (1x128; dynamic).
        fmt: FP8 format of weights and activations, ``"e4m3"`` or ``"e5m2"``.
        weight_observer / activation_observer: how calibration picks the clipping range:
            ``"minmax"``, ``"percentile"`` or ``"mse"`` (see ``fp8_linear.calibration.observers``).
    """

    name: str
    weight_granularity: str
    activation_dynamic: bool
    activation_granularity: str
    fmt: str = "e4m3"
    weight_observer: str = "minmax"
    activation_observer: str = "minmax"

    def __post_init__(self):
        # Normalize "E4M3" / torch.float8_e4m3fn to the canonical name ("e4m3"): checkpoints and
        # configs key on it, and equal schemes must compare (and hash) equal.
        object.__setattr__(self, "fmt", format_name(resolve_format(self.fmt, "fmt")))
        if self.weight_granularity not in WEIGHT_GRANULARITIES:
            raise ValueError(f"weight_granularity: expected one of {WEIGHT_GRANULARITIES}, got {self.weight_granularity!r}")
        if self.activation_granularity not in ACTIVATION_GRANULARITIES:
            raise ValueError(
                f"activation_granularity: expected one of {ACTIVATION_GRANULARITIES}, got {self.activation_granularity!r}"
            )
        if not self.activation_dynamic and self.activation_granularity != "tensor":
            raise ValueError(
                f"activation_granularity: static activations are per-tensor, got {self.activation_granularity!r}"
            )
        for nm in ("weight_observer", "activation_observer"):
            if getattr(self, nm) not in OBSERVERS:
                raise ValueError(f"{nm}: expected one of {OBSERVERS}, got {getattr(self, nm)!r}")

    @property
    def static(self) -> bool:
        """True when activations use a calibrated static ``input_scale``."""
        return not self.activation_dynamic

    def with_(self, **changes) -> "QuantScheme":
        """A copy with some fields changed (``scheme.with_(weight_observer="minmax")``)."""
        return replace(self, **changes)


#: The four presets, named as the ecosystem names them.
PRESETS: dict[str, QuantScheme] = {
    "fp8-tensor": QuantScheme("fp8-tensor", "tensor", False, "tensor"),
    "fp8-channel": QuantScheme("fp8-channel", "channel", False, "tensor"),
    "fp8-dynamic": QuantScheme("fp8-dynamic", "channel", True, "token"),
    "fp8-block": QuantScheme("fp8-block", "block", True, "group"),
}


def resolve_scheme(scheme: "str | QuantScheme") -> QuantScheme:
    """A :class:`QuantScheme` from a preset name or a scheme; ``ValueError`` listing presets otherwise."""
    if isinstance(scheme, QuantScheme):
        return scheme
    if isinstance(scheme, str) and scheme in PRESETS:
        return PRESETS[scheme]
    raise ValueError(f"scheme: expected one of {list(PRESETS)} or a QuantScheme, got {scheme!r}")
