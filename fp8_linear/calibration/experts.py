"""Calibration and quantization of fused MoE experts (transformers' ``use_experts_implementation``
modules; docs/moe.md).

A forward pre-hook on each fused experts module sees the tokens the router sends it
(``hidden_states [T, H]``, ``top_k_index [T, k]``; padding removed) and keeps, per expert, the token
count and the exact running max of its two inputs: the tokens it is routed (input of
``gate_up_proj`` / ``up_proj``) and its intermediate activation (input of ``down_proj``, computed from
the original weights). It also keeps the layer-wide max and a uniform sample of the layer's tokens
(:data:`SAMPLE_TOKENS`, bottom-k of random keys).

Experts with fewer than ``min_tokens`` routed tokens (:data:`MIN_EXPERT_TOKENS`; zero included) get a
conservative static scale instead of an optimistic one, never NaN, 0 or inf:

- first projection: the layer-wide amax (every token of the layer, whichever expert it went to);
- ``down_proj``: the larger of its own amax and the amax of its intermediate activation on the
  layer's token sample (what the expert computes for tokens the router sent elsewhere).

Weight scales never depend on tokens (min-max, or the scheme's weight observer on each expert's
matrix). :func:`moe_report` lists the per-expert token counts and which experts took the fallback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from fp8_linear.errors import CalibrationError
from fp8_linear.formats import FP8_DTYPES
from fp8_linear.module import FP8Linear
from fp8_linear.moe.convert import replace_module, select_fused_experts
from fp8_linear.moe.experts import FP8Experts, part_rows, weight_scale_shape
from fp8_linear.scheme import QuantScheme, resolve_scheme

from .data import Batch
from .hooks import ObserverHooks
from .observers import weight_scale

log = logging.getLogger("fp8_linear")

#: Experts routed fewer calibration tokens than this get the conservative activation scales.
MIN_EXPERT_TOKENS = 16
#: Tokens of each MoE layer's input kept (uniformly sampled) to estimate rare experts' activations.
SAMPLE_TOKENS = 512
#: Seed of the token sample (calibration is deterministic).
SAMPLE_SEED = 0


def _expert_weight(src: nn.Module, name: str, e: int) -> torch.Tensor:
    """Expert ``e``'s weight of projection ``name`` in the nn.Linear layout ``[out, in]``."""
    w = getattr(src, name)[e]
    return w.t() if getattr(src, "is_transposed", False) else w


def _intermediate(src: nn.Module, first: str, x: torch.Tensor, e: int) -> torch.Tensor:
    """Input of expert ``e``'s ``down_proj`` for tokens ``x`` ``[n, H]``, from the original weights (fp32)."""
    h = torch.nn.functional.linear(x.float(), _expert_weight(src, first, e).float())
    bias = getattr(src, f"{first}_bias", None) if getattr(src, "has_bias", False) else None
    if isinstance(bias, torch.Tensor):
        h = h + bias[e].float()
    return src._apply_gate(h) if getattr(src, "has_gate", True) else src.act_fn(h)


