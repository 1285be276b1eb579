"""``QuantPlan``: which ``nn.Linear`` of a model a checkpoint quantizes, with which scheme, and how
the checkpoint names the tensors (one plan per ``quant_method``; built in ``configs.py``)."""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field

import regex
from torch import nn

from ..errors import CheckpointError
from ..scheme import QuantScheme

#: How a checkpoint's target / ignore patterns match a module name:
#: ``ct`` (compressed-tensors and vLLM: exact name, ``re:<regex>`` with ``re.match`` semantics, or a
#: class name), ``substring`` (transformers ``modules_to_not_convert``), ``glob`` (ModelOpt ``exclude_modules``).
MATCH_STYLES = ("ct", "substring", "glob")
#: Longest pattern accepted from a checkpoint (real ones are under 200 characters).
MAX_PATTERN_CHARS = 2048
#: Seconds one match of a pattern against a module name may take: a pattern that backtracks
#: catastrophically (``re:(a|aa)+$``) is refused instead of matching for as long as one lets it.
MATCH_TIMEOUT_S = 0.2
RE_PREFIX = "re:"


@functools.lru_cache(maxsize=4096)
def _compiled(expr: str, glob: bool):
    """``expr`` compiled by the ``regex`` engine (``re``-compatible, with a match timeout)."""
    return regex.compile(fnmatch.translate(expr) if glob else expr)


def check_pattern(pattern, style: str, where: str) -> str:
    """``pattern`` if it is a usable target / ignore pattern of ``style``, else :class:`CheckpointError`
    naming ``where`` (the config field): a non-empty string of at most :data:`MAX_PATTERN_CHARS`
    characters whose ``re:`` regex (or glob) compiles."""
    if not isinstance(pattern, str) or not pattern:
        raise CheckpointError(f"{where}: expected a module name or pattern (a non-empty string), got {pattern!r:.200}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise CheckpointError(f"{where}: expected a pattern of at most {MAX_PATTERN_CHARS} characters, got {len(pattern)}")
    if (style == "ct" and pattern.startswith(RE_PREFIX)) or style == "glob":
        try:
            _compiled(pattern[len(RE_PREFIX):] if style == "ct" else pattern, style == "glob")
        except Exception as e:  # regex.error, and OverflowError / RecursionError for absurd repeats or nesting
            raise CheckpointError(f"{where}: expected a valid {'glob' if style == 'glob' else 'regular expression'}, "
                                  f"got {pattern!r:.200} ({type(e).__name__}: {e})") from e
    return pattern


def check_patterns(patterns, style: str, where: str) -> list[str]:
    """A list of patterns (``None`` -> ``[]``), each checked by :func:`check_pattern`."""
    if patterns is None:
        return []
    if not isinstance(patterns, list):
        raise CheckpointError(f"{where}: expected a list of module names or patterns, got {patterns!r:.200}")
    return [check_pattern(p, style, f"{where}[{i}]") for i, p in enumerate(patterns)]


def ignore_patterns(ignore, where: str = "ignore", python_re: bool = True) -> tuple[str, ...]:
    """The ``ignore`` argument of ``quantize_model``, ``FP8LinearConfig``, ``quantize_fused_experts`` and
    the CLI's ``--ignore`` (one pattern, an iterable of them, or ``None``) as a tuple of ``ct``-style
    patterns: exact module names, class names, ``re:<regex>`` (``re.match`` semantics). ``where`` names
    the argument in messages.

    Raises ``TypeError`` for anything but non-empty strings, ``ValueError`` for an ``re:`` pattern that the
    ``regex`` engine of :func:`pattern_matches` does not compile, or, with ``python_re`` (callers that also
    match with ``re.match``: ``quantize_model``'s Linear selection), Python's ``re``."""
    if isinstance(ignore, str):
        ignore = (ignore,)
    try:
        patterns = tuple(ignore or ())
    except TypeError:
        raise TypeError(f"{where}: expected a list of module names or 're:' patterns (strings), "
                        f"got {ignore!r:.200}") from None
    if not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"{where}: expected module names or 're:' patterns (non-empty strings), got {ignore!r:.200}")
    for p in patterns:
        if p.startswith(RE_PREFIX):
            try:
                _compiled(p[len(RE_PREFIX):], False)
                if python_re:
                    re.compile(p[len(RE_PREFIX):])
            except Exception as e:  # re.error / regex.error, OverflowError / RecursionError for absurd patterns
                raise ValueError(f"{where}: {p!r:.200} is not a valid regular expression ({e})") from None
    return patterns


def _regex_match(pattern: str, expr: str, name: str, glob: bool) -> bool:
    try:
        return _compiled(expr, glob).match(name, timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError as e:
        raise CheckpointError(f"pattern {pattern!r:.200}: expected a match in linear time, got more than {MATCH_TIMEOUT_S} s "
                              f"on module {name!r} (catastrophic backtracking)") from e
    except Exception as e:  # a pattern that was never checked and does not compile
        raise CheckpointError(f"pattern {pattern!r:.200}: expected a valid pattern, got {type(e).__name__}: {e}") from e


def pattern_matches(pattern: str, name: str, module: nn.Module | None, style: str) -> bool:
    """True when ``pattern`` (in ``style``, see :data:`MATCH_STYLES`) selects module ``name``; in every
    style a class name (``"Linear"`` for any ``nn.Linear``) selects the modules of that class. Regexes
    run with a :data:`MATCH_TIMEOUT_S` bound (:class:`CheckpointError` past it)."""
    if module is not None and (pattern == type(module).__name__ or (pattern == "Linear" and isinstance(module, nn.Linear))):
        return True
    if style == "ct":
        if pattern.startswith(RE_PREFIX):
            return _regex_match(pattern, pattern[len(RE_PREFIX):], name, False)
        return pattern == name
    if style == "substring":
        return pattern == name or pattern in name
    if style == "glob":
        return _regex_match(pattern, pattern, name, True)
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
