"""Mixed precision to an accuracy budget: keep the fewest Linear layers in high precision so that the
quantized model's KL to the unquantized one stays within ``max_kl`` (``quantize_model(..., max_kl=...)``).

1. The calibration batches are split: the last :data:`HOLDOUT_FRACTION` (at least one batch) is a
   held-out slice, never seen by the observers or GPTQ; the rest calibrates every layer.
2. Sensitivity of each quantized layer ``l``, measured on a *ranking* slice (the last calibration
   batches, as many as are held out: disjoint from the held-out slice) with one forward and one
   backward pass of the fully quantized model: ``s_l = <dKL/dy_l, y_l - W_l x_l>``, the first-order
   drop of ``KL(unquantized || quantized)`` when layer ``l``'s output error is removed (``y_l`` its FP8
   output, ``W_l x_l`` the high-precision output on the same input).
3. Layers are ranked by ``s_l``; the smallest ``k`` for which keeping the top ``k`` in high precision
   gives a *measured* held-out KL plus :data:`MARGIN_SE` standard errors ``<= max_kl`` is found by
   bisection (KL measured with real forwards, about ``log2(layers)`` of them), and those ``k`` layers
   are put back as their original ``nn.Linear``.

Why the ranking slice and the margin: ranked and chosen on one slice, the search keeps the layers whose
error happens to be large *there*, so that slice's KL drops more than any other text's; on SmolLM2 the
chosen model then came out 3-8% above the budget on three unseen texts (docs/calibration.md). Ranked
on other text, the held-out KL of the chosen model is a fair estimate, and the margin (its standard
error over the held-out windows) covers its sampling error.

The result is an ordinary checkpoint: the kept layers are plain Linear modules (``ignore`` in the
compressed-tensors config). The :class:`MixedPrecisionReport` (``model.fp8_mixed_precision``) lists
them and the weight memory of the quantized layers.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8_linear.errors import CalibrationError

from .data import Batch

#: Share of the calibration batches held out to measure KL (at least one batch).
HOLDOUT_FRACTION = 0.125
#: The chosen model's held-out KL plus this many standard errors (over the held-out windows) must be
#: within the budget.
MARGIN_SE = 1.0


@dataclasses.dataclass
class MixedPrecisionReport:
    """What the budget search chose. KL in nats per token on the held-out slice of the calibration data."""

    max_kl: float
    kl_all_fp8: float
    kl: float
    kept: list[str]
    sensitivity: dict[str, float]
    weight_bytes: int
    weight_bytes_all_fp8: int
    weight_bytes_unquantized: int
    holdout_tokens: int
    #: standard error of ``kl`` over the held-out windows, and the margin in standard errors that was applied
    kl_se: float = 0.0
    margin_se: float = 0.0
    #: tokens of the slice the layers were ranked on (disjoint from the held-out slice unless it is the same)
    rank_tokens: int = 0

    def summary(self) -> str:
        """One line per fact, for logs."""
        mib = 2 ** 20
        return (f"mixed precision: KL {self.kl:.5f} + {self.margin_se:g} x SE {self.kl_se:.5f} <= budget "
                f"{self.max_kl:.5f} nats/token on {self.holdout_tokens} held-out calibration tokens (all FP8: "
                f"{self.kl_all_fp8:.5f}; layers ranked on {self.rank_tokens} other tokens); {len(self.kept)} of "
                f"{len(self.sensitivity)} layers kept in high precision: {', '.join(self.kept) or 'none'}; weights "
                f"{self.weight_bytes / mib:.1f} MiB (all FP8 {self.weight_bytes_all_fp8 / mib:.1f}, unquantized "
                f"{self.weight_bytes_unquantized / mib:.1f})")


def split_holdout(batches: list[Batch], fraction: float = HOLDOUT_FRACTION) -> tuple[list[Batch], list[Batch]]:
    """``(calibration, held_out)``: the last ``ceil(fraction * len)`` batches are held out (at least one,
    and at least one left to calibrate). Raises :class:`CalibrationError` with fewer than 2 batches."""
    if len(batches) < 2:
        raise CalibrationError(f"calib_data: max_kl needs at least 2 calibration batches (one is held out), got {len(batches)}")
    n = min(max(1, math.ceil(fraction * len(batches))), len(batches) - 1)
    return batches[:-n], batches[-n:]


def _logits(model: nn.Module, b: Batch) -> torch.Tensor:
    dev = next(model.parameters()).device
    out = model(input_ids=b.input_ids.to(dev), attention_mask=b.attention_mask.to(dev))
    return out.logits[:, :-1].float()


def reference_logprobs(model: nn.Module, batches: list[Batch]) -> list[torch.Tensor]:
    """Next-token log-probabilities ``[B, T-1, vocab]`` (fp32) of the unquantized model per batch."""
    with torch.inference_mode():
        return [torch.log_softmax(_logits(model, b), -1) for b in batches]


def _kl_rows(logp: torch.Tensor, ref: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the sum of ``KL(ref || model)`` over real (non-padded) predicted positions ``[B]``, and
    their count ``[B]``."""
    m = (b.attention_mask[:, 1:] * b.attention_mask[:, :-1]).to(logp.device, logp.dtype)
    per_tok = (ref.exp() * (ref - logp)).sum(-1)
    return (per_tok * m).sum(-1), m.sum(-1)