class ExpertsObserver:
    """Per-expert statistics of one fused experts module during calibration (see the module docstring)."""

    def __init__(self, name: str, module: nn.Module):
        self.name = name
        self.module = module
        e = module.gate_up_proj.shape[0] if getattr(module, "has_gate", True) else module.up_proj.shape[0]
        self.num_experts = e
        self.first = "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"
        self.counts = torch.zeros(e, dtype=torch.int64)
        self.amax_in = torch.zeros(e, dtype=torch.float32)
        self.amax_mid = torch.zeros(e, dtype=torch.float32)
        self.layer_amax = 0.0
        self.sample: torch.Tensor | None = None
        self._keys: torch.Tensor | None = None
        self._gen = torch.Generator().manual_seed(SAMPLE_SEED)

    def update(self, x: torch.Tensor, top_k_index: torch.Tensor) -> None:
        """Fold routed tokens ``x`` ``[T, H]`` with their expert ids ``[T, k]`` (padding already removed)."""
        if x.numel() == 0:
            return
        xf = x.detach().float()
        m = xf.abs().amax()
        if not bool(torch.isfinite(m)):
            raise CalibrationError(f"activations of experts {self.name!r}: expected finite values, got NaN/inf")
        self.layer_amax = max(self.layer_amax, float(m))
        self._sample(xf)
        ids = top_k_index.detach().reshape(x.shape[0], -1)
        for e in torch.unique(ids).tolist():
            if not 0 <= e < self.num_experts:
                continue  # expert-parallel sentinel
            tok = (ids == e).any(dim=-1)
            xe = xf[tok]
            self.counts[e] += int(xe.shape[0])
            self.amax_in[e] = max(float(self.amax_in[e]), float(xe.abs().amax()))
            mid = _intermediate(self.module, self.first, xe, e)
            self.amax_mid[e] = max(float(self.amax_mid[e]), float(mid.abs().amax()))

    def _sample(self, xf: torch.Tensor) -> None:
        keys = torch.rand(xf.shape[0], generator=self._gen)
        rows = xf.cpu()
        if self.sample is not None:
            keys, rows = torch.cat([self._keys, keys]), torch.cat([self.sample, rows])
        if keys.numel() > SAMPLE_TOKENS:
            keep = torch.topk(keys, SAMPLE_TOKENS, largest=False).indices
            keys, rows = keys[keep], rows[keep]
        self._keys, self.sample = keys, rows

    def input_amax(self, min_tokens: int = MIN_EXPERT_TOKENS) -> tuple[dict[str, torch.Tensor], list[int]]:
        """``({first: [E], "down_proj": [E]}, fallback experts)``: the static amax per expert, with the
        conservative rule for experts routed fewer than ``min_tokens`` tokens."""
        if self.layer_amax == 0.0 or self.sample is None:
            raise CalibrationError(f"calib_data: no calibration token reached the experts of {self.name!r}")
        first, mid = self.amax_in.clone(), self.amax_mid.clone()
        rare = [e for e in range(self.num_experts) if int(self.counts[e]) < min_tokens]
        dev = getattr(self.module, self.first).device
        for e in rare:
            first[e] = self.layer_amax
            with torch.no_grad():
                est = _intermediate(self.module, self.first, self.sample.to(dev), e).abs().amax()
            mid[e] = max(float(mid[e]), float(est))
        for name, t in ((self.first, first), ("down_proj", mid)):
            if not bool(torch.isfinite(t).all()):
                raise CalibrationError(f"activations of experts {self.name!r}.{name}: expected finite values, got NaN/inf")
        return {self.first: first, "down_proj": mid}, rare


def select_experts(model: nn.Module, ignore: Iterable[str] = ()) -> dict[str, nn.Module]:
    """The fused experts modules of ``model`` to quantize (``ignore``: exact names, ``re:`` regexes,
    class names, as :func:`~fp8_linear.calibration.quantize.select_linears` reads them)."""
    return select_fused_experts(model, ignore)


class ExpertsHooks(ObserverHooks):
    """Forward pre-hooks folding each fused experts module's routed tokens into its :class:`ExpertsObserver`.

    :class:`~fp8_linear.calibration.hooks.ObserverHooks`' ``begin_batch`` / ``attach`` / ``remove``,
    shared by the all-at-once (:func:`calibrate_experts`) and the layer-by-layer
    (:mod:`~fp8_linear.calibration.layerwise`) calibration: per batch call :meth:`begin_batch` with the
    flattened attention mask (bool ``[B * T]`` on the activations' device, or ``None``); padding tokens
    never reach an observer. The hook reads ``hidden_states [T, H]`` and the integer ``top_k_index [T, k]``.
    """

    def __init__(self, observers: dict[str, ExpertsObserver]):
        super().__init__(observers)

    def _hook(self, name: str):
        def hook(_mod, args, kwargs):
            values = list(args) + list(kwargs.values())
            x = values[0]
            idx = next((v for v in values[1:] if isinstance(v, torch.Tensor) and not v.is_floating_point()), None)
            if idx is None:
                raise CalibrationError(f"experts {name!r}: called without integer expert ids (top_k_index)")
            mask = self.mask
            if mask is not None and x.shape[0] == mask.numel():
                x, idx = x[mask], idx.reshape(x.shape[0], -1)[mask]
            self.observers[name].update(x, idx)

        return hook


