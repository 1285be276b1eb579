"""``QuantPlan``: which ``nn.Linear`` of a model a checkpoint quantizes, with which scheme, and how
the checkpoint names the tensors (one plan per ``quant_method``; built in ``configs.py``)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from torch import nn

from ..scheme import QuantScheme

#: How a checkpoint's target / ignore patterns match a module name:
#: ``ct`` (compressed-tensors and vLLM: exact name, ``re:<regex>`` via ``re.match``, or a class name),
#: ``substring`` (transformers ``modules_to_not_convert``), ``glob`` (ModelOpt ``exclude_modules``).
MATCH_STYLES = ("ct", "substring", "glob")


def pattern_matches(pattern: str, name: str, module: nn.Module | None, style: str) -> bool:
    """True when ``pattern`` (in ``style``, see :data:`MATCH_STYLES`) selects module ``name``; in every
    style a class name (``"Linear"`` for any ``nn.Linear``) selects the modules of that class."""
    if module is not None and (pattern == type(module).__name__ or (pattern == "Linear" and isinstance(module, nn.Linear))):
        return True
    if style == "ct":
        if pattern.startswith("re:"):
            return re.match(pattern[3:], name) is not None
        return pattern == name
    if style == "substring":
        return pattern == name or pattern in name
    if style == "glob":
        return fnmatch.fnmatchcase(name, pattern)
    raise ValueError(f"style: expected one of {MATCH_STYLES}, got {style!r}")


@dataclass
class QuantPlan:
    """What a checkpoint's quantization config says, in our terms.

    Attributes:
        method: ``quant_method`` as written (for messages), e.g. ``"compressed-tensors"``.
        groups: ``(targets, scheme)`` pairs; the first group whose targets match a Linear wins.
        ignore: patterns of Linear modules left unquantized (matched in ``style``).
        style: pattern style of ``groups`` targets and ``ignore`` (see :data:`MATCH_STYLES`).
        renames: stored tensor suffix -> ``FP8Linear`` parameter name (``weight_scale_inv`` -> ``weight_scale``).
        zero_points: stored suffixes accepted only when all zero (symmetric zero points), then dropped.
        notes: caveats of the mapping, logged as warnings at load.
        keep_output_embeddings: never quantize the output embedding (``lm_head``), as transformers'
            fp8 / fbgemm quantizers never convert it whatever the ignore list says.
    """

    method: str
    groups: list[tuple[list[str], QuantScheme]]
    ignore: list[str] = field(default_factory=list)
    style: str = "ct"
    renames: dict[str, str] = field(default_factory=dict)
    zero_points: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    keep_output_embeddings: bool = False

    def scheme_for(self, name: str, module: nn.Module) -> QuantScheme | None:
        """The scheme of Linear ``name`` (``None`` when ignored or targeted by no group)."""
        if any(pattern_matches(p, name, module, self.style) for p in self.ignore):
            return None
        for targets, scheme in self.groups:
            if any(pattern_matches(t, name, module, self.style) for t in targets):
                return scheme
        return None

    def fp8_name(self, stored_suffix: str) -> str:
        """Our parameter name for a stored tensor suffix (identity unless renamed)."""
        return self.renames.get(stored_suffix, stored_suffix)
