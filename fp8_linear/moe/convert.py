"""Finding the fused experts modules to quantize and quantizing them without calibration (docs/moe.md).

``select_fused_experts`` applies an ``ignore`` list as the checkpoint writer and ``quantize_model``
read it (exact names, ``re:`` regexes, class names). ``quantize_fused_experts`` replaces every selected
module by an :class:`~fp8_linear.moe.experts.FP8Experts` of a dynamic scheme (weight scales from the
weights alone, activation scales computed per token / group at run time): what the transformers
quantizer (``FP8LinearConfig``) applies after loading. Static schemes need calibration
(``fp8_linear.calibration.experts.quantize_experts``).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from ..scheme import QuantScheme, resolve_scheme
from . import hf
from .experts import FP8Experts


def select_fused_experts(model: nn.Module, ignore: Iterable[str] = ()) -> dict[str, nn.Module]:
    """The fused experts modules of ``model`` (qualified name -> module) not matched by any ``ignore``
    pattern (exact names, ``re:`` regexes, class names)."""
    from ..checkpoint.plan import ignore_patterns, pattern_matches

    patterns = ignore_patterns(ignore, python_re=False)  # matched by pattern_matches alone
    return {n: m for n, m in hf.find_fused_experts(model).items()
            if not any(pattern_matches(p, n, m, "ct") for p in patterns)}


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at the qualified ``name`` of ``model``."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def quantize_fused_experts(model: nn.Module, scheme: "str | QuantScheme", ignore: Iterable[str] = ()) -> list[str]:
    """Replace (in place) every fused experts module of ``model`` not in ``ignore`` by an ``FP8Experts`` of
    the dynamic ``scheme`` (min-max weight scales per expert and part, activations quantized per token or
    1x128 group at run time). Returns the replaced names (none for a model without fused experts).

    Raises ``ValueError`` for a static scheme (its activation scales need calibration data).
    """
    scheme = resolve_scheme(scheme)
    if scheme.static:
        raise ValueError(f"scheme: {scheme.name!r} has static activation scales, which need calibration "
                         f"(fp8_linear.calibration.experts.quantize_experts); expected a dynamic scheme")
    targets = select_fused_experts(model, ignore)
    for name, src in targets.items():
        replace_module(model, name, FP8Experts.from_experts(src, scheme))
    return list(targets)


__all__ = ["quantize_fused_experts", "replace_module", "select_fused_experts"]