def calibrate_experts(model: nn.Module, targets: dict[str, nn.Module], batches: list[Batch], *,
                      progress: bool = True) -> dict[str, ExpertsObserver]:
    """Run ``batches`` through ``model`` and observe every fused experts module in ``targets``.

    Returns one :class:`ExpertsObserver` per name. Raises :class:`CalibrationError` when no token
    reaches the experts or an activation is NaN/inf.
    """
    from tqdm.auto import tqdm

    obs = {n: ExpertsObserver(n, m) for n, m in targets.items()}
    hooks = ExpertsHooks(obs).attach(targets)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for b in tqdm(batches, desc="calibrating experts", unit="batch", disable=not progress):
                if b.num_tokens == 0:
                    continue
                mask = b.attention_mask.reshape(-1).bool()
                hooks.begin_batch(None if bool(mask.all()) else mask.to(device))
                model(input_ids=b.input_ids.to(device), attention_mask=b.attention_mask.to(device))
    finally:
        hooks.remove()
        model.train(was_training)
    return obs


def _weight_scales(src: nn.Module, scheme: QuantScheme) -> dict[str, torch.Tensor] | None:
    """Per-expert weight scales from the scheme's weight observer (``None``: min-max inside ``from_experts``)."""
    if scheme.weight_observer == "minmax":
        return None
    has_gate = getattr(src, "has_gate", True)
    out = {}
    for name, parts in (("gate_up_proj" if has_gate else "up_proj", 2 if has_gate else 1), ("down_proj", 1)):
        w = getattr(src, name).detach()
        e = w.shape[0]
        w = w.transpose(-2, -1) if getattr(src, "is_transposed", False) else w
        shape = weight_scale_shape(scheme.weight_granularity, e, w.shape[1], w.shape[2], parts)
        s = torch.empty(shape, dtype=torch.float32, device=w.device)
        for x in range(e):
            for p in range(parts):
                rows = part_rows(w[x], p, parts, getattr(src, "is_concatenated", True))
                ws = weight_scale(rows, scheme.weight_granularity, scheme.fmt, scheme.weight_observer)
                if scheme.weight_granularity == "tensor":
                    s[x, p] = ws.reshape(())
                elif scheme.weight_granularity == "channel":
                    part_rows(s[x], p, parts, getattr(src, "is_concatenated", True)).copy_(ws)
                else:
                    s[x, p] = ws
        out[name] = s
    return out


def quantize_experts(model: nn.Module, scheme: "str | QuantScheme", batches: list[Batch] | None = None, *,
                     ignore: Iterable[str] = (), progress: bool = True,
                     min_tokens: int = MIN_EXPERT_TOKENS) -> "MoEReport":
    """Replace every fused experts module of ``model`` (in place) by an :class:`FP8Experts`.

    Args:
        model: a transformers model (unquantized experts; called with ``input_ids`` / ``attention_mask``).
        scheme: the preset or scheme (the one ``quantize_model`` applies to the Linear layers).
        batches: calibration batches; required for static schemes, optional otherwise (then only the
            per-expert token counts are recorded).
        ignore: experts modules to keep in high precision (names, ``re:`` patterns or class names).
        min_tokens: experts routed fewer tokens take the conservative activation scales.

    Returns:
        :func:`moe_report` of the model after the swap. A model without fused experts is left as is.
    """
    scheme = resolve_scheme(scheme)
    targets = select_experts(model, ignore)
    if not targets:
        return moe_report(model)
    if scheme.static and batches is None:
        raise CalibrationError(f"calib_data: static scheme {scheme.name!r} needs calibration data for the MoE experts")
    observers = calibrate_experts(model, targets, batches, progress=progress) if batches is not None else {}
    return apply_experts_quantization(model, targets, scheme, observers, min_tokens)


