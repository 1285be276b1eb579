"""``quantize_model``'s opt-in FP8 ``lm_head`` and FP8 input embedding (``quantize_lm_head`` /
``quantize_embeddings``; both off by default, as in llm-compressor's recipes).

- ``lm_head``, untied: it leaves the ignore list and is quantized like every other selected Linear
  (the scheme, its weight observer, GPTQ, a calibrated static input scale).
- The input embedding becomes an :class:`~fp8_linear.embedding.FP8Embedding`: e4m3 rows with min-max
  per-row scales, rounded to nearest (a lookup has no input to calibrate or to compensate against).
- Tied models (``lm_head.weight`` is the embedding's, e.g. SmolLM2): both options together, or
  neither. The one table is quantized once, as the head (GPTQ with the head's inputs when ``gptq`` is
  on: on SmolLM2 the head is the more sensitive end, docs/serving.md), and the FP8 embedding holds the
  FP8 ``lm_head``'s ``weight`` and ``weight_scale`` parameters (:func:`~fp8_linear.embedding.tie_to_head`):
  a per-output-channel weight scale ``[vocab, 1]`` is exactly the per-row embedding scale. The head's
  scheme is the preset's with per-channel weights (``fp8-channel`` / ``fp8-dynamic`` as they are;
  ``fp8-tensor``'s becomes ``fp8-channel``: the same static activations); ``fp8-block`` and e5m2
  cannot share a per-row e4m3 table and are refused. Its static input scale is calibrated with the
  other layers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from fp8_linear.checkpoint.plan import ignore_patterns
from fp8_linear.embedding import EMBEDDING_FP8, FP8Embedding, tie_to_head
from fp8_linear.formats import resolve_format
from fp8_linear.scheme import PRESETS, QuantScheme


@dataclass
class HeadEmbeddingPlan:
    """What :func:`plan_head_embeddings` decided for one ``quantize_model`` call.

    Attributes:
        ignore: the ignore patterns to select Linear layers with (the head's exact name removed when
            ``quantize_lm_head``).
        head: qualified name of the output embedding to quantize, or ``None``.
        embedding: qualified name of the input embedding to quantize, or ``None``.
        tied: the two share one weight (then ``head`` and ``embedding`` are both set).
        head_scheme: the scheme of a tied head (per-channel weights), else ``None``.
        observe: modules to calibrate besides the selected Linear layers (a tied head of a static scheme).
    """

    ignore: tuple[str, ...]
    head: str | None = None
    embedding: str | None = None
    tied: bool = False
    head_scheme: QuantScheme | None = None
    observe: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.head is not None or self.embedding is not None


def _name_of(model: nn.Module, module: nn.Module | None) -> str | None:
    return next((n for n, m in model.named_modules() if m is module), None) if module is not None else None


def tied_head_scheme(scheme: QuantScheme) -> QuantScheme:
    """The scheme of an ``lm_head`` that shares its FP8 table with the input embedding: ``scheme`` with
    per-channel e4m3 weights (``ValueError`` for block weights or e5m2)."""
    if resolve_format(scheme.fmt) != EMBEDDING_FP8:
        raise ValueError(f"scheme: a tied lm_head shares the embedding's e4m3 table, got format {scheme.fmt!r}")
    if scheme.weight_granularity == "channel":
        return scheme
    if scheme.weight_granularity == "tensor":  # the same activations, per-channel weights (fp8-tensor's: fp8-channel)
        twin = scheme.with_(weight_granularity="channel")
        same = all(getattr(twin, k) == getattr(PRESETS["fp8-channel"], k)
                   for k in ("activation_dynamic", "activation_granularity", "fmt"))
        return twin.with_(name="fp8-channel" if same else f"{scheme.name}, channel weights")
    raise ValueError(f"scheme: {scheme.name!r} has {scheme.weight_granularity} weights; a tied lm_head shares the "
                     "embedding's per-row scales, so it needs per-channel weights (fp8-channel, fp8-dynamic, fp8-tensor), "
                     "or untie the model first")


def plan_head_embeddings(model: nn.Module, scheme: QuantScheme, ignore: Iterable[str], quantize_lm_head: bool,
                         quantize_embeddings: bool) -> HeadEmbeddingPlan:
    """Decide what ``quantize_lm_head`` / ``quantize_embeddings`` do on ``model`` (see the module text).

    Raises ``TypeError`` for non-boolean options, ``ValueError`` for a model without the output / input
    embedding asked for, and for a tied model asked for only one of the two."""
    for nm, v in (("quantize_lm_head", quantize_lm_head), ("quantize_embeddings", quantize_embeddings)):
        if not isinstance(v, bool):
            raise TypeError(f"{nm}: expected True or False, got {v!r}")
    ignore = ignore_patterns(ignore)
    if not (quantize_lm_head or quantize_embeddings):
        return HeadEmbeddingPlan(ignore)
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    head = get_out() if callable(get_out) else None
    emb = get_in() if callable(get_in) else None
    if quantize_lm_head and not isinstance(head, nn.Linear):
        raise ValueError(f"quantize_lm_head: {type(model).__name__} has no nn.Linear output embedding (got {type(head).__name__})")
    if quantize_embeddings and type(emb) is not nn.Embedding:
        raise ValueError(f"quantize_embeddings: expected an nn.Embedding input embedding in {type(model).__name__}, "
                         f"got {type(emb).__name__}")
    tied = isinstance(head, nn.Linear) and isinstance(emb, nn.Embedding) and head.weight is emb.weight
    if tied and quantize_lm_head != quantize_embeddings:
        raise ValueError("quantize_lm_head / quantize_embeddings: lm_head and the input embedding of this model share one "
                         "weight (tie_word_embeddings); quantize both (one FP8 table for the two) or neither")
    head_name = _name_of(model, head) if quantize_lm_head else None
    plan = HeadEmbeddingPlan(tuple(p for p in ignore if p != head_name), head_name,
                             _name_of(model, emb) if quantize_embeddings else None, tied)
    if tied:
        plan.head_scheme = tied_head_scheme(scheme)
        plan.observe[head_name] = head  # its input scale and GPTQ's H (calibration runs only when they are needed)
    return plan


def check_selected(plan: HeadEmbeddingPlan, targets: dict[str, nn.Module]) -> None:
    """``ValueError`` when ``quantize_lm_head`` is on but an ``ignore`` pattern still keeps the untied head."""
    if plan.head is not None and not plan.tied and plan.head not in targets:
        raise ValueError(f"quantize_lm_head: {plan.head!r} is still matched by an ignore pattern {list(plan.ignore)}")


def finish_head_embeddings(model: nn.Module, plan: HeadEmbeddingPlan, observers=None, gptq: bool = False,
                           act_order: bool | None = None) -> nn.Module:
    """Swap in the FP8 input embedding, in place; returns ``model``. The embedding's output dtype is the
    dtype its table had. For a tied model the ``lm_head`` is quantized first, as the other layers were
    (``apply_quantization`` with the head's scheme, ``observers`` from calibration, ``gptq`` /
    ``act_order``), and the embedding then holds its FP8 table and per-row scales."""
    if plan.embedding is None:
        return model
    from .quantize import _set_module, apply_quantization

    old = model.get_submodule(plan.embedding)
    with torch.no_grad():
        if plan.tied:
            apply_quantization(model, {plan.head: model.get_submodule(plan.head)}, plan.head_scheme, observers,
                               gptq=gptq, act_order=act_order)
            emb = FP8Embedding(old.num_embeddings, old.embedding_dim, old.padding_idx, old.weight.dtype, device="meta")
            emb.dtype_anchor = nn.Parameter(torch.empty(0, dtype=old.weight.dtype, device=old.weight.device),
                                            requires_grad=False)
            tie_to_head(emb, model.get_submodule(plan.head))
        else:
            emb = FP8Embedding.from_embedding(old)
    _set_module(model, plan.embedding, emb)
    return model


__all__ = ["HeadEmbeddingPlan", "check_selected", "finish_head_embeddings", "plan_head_embeddings", "tied_head_scheme"]
