"""Mixed precision to an accuracy budget: keep the fewest Linear layers in high precision so that the
quantized model's KL to the unquantized one stays within ``max_kl`` (``quantize_model(..., max_kl=...)``).

1. The calibration batches are split: the last :data:`HOLDOUT_FRACTION` (at least one batch) is a
   held-out slice, never seen by the observers or GPTQ; the rest calibrates every layer.
2. Sensitivity of each quantized layer ``l``, measured on the held-out slice with one forward and one
   backward pass of the fully quantized model: ``s_l = <dKL/dy_l, y_l - W_l x_l>``, the first-order
   drop of ``KL(unquantized || quantized)`` when layer ``l``'s output error is removed (``y_l`` its FP8
   output, ``W_l x_l`` the high-precision output on the same input).
3. Layers are ranked by ``s_l``; the smallest ``k`` for which keeping the top ``k`` in high precision
   gives a *measured* held-out KL ``<= max_kl`` is found by bisection (KL measured with real forwards,
   about ``log2(layers)`` of them), and those ``k`` layers are put back as their original ``nn.Linear``.

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

#: Share of the calibration batches held out to measure sensitivity and KL (at least one batch).
HOLDOUT_FRACTION = 0.125


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

    def summary(self) -> str:
        """One line per fact, for logs."""
        mib = 2 ** 20
        return (f"mixed precision: KL {self.kl:.5f} <= budget {self.max_kl:.5f} nats/token on {self.holdout_tokens} "
                f"held-out calibration tokens (all FP8: {self.kl_all_fp8:.5f}); {len(self.kept)} of "
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


def _kl_sum(logp: torch.Tensor, ref: torch.Tensor, b: Batch) -> torch.Tensor:
    """Sum over real (non-padded) predicted positions of ``KL(ref || model)``."""
    m = (b.attention_mask[:, 1:] * b.attention_mask[:, :-1]).to(logp.device, logp.dtype)
    per_tok = (ref.exp() * (ref - logp)).sum(-1)
    return (per_tok * m).sum()


def _tokens(batches: list[Batch]) -> int:
    return int(sum(int((b.attention_mask[:, 1:] * b.attention_mask[:, :-1]).sum()) for b in batches))


def measure_kl(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> float:
    """Mean per-token ``KL(reference || model)`` (nats) over ``batches``."""
    total = 0.0
    with torch.inference_mode():
        for b, r in zip(batches, refs):
            total += float(_kl_sum(torch.log_softmax(_logits(model, b), -1), r.to(next(model.parameters()).device), b))
    return total / max(_tokens(batches), 1)


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
                   holdout: list[Batch], refs: list[torch.Tensor], max_kl: float, set_module) -> MixedPrecisionReport:
    """Put back the fewest ``originals`` (ranked by :func:`layer_sensitivity`) for a held-out KL
    ``<= max_kl``; ``quantized[name]`` is the FP8Linear now in ``model``. Returns the report."""
    if not (isinstance(max_kl, (int, float)) and max_kl >= 0 and math.isfinite(max_kl)):
        raise ValueError(f"max_kl: expected a finite KL budget >= 0 (nats/token), got {max_kl!r}")
    fp8_bytes = _weight_bytes(model, quantized)
    unq_bytes = sum(_dense_bytes(originals[n]) for n in quantized)
    kl_all = measure_kl(model, holdout, refs)
    sens = layer_sensitivity(model, originals, holdout, refs)
    order = sorted(sens, key=lambda n: sens[n], reverse=True)

    def apply(k: int) -> float:
        for i, n in enumerate(order):
            set_module(model, n, originals[n] if i < k else quantized[n])
        return measure_kl(model, holdout, refs)

    kl_at = {0: kl_all}
    if kl_all > max_kl:
        lo, hi = 0, len(order)  # kl(lo) > max_kl, kl(hi) = 0 <= max_kl
        kl_at[hi] = 0.0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            kl_at[mid] = apply(mid)
            lo, hi = (mid, hi) if kl_at[mid] > max_kl else (lo, mid)
        k = hi
    else:
        k = 0
    kl = apply(k)
    kept = order[:k]
    wb = fp8_bytes - _weight_bytes(_Sub(quantized), kept) + sum(_dense_bytes(originals[n]) for n in kept)
    return MixedPrecisionReport(max_kl=float(max_kl), kl_all_fp8=kl_all, kl=kl, kept=kept, sensitivity=sens,
                                weight_bytes=wb, weight_bytes_all_fp8=fp8_bytes, weight_bytes_unquantized=unq_bytes,
                                holdout_tokens=_tokens(holdout))


class _Sub:
    """``get_submodule`` over a dict of modules (for :func:`_weight_bytes` of the FP8 versions)."""

    def __init__(self, mods: dict[str, nn.Module]):
        self.mods = mods

    def get_submodule(self, name: str) -> nn.Module:
        return self.mods[name]