def apply_experts_quantization(model: nn.Module, targets: dict[str, nn.Module], scheme: "str | QuantScheme",
                               observers: dict[str, ExpertsObserver], min_tokens: int = MIN_EXPERT_TOKENS) -> "MoEReport":
    """Replace each ``targets`` experts module of ``model`` (in place) by an :class:`FP8Experts` of ``scheme``,
    with the static scales of ``observers`` (from :func:`calibrate_experts`; ``{}`` for dynamic schemes
    without calibration). Several schemes can be applied to copies of a model after one calibration
    (the observers refer to the original modules, so keep the original alive). Returns :func:`moe_report`
    (experts that took the conservative scales are logged)."""
    swap_experts(model, targets, scheme, observers, min_tokens)
    return report_experts(model)


def swap_experts(model: nn.Module, targets: dict[str, nn.Module], scheme: "str | QuantScheme",
                 observers: dict[str, ExpertsObserver], min_tokens: int = MIN_EXPERT_TOKENS) -> None:
    """The swap of :func:`apply_experts_quantization` without the report: each experts module of ``targets``
    becomes an :class:`FP8Experts` on the module's device, its per-expert token counts and fallback experts
    kept on it (``calibration_tokens``, ``calibration_fallback``). The layer-by-layer path calls it for
    the experts of one decoder layer at a time."""
    scheme = resolve_scheme(scheme)
    if scheme.static and any(n not in observers for n in targets):
        raise CalibrationError(f"observers: static scheme {scheme.name!r} needs calibration statistics for every "
                               f"experts module, missing {[n for n in targets if n not in observers][:3]}")
    with torch.no_grad():
        for name, src in targets.items():
            ob = observers.get(name)
            amax, rare = ob.input_amax(min_tokens) if ob is not None and scheme.static else (None, [])
            if ob is not None and not scheme.static:
                rare = [e for e in range(ob.num_experts) if int(ob.counts[e]) < min_tokens]
            new = FP8Experts.from_experts(src, scheme, input_amax=amax, weight_scales=_weight_scales(src, scheme))
            new.calibration_tokens = ob.counts.tolist() if ob is not None else None
            new.calibration_fallback = rare
            replace_module(model, name, new)


def report_experts(model: nn.Module) -> "MoEReport":
    """:func:`moe_report` of ``model``, logging the experts that took the conservative scales."""
    report = moe_report(model)
    if any(x.fallback for x in report.layers):
        log.info("fp8_linear: %s", report.fallback_summary())
    return report


@contextlib.contextmanager
def experts_quantized_in_place(model: nn.Module, targets: dict[str, nn.Module], scheme: "str | QuantScheme",
                               observers: dict[str, ExpertsObserver], min_tokens: int = MIN_EXPERT_TOKENS):
    """``model`` with its ``targets`` experts modules swapped for :class:`FP8Experts` of ``scheme`` inside
    the block (:func:`apply_experts_quantization`), its own modules again after it (``compare_schemes``
    quantizes, saves and restores one model per scheme). Yields the :func:`moe_report` of the swap
    (``None`` without targets)."""
    try:
        yield apply_experts_quantization(model, targets, scheme, observers, min_tokens) if targets else None
    finally:
        for name, src in targets.items():
            replace_module(model, name, src)


