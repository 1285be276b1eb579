"""``quantize_model``: calibrate static activation scales and swap every ``nn.Linear`` for ``FP8Linear``.

The steps are public so that ``compare_schemes`` can calibrate once and quantize copies with
several schemes:

1. :func:`select_linears` -- the ``nn.Linear`` modules to quantize (``ignore`` patterns as
   compressed-tensors writes them: exact module names, ``re:`` regexes (``re.match``), or class names);
2. :func:`calibrate` -- forward hooks under ``torch.inference_mode`` fold each layer's input into an
   :class:`~fp8_linear.calibration.observers.ActivationObserver` (padding excluded; bounded memory);
3. :func:`apply_quantization` -- replace each module by ``FP8Linear.from_linear`` with the observer's
   ``input_amax`` and a weight scale from the scheme's weight observer.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from fp8_linear.checkpoint.plan import ignore_patterns
from fp8_linear.errors import CalibrationError
from fp8_linear.module import FP8Linear
from fp8_linear.scheme import QuantScheme, resolve_scheme

from .data import DEFAULT_BATCH_SIZE, DEFAULT_MAX_SAMPLES, DEFAULT_SEQ_LEN, Batch, materialize_batches
from .gptq import HessianAccumulator, gptq_fp8_many
from .head_embeddings import check_selected, finish_head_embeddings, plan_head_embeddings
from .hooks import ObserverHooks
from .observers import ActivationObserver, weight_scale
from . import scale_align

#: Kept in high precision by default: the output head and the MoE shared-expert gates (Qwen2-MoE, Qwen3-Next:
#: an [1, hidden] gate of the shared expert, a router, as llm-compressor's MoE recipes leave them).
DEFAULT_IGNORE = ("lm_head", "re:.*shared_expert_gate$")
#: GPTQ needs H = sum x x^T from at least this many calibration tokens per input feature; layers with
#: fewer (e.g. a 1536-wide input seen by 500 tokens) are rounded to nearest instead.
GPTQ_MIN_TOKENS_PER_FEATURE = 2
REGEX_PREFIX = "re:"


def _matches(name: str, module: nn.Module, pattern: str) -> bool:
    if pattern.startswith(REGEX_PREFIX):
        return re.match(pattern[len(REGEX_PREFIX):], name) is not None
    return pattern == name or type(module).__name__ == pattern


def _tied_weight_ids(model: nn.Module) -> set[int]:
    """ids of Linear weights that another module (e.g. the input embedding) shares."""
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return {pid for pid, n in owners.items() if n > 1}


def select_linears(model: nn.Module, ignore: Iterable[str] = DEFAULT_IGNORE) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` modules of ``model`` to quantize, by qualified name, in module order.

    Skips modules matching any ``ignore`` pattern (exact name, ``re:<regex>`` matched with
    ``re.match`` from the start of the name, or a class name) and Linear layers whose weight is
    tied to another module (the usual ``lm_head`` = embeddings). A user pattern that matches no
    module gets a ``UserWarning`` naming it. Raises ``ValueError`` if no ``nn.Linear`` is left.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    ignore = ignore_patterns(ignore)
    used = {p: False for p in ignore}
    tied = _tied_weight_ids(model)
    chosen: dict[str, nn.Linear] = {}
    n_linear = 0
    for name, mod in model.named_modules():
        hit = [p for p in ignore if _matches(name, mod, p)]
        for p in hit:
            used[p] = True
        if not isinstance(mod, nn.Linear) or isinstance(mod, FP8Linear):
            continue
        n_linear += 1
        if hit or id(mod.weight) in tied:
            continue
        chosen[name] = mod
    for p, ok in used.items():
        if not ok and not (p in DEFAULT_IGNORE and p not in dict(model.named_modules())):
            warnings.warn(f"ignore: pattern {p!r} matches no module of {type(model).__name__}", UserWarning, stacklevel=3)
    if not chosen:
        raise ValueError(
            f"model: expected at least one nn.Linear to quantize, got {n_linear} nn.Linear in "
            f"{type(model).__name__} ({n_linear} ignored or tied)" if n_linear else
            f"model: expected at least one nn.Linear to quantize, {type(model).__name__} has none"
        )
    return chosen


def _forward_target(model: nn.Module, targets: dict[str, nn.Module]) -> nn.Module:
    """The smallest module whose forward reaches every target: the transformers base model
    (skipping e.g. the LM head's vocabulary projection) when all targets live inside it."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if prefix else None
    if isinstance(base, nn.Module) and base is not model and all(n.startswith(prefix + ".") for n in targets):
        return base
    return model


def calibrate(
    model: nn.Module,
    targets: dict[str, nn.Module],
    batches: Iterable[Batch],
    *,
    progress: bool = True,
    observers: dict[str, ActivationObserver] | None = None,
    histogram: bool = True,
    hessian: bool = False,
    dtype: torch.dtype | None = None,
    hessian_tokens: int | None = None,
) -> dict[str, ActivationObserver]:
    """Run ``batches`` through ``model`` and observe the input of every module in ``targets``.

    Args:
        model: the (unquantized) model; called as ``model(input_ids=[B, T], attention_mask=[B, T])``.
        targets: modules to observe, by qualified name (from :func:`select_linears`).
        batches: token batches (:class:`~fp8_linear.calibration.data.Batch`).
        progress: show a tqdm bar over batches.
        observers: existing observers to keep accumulating into.
        histogram: keep the ``|x|`` histogram (needed by the ``percentile`` and ``mse`` activation
            observers; costs about as much as the forward pass itself on a CPU).
        hessian: also accumulate ``H = sum x x^T`` per distinct layer input (``observer.hessian``),
            for GPTQ error compensation (:mod:`fp8_linear.calibration.gptq`).
        dtype: run the forwards on a copy of the model in this dtype (e.g. ``torch.bfloat16``: about
            3x faster than fp32 on a CPU with AMX); statistics are still kept in fp32/fp64. ``None``
            (default): the model as it is. The model itself is never changed.
        hessian_tokens: tokens folded into each ``H`` (``None``: :data:`~fp8_linear.calibration.gptq.MAX_TOKENS`,
            every calibration token).

    Returns:
        one :class:`ActivationObserver` per target name. Padding positions (``attention_mask == 0``)
        never reach an observer. Raises :class:`CalibrationError` naming the layer on NaN/inf
        activations, and if no target saw any token.
    """
    from tqdm.auto import tqdm

    obs = observers if observers is not None else {n: ActivationObserver(n, histogram) for n in targets}
    runner = _forward_target(model, targets)
    hooked = targets
    if dtype is not None and dtype != next(model.parameters()).dtype:
        skip = 0 if runner is model else len(model.base_model_prefix) + 1  # names relative to the runner
        runner = copy.deepcopy(runner).to(dtype)
        hooked = {n: runner.get_submodule(n[skip:]) for n in targets}
    hooks = ObserverHooks(obs, hessian, hessian_tokens).attach(hooked)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batches = list(batches) if not isinstance(batches, list) else batches
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for b in tqdm(batches, desc="calibrating", unit="batch", disable=not progress):
                if b.num_tokens == 0:
                    continue
                hooks.begin_batch(padding_mask(b, device))
                runner(input_ids=b.input_ids.to(device), attention_mask=b.attention_mask.to(device))
    finally:
        hooks.remove()
        model.train(was_training)
    check_observed(obs)
    return obs


def padding_mask(b: Batch, device) -> torch.Tensor | None:
    """The batch's flattened attention mask (bool ``[B * T]`` on ``device``), or ``None`` without padding."""
    mask = b.attention_mask.reshape(-1).bool()
    return None if bool(mask.all()) else mask.to(device)  # no padding: no masked copy


def check_observed(obs: dict[str, ActivationObserver]) -> None:
    """Raise :class:`CalibrationError` if some (or every) observer saw no token."""
    empty = [n for n, o in obs.items() if o.count == 0]
    if len(empty) == len(obs):
        raise CalibrationError(f"calib_data: no calibration token reached any of the {len(obs)} layers (empty or all padding)")
    if empty:
        raise CalibrationError(f"calib_data: layer {empty[0]!r} (and {len(empty) - 1} more) saw no calibration token")


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def apply_quantization(
    model: nn.Module,
    targets: dict[str, nn.Linear],
    scheme: "str | QuantScheme",
    observers: dict[str, ActivationObserver] | None = None,
    gptq: bool = False,
    cache: dict | None = None,
    progress: str | None = None,
    act_order: bool | None = None,
) -> nn.Module:
    """Replace each ``targets`` module of ``model`` (in place) by ``FP8Linear.from_linear``.

    Static schemes need ``observers`` (from :func:`calibrate`) for every target: ``input_amax`` is
    ``observers[name].amax(scheme.activation_observer)``. Weight scales come from
    :func:`~fp8_linear.calibration.observers.weight_scale` with ``scheme.weight_observer``.
    ``gptq=True`` rounds the weights with GPTQ error compensation (needs observers calibrated with
    ``hessian=True``); the scales are unchanged. ``cache`` (a dict the caller keeps) reuses weight
    scales and GPTQ weights across calls on copies of the same model with the same weight recipe.
    ``progress``: label of a tqdm bar over the GPTQ pass (``None``: no bar). ``act_order``: GPTQ's
    column order (``None``: :data:`~fp8_linear.calibration.gptq.ACT_ORDER`, on).
    """
    scheme = resolve_scheme(scheme)
    scales, rounded = prepare_weights(targets, [scheme], observers, gptq, cache, progress,
                                      act_order)[_weight_key(scheme, gptq, act_order)]
    rounded = dict(rounded)
    for name, lin in targets.items():
        amax = None
        if scheme.static:
            if observers is None or name not in observers:
                raise CalibrationError(f"observers: static scheme {scheme.name!r} needs calibration statistics for layer {name!r}, got none")
            amax = observers[name].amax(scheme.activation_observer, scheme.fmt)
        if name in rounded:  # a stand-in Linear holding the GPTQ weights (already on the FP8 grid)
            src = nn.Linear(lin.in_features, lin.out_features, bias=False, device="meta")
            src.weight = nn.Parameter(rounded.pop(name), requires_grad=False)
            src.bias = lin.bias
            lin = src
        _set_module(model, name, FP8Linear.from_linear(lin, scheme, input_amax=amax, weight_scale=scales[name]))
    return model


def _weight_key(scheme: QuantScheme, gptq: bool, act_order: bool | None = None) -> tuple:
    """What a scheme's FP8 weights depend on (e.g. fp8-channel and fp8-dynamic share their weights)."""
    from . import gptq as gptq_mod  # ACT_ORDER read at call time

    order = (gptq_mod.ACT_ORDER if act_order is None else bool(act_order)) if gptq else None
    return (scheme.weight_granularity, scheme.weight_observer, scheme.fmt, gptq, order)


def prepare_weights(targets: dict[str, nn.Linear], schemes, observers=None, gptq: bool = False,
                    cache: dict | None = None, progress: str | None = None, act_order: bool | None = None) -> dict:
    """Weight scales (and GPTQ-rounded fp32 weights) of every distinct weight recipe among ``schemes``.

    Returns (and stores in ``cache`` when given) ``{key: (scales, rounded)}``: ``scales[name]`` of the
    scheme's scale shape, ``rounded[name]`` the GPTQ weights (empty without ``gptq``). With ``gptq``,
    min-max per-channel scales are first aligned to the FP8 grid by input energy
    (:mod:`~fp8_linear.calibration.scale_align`; the stored scales are the aligned ones), and
    all recipes of one FP8 format go through a single GPTQ column sweep per distinct layer input
    (:func:`~fp8_linear.calibration.gptq.gptq_fp8_many`), so quantizing with every preset costs about
    one sweep, not one per preset. ``progress``: label of a tqdm bar over the GPTQ sweeps (``None``: no bar).
    ``act_order``: GPTQ's column order (``None``: :data:`~fp8_linear.calibration.gptq.ACT_ORDER`); part of
    the cache key.
    """
    cache = {} if cache is None else cache
    todo: dict[tuple, QuantScheme] = {}
    for s in schemes:
        key = _weight_key(resolve_scheme(s), gptq, act_order)
        if key not in cache:
            todo.setdefault(key, resolve_scheme(s))
    scales = {key: {n: weight_scale(lin.weight.detach(), s.weight_granularity, s.fmt, s.weight_observer)
                    for n, lin in targets.items()} for key, s in todo.items()}
    if gptq:
        _align_scales(targets, todo, scales, observers)
    for fmt in {s.fmt for s in todo.values()}:
        keys = [k for k, s in todo.items() if s.fmt == fmt]
        rounded = (_gptq_weights(targets, [scales[k] for k in keys], observers, fmt, progress, act_order) if gptq
                   else [{} for _ in keys])
        for k, r in zip(keys, rounded):
            cache[k] = (scales[k], r)
    return {k: cache[k] for k in (_weight_key(resolve_scheme(s), gptq, act_order) for s in schemes)}


def _hessian(observers, name: str) -> HessianAccumulator | None:
    """The layer's accumulated ``H`` from calibration, or None (no observers, none kept, or no tokens)."""
    hess = getattr(observers.get(name), "hessian", None) if observers else None
    return hess if hess is not None and hess.tokens > 0 else None


def _align_scales(targets, todo: dict, scales: dict, observers) -> None:
    """Min-max weight scales of GPTQ recipes, moved to the grid alignment with the least
    input-energy-weighted rounding error (:mod:`~fp8_linear.calibration.scale_align`), in place."""
    candidates = scale_align.ALIGN_CANDIDATES  # read at call time: benchmarks may turn it off
    if candidates <= 1:
        return
    diags: dict[int, torch.Tensor] = {}
    for key, s in todo.items():
        if s.weight_observer != "minmax" or s.weight_granularity not in scale_align.ALIGN_GRANULARITIES:
            continue  # the clipping observers chose their range on purpose; per-tensor: see scale_align
        for n, lin in targets.items():
            hess = _hessian(observers, n)
            if hess is None:
                continue  # _gptq_weights raises for these
            if id(hess) not in diags:
                diags[id(hess)] = torch.diagonal(hess.h).clone()
            scales[key][n] = scale_align.align_weight_scale(lin.weight.detach(), scales[key][n], diags[id(hess)],
                                                            s.weight_granularity, s.fmt)


def _gptq_weights(targets, scales_list, observers, fmt, progress: str | None = None,
                  act_order: bool | None = None) -> list[dict[str, torch.Tensor]]:
    """GPTQ-rounded fp32 weights per target, one dict per entry of ``scales_list`` (one weight
    recipe each); layers sharing one input (one H) and all recipes are stacked and solved at once."""
    groups: dict[int, list[str]] = {}
    for name in targets:
        hess = _hessian(observers, name)
        if hess is None:
            raise CalibrationError(f"gptq: layer {name!r} has no input statistics (calibrate with hessian=True)")
        groups.setdefault(id(hess), []).append(name)
    from tqdm.auto import tqdm

    out = [{} for _ in scales_list]
    for names in tqdm(list(groups.values()), desc=progress, unit="input", disable=progress is None):
        hess = observers[names[0]].hessian
        if hess.tokens < GPTQ_MIN_TOKENS_PER_FEATURE * hess.h.shape[0]:
            continue  # too few tokens for a reliable H: GPTQ would overfit them; round to nearest
        ws = [targets[n].weight.detach().float() for n in names]
        res = gptq_fp8_many([w for _ in scales_list for w in ws], hess,
                            [sc[n] for sc in scales_list for n in names], fmt, act_order=act_order)
        for r, o in enumerate(out):
            o.update(zip(names, res[r * len(names):(r + 1) * len(names)]))
    return out


def quantize_model(
    model: nn.Module,
    calib_data=None,
    scheme: "str | QuantScheme" = "fp8-channel",
    *,
    tokenizer=None,
    ignore: Iterable[str] = DEFAULT_IGNORE,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    gptq: bool | None = None,
    calib_dtype: torch.dtype | None = None,
    layerwise: bool = False,
    device: "torch.device | str | None" = None,
    offload_activations: bool = False,
    hessian_tokens: int | None = None,
    act_order: bool | None = None,
    max_kl: float | None = None,
    quantize_lm_head: bool = False,
    quantize_embeddings: bool = False,
    budget_probe: bool | str = True,
) -> nn.Module:
    """Quantize a transformers model to FP8 in place and return it.

    Args:
        model: a ``transformers`` model (or any ``nn.Module`` taking ``input_ids``/``attention_mask``).
        calib_data: calibration data in any form of :mod:`fp8_linear.calibration.data` (strings with a
            tokenizer, token-id tensors ``[T]``/``[B, T]``, dicts with ``input_ids``/``attention_mask``,
            a DataLoader, a ``datasets.Dataset``); ``None`` = the embedded corpus' calibration split.
            Dynamic schemes (``fp8-dynamic``, ``fp8-block``) use it only for GPTQ.
        scheme: a preset name (``fp8-tensor``, ``fp8-channel``, ``fp8-dynamic``, ``fp8-block``) or a
            :class:`~fp8_linear.QuantScheme`.
        tokenizer: turns text into token ids (needed for text and for ``calib_data=None``).
        ignore: modules to keep in high precision: exact names, ``re:`` regexes, or class names.
        max_samples / seq_len / batch_size: calibration samples, tokens per sample, samples per forward.
        progress: show tqdm progress bars.
        gptq: round weights with GPTQ error compensation (:mod:`~fp8_linear.calibration.gptq`), using
            the calibration inputs; scales and checkpoint format are unchanged. ``None`` (default):
            on whenever there is calibration data to use (always for static schemes; for dynamic
            schemes when ``calib_data`` or a ``tokenizer`` is given).
        calib_dtype: dtype of the calibration forwards (``calibrate``'s ``dtype``; ``None`` = the model's).
        layerwise: calibrate and quantize one decoder layer at a time on ``device``
            (:mod:`~fp8_linear.calibration.layerwise`): the model stays where it is (e.g. the CPU) and
            only one layer, its ``H`` and the hidden states are on the GPU, so a model larger than the
            GPU's memory calibrates on one GPU. Same scales as the all-at-once path (fused MoE experts
            included: each is observed and quantized with its layer). The layer count, peak
            GPU memory and wall time per layer are kept as ``model.fp8_layerwise``.
        device: where ``layerwise`` runs each layer (default: ``"cuda"`` when available, else the
            model's device). Without ``layerwise`` calibration runs where the model is.
        offload_activations: ``layerwise`` only: keep the hidden states between layers on the CPU.
        hessian_tokens: tokens folded into each GPTQ ``H`` (``None``: :data:`~fp8_linear.calibration.gptq.MAX_TOKENS`,
            every calibration token; ``4096`` is the earlier default).
        act_order: GPTQ quantizes columns by decreasing input energy ``H[i, i]`` (``None``:
            :data:`~fp8_linear.calibration.gptq.ACT_ORDER`, on; ``False``: the natural order, the
            earlier default). Measured on unseen text in docs/calibration.md.
        max_kl: an accuracy budget (causal LMs): keep the fewest layers in high precision so that
            ``KL(unquantized || quantized)`` per token, measured on a held-out slice of the calibration
            batches, plus one standard error, is at most this many nats (layers ranked on other
            calibration batches; :mod:`~fp8_linear.calibration.mixed_precision`). The
            report (kept layers, KL, weight memory) is ``model.fp8_mixed_precision`` and is printed
            when ``progress``. ``None`` (default): every selected layer in FP8.
        budget_probe: with ``max_kl`` and a ``tokenizer``, each step of the search must also meet the
            budget on text the calibration never saw (16 windows of the embedded corpus' choose split, or
            of the string given here), with a one-sided 95% prediction bound for another text's KL
            (``mixed_precision.keep_to_budget``'s probe; docs/calibration.md). ``True`` (default): on
            where a tokenizer is given; ``False``: the held-out slice alone (as without a tokenizer).
        quantize_lm_head: also quantize the output head (``lm_head``), through the same path as the
            other Linear layers (off by default, as llm-compressor's recipes leave it). Saved as a
            compressed-tensors layer that is simply not ignored.
        quantize_embeddings: replace the input embedding by an :class:`~fp8_linear.embedding.FP8Embedding`
            (e4m3 rows, one scale per row, rounded to nearest). Read back by ``load_quantized`` only, not
            by vLLM or transformers' compressed-tensors loader (docs/checkpoints.md). A tied model (``lm_head`` sharing the embedding's weight) takes
            both options or neither and keeps one FP8 table for the two
            (:mod:`~fp8_linear.calibration.head_embeddings`). Neither option works with ``layerwise`` or
            ``max_kl``.

    Returns:
        ``model``, with every selected ``nn.Linear`` replaced by an ``FP8Linear``.

    Raises:
        ValueError: no ``nn.Linear`` to quantize, or bad arguments.
        CalibrationError: empty / all-padding calibration data, or NaN/inf activations (layer named).
    """
    scheme = resolve_scheme(scheme)
    extra = plan_head_embeddings(model, scheme, ignore, quantize_lm_head, quantize_embeddings)
    if extra.active and (layerwise or max_kl is not None):
        raise ValueError("quantize_lm_head / quantize_embeddings: not supported with layerwise=True or max_kl")
    ignore = extra.ignore
    targets = select_linears(model, ignore)
    check_selected(extra, targets)
    if gptq is None:
        gptq = scheme.static or calib_data is not None or tokenizer is not None
    if max_kl is not None:
        if layerwise:
            raise ValueError("max_kl: not supported with layerwise=True (the budget search runs whole-model forwards)")
        return _quantize_to_budget(model, targets, calib_data, tokenizer, scheme, gptq, max_kl, progress=progress,
                                   seq_len=seq_len, max_samples=max_samples, batch_size=batch_size,
                                   calib_dtype=calib_dtype, hessian_tokens=hessian_tokens, act_order=act_order,
                                   budget_probe=budget_probe)
    if (device is not None or offload_activations) and not layerwise:
        raise ValueError("device/offload_activations: only used with layerwise=True (otherwise calibration runs where the model is)")
    observers = batches = None
    if scheme.static or gptq:
        batches = materialize_batches(calib_data, tokenizer, seq_len=seq_len, max_samples=max_samples, batch_size=batch_size, model=model)
        if not layerwise:
            observers = calibrate(model, {**targets, **extra.observe}, batches, progress=progress,
                                  histogram=needs_histogram([scheme]), hessian=gptq, dtype=calib_dtype,
                                  hessian_tokens=hessian_tokens)
    if layerwise and batches is not None:  # the fused MoE experts too, with their decoder layer
        return _quantize_layerwise(model, targets, batches, scheme, gptq, device=device, progress=progress,
                                   offload_activations=offload_activations, hessian_tokens=hessian_tokens,
                                   calib_dtype=calib_dtype, ignore=ignore, act_order=act_order)
    from .experts import quantize_experts  # fused MoE experts (docs/moe.md); a no-op without them

    quantize_experts(model, scheme, batches, ignore=ignore, progress=progress)
    with torch.no_grad():
        apply_quantization(model, targets, scheme, observers, gptq=gptq,
                           progress=f"GPTQ {scheme.name}" if progress and gptq else None, act_order=act_order)
    return finish_head_embeddings(model, extra, observers, gptq=gptq, act_order=act_order)


def _quantize_to_budget(model, targets, calib_data, tokenizer, scheme, gptq, max_kl, *, progress, seq_len, max_samples,
                        batch_size, calib_dtype, hessian_tokens, act_order=None, budget_probe=True):
    """quantize_model's ``max_kl`` path (:mod:`~fp8_linear.calibration.mixed_precision`)."""
    from tqdm.auto import tqdm

    from . import mixed_precision as mp

    if not (isinstance(max_kl, (int, float)) and not isinstance(max_kl, bool) and max_kl >= 0 and max_kl < float("inf")):
        raise ValueError(f"max_kl: expected a finite KL budget >= 0 (nats/token), got {max_kl!r}")
    if not (isinstance(budget_probe, bool) or (isinstance(budget_probe, str) and budget_probe.strip())):
        raise TypeError(f"budget_probe: expected True, False or a non-empty text, got {budget_probe!r}")
    from .evaluate import is_causal_lm

    if not is_causal_lm(model):
        raise ValueError(f"max_kl: needs a causal LM (a model returning logits), got {type(model).__name__}")
    batches = materialize_batches(calib_data, tokenizer, seq_len=seq_len, max_samples=max_samples, batch_size=batch_size, model=model)
    cal, hold = mp.split_holdout(batches)
    rank = mp.split_ranking(cal, hold)  # layers are ranked on calibration text, chosen on the held-out slice
    refs, rank_refs = mp.reference_logprobs(model, hold), mp.reference_logprobs(model, rank)
    probe = probe_refs = None
    if budget_probe is not False and tokenizer is not None:  # unseen text, measured before quantizing
        probe = mp.probe_batches(tokenizer, min(seq_len, mp.DEFAULT_EVAL_SEQ_LEN),
                                 text=None if budget_probe is True else budget_probe)
        probe_refs = mp.reference_logprobs(model, probe)
    observers = calibrate(model, targets, cal, progress=progress, histogram=needs_histogram([scheme]), hessian=gptq,
                          dtype=calib_dtype, hessian_tokens=hessian_tokens) if (scheme.static or gptq) else None
    originals = dict(targets)
    with torch.no_grad():
        apply_quantization(model, targets, scheme, observers, gptq=gptq, act_order=act_order)
    quantized = {n: model.get_submodule(n) for n in originals}
    report = mp.keep_to_budget(model, quantized, originals, hold, refs, float(max_kl), _set_module, rank, rank_refs,
                               probe=probe, probe_refs=probe_refs)
    model.fp8_mixed_precision = report
    if progress:
        tqdm.write(report.summary())
    return model


def _quantize_layerwise(model, targets, batches, scheme, gptq, *, device, progress, offload_activations, hessian_tokens,
                        calib_dtype, ignore, act_order=None):
    """quantize_model's ``layerwise`` path: calibrate, GPTQ and swap each decoder layer while it is on ``device``;
    the layer's fused MoE experts are observed in the same pass and swapped for ``FP8Experts`` with it
    (the scales of :func:`~fp8_linear.calibration.experts.quantize_experts`, its minimum-token fallback)."""
    from tqdm.auto import tqdm

    from .experts import ExpertsObserver, report_experts, select_experts, swap_experts
    from .layerwise import calibrate_layerwise

    if calib_dtype is not None and calib_dtype != next(model.parameters()).dtype:
        raise ValueError(f"calib_dtype: layerwise calibration runs in the model's dtype, got {calib_dtype} "
                         f"for a {next(model.parameters()).dtype} model (convert the model instead)")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else next(model.parameters()).device
    observers = {n: ActivationObserver(n, needs_histogram([scheme])) for n in targets}
    experts = {n: ExpertsObserver(n, m) for n, m in select_experts(model, ignore).items()}

    def on_layer(_i, layer_targets):
        linears = {n: m for n, m in layer_targets.items() if n not in experts}
        if linears:
            check_observed({n: observers[n] for n in linears})
        with torch.no_grad():
            if linears:
                apply_quantization(model, linears, scheme, observers, gptq=gptq, act_order=act_order)
            swap_experts(model, {n: m for n, m in layer_targets.items() if n in experts}, scheme, experts)
        for n in linears:  # H is large ([in, in] fp64 on the GPU): free it with its layer
            observers[n].hessian = None

    stats = calibrate_layerwise(_forward_target(model, {**targets, **{n: o.module for n, o in experts.items()}}),
                                targets, batches, device=device, observers=observers, hessian=gptq,
                                hessian_tokens=hessian_tokens, offload_activations=offload_activations,
                                on_layer=on_layer, progress=progress, experts=experts)
    if experts:
        report_experts(model)  # logs the experts that took the conservative scales, as the all-at-once path
    model.fp8_layerwise = stats  # layers, peak GPU bytes, wall time per layer
    if progress and stats["peak_gpu_bytes"] is not None:
        tqdm.write(f"layerwise calibration: {stats['layers']} layers, peak GPU memory {stats['peak_gpu_bytes'] / 2**30:.2f} GiB")
    return model


def needs_histogram(schemes) -> bool:
    """True if a static scheme among ``schemes`` uses a histogram-based activation observer."""
    return any(s.static and s.activation_observer != "minmax" for s in schemes)