def _kl_sum(logp: torch.Tensor, ref: torch.Tensor, b: Batch) -> torch.Tensor:
    """Sum over real (non-padded) predicted positions of ``KL(ref || model)``."""
    return _kl_rows(logp, ref, b)[0].sum()


def _tokens(batches: list[Batch]) -> int:
    return int(sum(int((b.attention_mask[:, 1:] * b.attention_mask[:, :-1]).sum()) for b in batches))


def measure_kl(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> float:
    """Mean per-token ``KL(reference || model)`` (nats) over ``batches``."""
    return measure_kl_se(model, batches, refs)[0]


def measure_kl_se(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> tuple[float, float]:
    """``(mean, standard error)`` of the per-token ``KL(reference || model)`` (nats) over ``batches``.

    The mean is over every real predicted token; the standard error treats each sequence (row) as one
    sample (tokens of one window are not independent): that of a token-weighted mean of per-row means,
    ``sqrt(n / (n - 1) * sum_i w_i^2 (m_i - mean)^2) / sum_i w_i``; 0 with fewer than two rows."""
    sums, counts = [], []
    with torch.inference_mode():
        for b, r in zip(batches, refs):
            logp = torch.log_softmax(_logits(model, b), -1)
            rows, n = _kl_rows(logp, r.to(logp.device), b)
            sums += rows.double().tolist()
            counts += n.double().tolist()
    return kl_mean_se(sums, counts)


def kl_mean_se(sums: list[float], counts: list[float]) -> tuple[float, float]:
    """Token-weighted mean of per-row KL sums ``sums`` over ``counts`` tokens, and its standard error
    (rows as samples; see :func:`measure_kl_se`). Rows without tokens are dropped."""
    rows = [(s, c) for s, c in zip(sums, counts) if c > 0]
    total = sum(c for _, c in rows)
    if total == 0:
        return 0.0, 0.0
    mean = sum(s for s, _ in rows) / total
    n = len(rows)
    if n < 2:
        return mean, 0.0
    var = n / (n - 1) * sum((s - mean * c) ** 2 for s, c in rows)  # w_i (m_i - mean) = s_i - mean * c_i
    return mean, math.sqrt(var) / total


def layer_sensitivity(model: nn.Module, originals: dict[str, nn.Linear], batches: list[Batch],
                      refs: list[torch.Tensor]) -> dict[str, float]:
    """``s_l = <dKL/dy_l, y_l - W_l x_l>`` for every quantized layer ``l`` of ``model`` named in
    ``originals`` (first-order KL drop when layer ``l`` is restored), summed over ``batches`` and
    divided by tokens.

    One forward + backward per batch through the quantized model (straight-through gradients of
    FP8Linear); no parameter gets a gradient. ``originals[name]`` is the unquantized Linear; a name
    whose module in ``model`` is its original is skipped."""
    mods = {n: m for n, m in model.named_modules() if n in originals and m is not originals[n]}
    sens = {n: 0.0 for n in mods}
    emb = model.get_input_embeddings()
    handles = [emb.register_forward_hook(lambda _m, _a, out: out.detach().requires_grad_())]

    def hook(name):
        def fwd(_m, args, out):
            ref = originals[name]
            with torch.no_grad():
                x = args[0]
                delta = out.detach().float() - F.linear(x.detach().to(ref.weight.dtype), ref.weight,
                                                         ref.bias).float()

            def grad_hook(g):
                sens[name] += float((g.float() * delta).sum())

            if out.requires_grad:
                out.register_hook(grad_hook)
            return out

        return fwd

    handles += [m.register_forward_hook(hook(n)) for n, m in mods.items()]
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        with torch.enable_grad():
            for b, r in zip(batches, refs):
                logp = torch.log_softmax(_logits(model, b), -1)
                _kl_sum(logp, r.to(logp.device), b).backward()
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.requires_grad_(True)
    n_tok = max(_tokens(batches), 1)
    return {n: v / n_tok for n, v in sens.items()}


def _weight_bytes(model: nn.Module, names) -> int:
    total = 0
    for n in names:
        m = model.get_submodule(n)
        total += sum(t.numel() * t.element_size() for t in (m.weight, getattr(m, "weight_scale", None)) if t is not None)
    return total


def _dense_bytes(lin: nn.Linear) -> int:
    return lin.weight.numel() * lin.weight.element_size()


def keep_to_budget(model: nn.Module, quantized: dict[str, nn.Module], originals: dict[str, nn.Linear],
                   holdout: list[Batch], refs: list[torch.Tensor], max_kl: float, set_module,
                   rank_batches: list[Batch] | None = None, rank_refs: list[torch.Tensor] | None = None,
                   margin_se: float | None = None) -> MixedPrecisionReport:
    """Put back the fewest ``originals`` (ranked by :func:`layer_sensitivity` on ``rank_batches``) for a
    held-out KL plus ``margin_se`` standard errors ``<= max_kl``; ``quantized[name]`` is the FP8Linear now
    in ``model``. Returns the report.

    ``rank_batches`` / ``rank_refs``: the ranking slice and the unquantized model's log-probabilities on
    it (default: the held-out slice itself, which biases the held-out KL low; see the module docstring).
    ``margin_se``: ``None`` = :data:`MARGIN_SE` (read at call time); 0 = the bare held-out KL."""
    if not (isinstance(max_kl, (int, float)) and max_kl >= 0 and math.isfinite(max_kl)):
        raise ValueError(f"max_kl: expected a finite KL budget >= 0 (nats/token), got {max_kl!r}")
    margin = MARGIN_SE if margin_se is None else margin_se
    if not (isinstance(margin, (int, float)) and margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"margin_se: expected a finite number of standard errors >= 0, got {margin!r}")
    if (rank_batches is None) != (rank_refs is None):
        raise ValueError("rank_batches / rank_refs: give both (the ranking slice and its reference log-probabilities) or neither")
    if rank_batches is None:
        rank_batches, rank_refs = holdout, refs
    fp8_bytes = _weight_bytes(model, quantized)
    unq_bytes = sum(_dense_bytes(originals[n]) for n in quantized)
    kl_all, se_all = measure_kl_se(model, holdout, refs)
    sens = layer_sensitivity(model, originals, rank_batches, rank_refs)
    order = sorted(sens, key=lambda n: sens[n], reverse=True)

    def apply(k: int) -> tuple[float, float]:
        for i, n in enumerate(order):
            set_module(model, n, originals[n] if i < k else quantized[n])
        return measure_kl_se(model, holdout, refs)

    def meets(kl_se: tuple[float, float]) -> bool:
        return kl_se[0] + margin * kl_se[1] <= max_kl

    if not meets((kl_all, se_all)):
        lo, hi = 0, len(order)  # lo misses the budget; hi (every layer back: KL 0) meets it
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(apply(mid)) else (mid, hi)
        k = hi
    else:
        k = 0
    kl, se = apply(k)
    kept = order[:k]
    wb = fp8_bytes - _weight_bytes(_Sub(quantized), kept) + sum(_dense_bytes(originals[n]) for n in kept)
    return MixedPrecisionReport(max_kl=float(max_kl), kl_all_fp8=kl_all, kl=kl, kept=kept, sensitivity=sens,
                                weight_bytes=wb, weight_bytes_all_fp8=fp8_bytes, weight_bytes_unquantized=unq_bytes,
                                holdout_tokens=_tokens(holdout), kl_se=se, margin_se=float(margin),
                                rank_tokens=_tokens(rank_batches))


def split_ranking(calibration: list[Batch], holdout: list[Batch]) -> list[Batch]:
    """The ranking slice: the last ``len(holdout)`` calibration batches (at most all of them)."""
    return calibration[-min(len(holdout), len(calibration)):]


class _Sub:
    """``get_submodule`` over a dict of modules (for :func:`_weight_bytes` of the FP8 versions)."""

    def __init__(self, mods: dict[str, nn.Module]):
        self.mods = mods

    def get_submodule(self, name: str) -> nn.Module:
        return self.mods[name]