# ---------------------------------------------------------------------------------------------- report
@dataclass
class ExpertsLayer:
    """One fused experts module: its name, per-expert calibration token counts (``None``: not
    calibrated) and the experts that took the conservative activation scales."""

    name: str
    num_experts: int
    tokens: list[int] | None
    fallback: list[int]


@dataclass
class MoEReport:
    """What quantization did to the Linear-like weights of a model (see :func:`moe_report`)."""

    layers: list[ExpertsLayer] = field(default_factory=list)
    fp8_matrices: int = 0
    high_precision: dict[str, int] = field(default_factory=dict)
    fp8_bytes: int = 0
    bf16_bytes: int = 0

    @property
    def weight_memory_ratio(self) -> float:
        """Bytes of the Linear-like weights as stored (FP8 + scales, the rest as BF16) over all in BF16."""
        hp = 2 * sum(self.high_precision.values())
        return (self.fp8_bytes + hp) / self.bf16_bytes if self.bf16_bytes else float("nan")

    def fallback_summary(self) -> str:
        parts = [f"{x.name}: experts {x.fallback}" for x in self.layers if x.fallback]
        return f"experts with fewer than {MIN_EXPERT_TOKENS} calibration tokens took conservative scales ({'; '.join(parts)})"

    def to_dict(self) -> dict:
        return {
            "fp8_matrices": self.fp8_matrices, "high_precision_weights": dict(self.high_precision),
            "weight_memory_ratio": self.weight_memory_ratio,
            "layers": [{"name": x.name, "tokens": x.tokens, "fallback": x.fallback} for x in self.layers],
        }

    def __str__(self) -> str:
        lines = [f"Linear-like weights: {self.fp8_matrices} FP8 matrices, {len(self.high_precision)} kept in high "
                 f"precision; weight memory {self.weight_memory_ratio:.3f}x BF16"]
        for x in self.layers:
            toks = "not calibrated" if x.tokens is None else " ".join(str(t) for t in x.tokens)
            fb = f" (conservative scales: {x.fallback})" if x.fallback else ""
            lines.append(f"  {x.name}: tokens per expert {toks}{fb}")
        return "\n".join(lines)


def moe_report(model: nn.Module, exclude: Iterable[str] = ()) -> MoEReport:
    """Count the Linear-like weights of ``model``: FP8 matrices (one per FP8Linear, one per expert and
    projection part of an FP8Experts: gate, up, down) and the 2-D+ float weights left in high precision
    (routers, ignored Linear layers, unquantized experts), with their bytes; embeddings and the output
    embedding (and module names in ``exclude``) are not Linear-like weights here."""
    rep = MoEReport()
    skip = set(exclude)
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Embedding) or mod is head or name in skip:
            continue
        if isinstance(mod, FP8Experts):
            lay = mod.fp8_layout
            rep.fp8_matrices += lay["num_experts"] * (lay["parts"] + 1)
            for t in mod.fp8_tensors():
                rep.fp8_bytes += t.numel() * t.element_size()
            for nm, rows, cols, _ in mod.projections():
                rep.bf16_bytes += 2 * lay["num_experts"] * rows * cols
            rep.layers.append(ExpertsLayer(name, lay["num_experts"], getattr(mod, "calibration_tokens", None),
                                           list(getattr(mod, "calibration_fallback", []))))
            continue
        if isinstance(mod, FP8Linear):
            rep.fp8_matrices += 1
            rep.fp8_bytes += sum(t.numel() * t.element_size() for t in (mod.weight, mod.weight_scale, mod.input_scale)
                                 if t is not None)
            rep.bf16_bytes += 2 * mod.weight.numel()
            continue
        for pname, p in mod.named_parameters(recurse=False):
            if p.dim() >= 2 and p.dtype.is_floating_point and p.dtype not in FP8_DTYPES:
                rep.high_precision[f"{name}.{pname}" if name else pname] = p.numel()
                rep.bf16_bytes += 2 * p.numel()
    return rep
