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
4. With a *probe* (text the calibration never saw: by default :data:`PROBE_WINDOWS` windows spread
   over the embedded corpus' ``choose`` split, :func:`probe_batches`), each bisection step must also meet the
   budget on an unseen text: the probe's KL plus :data:`PROBE_Z` prediction standard errors for a
   text of :data:`PROBE_JUDGE_WINDOWS` windows (:func:`prediction_se`) ``<= max_kl``.

Why the ranking slice and the margin: ranked and chosen on one slice, the search keeps the layers whose
error happens to be large *there*, so that slice's KL drops more than any other text's; on SmolLM2 the
chosen model then came out 3-8% above the budget on three unseen texts (docs/calibration.md). Ranked
on other text, the held-out KL of the chosen model is a fair estimate, and the margin (its standard
error over the held-out windows) covers its sampling error.

Why the probe: a fair estimate *of the held-out slice's* KL is not one of other text's. The slice is
the calibration text's last windows, and with GPTQ's ``H`` from every calibration token it is closer
to what calibration saw than unseen text is: on SmolLM2 every model, chosen or not, had a 3-10% higher
KL on unseen text than on the slice, so a set that met the budget on the slice missed it on every
unseen text. The probe measures that shift where it matters, on the candidate model itself, and the
prediction margin is for *another* text (a new sample of windows), not for the probe's own mean
(derivation in docs/calibration.md, "Mixed precision to an accuracy budget").

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

from .data import Batch, corpus_text, text_windows
from .evaluate import DEFAULT_EVAL_SEQ_LEN, DEFAULT_EVAL_WINDOWS

#: Share of the calibration batches held out to measure KL (at least one batch).
HOLDOUT_FRACTION = 0.125
#: The chosen model's held-out KL plus this many standard errors (over the held-out windows) must be
#: within the budget.
MARGIN_SE = 1.0
#: The probe's one-sided z: the chosen model's KL on an unseen text of :data:`PROBE_JUDGE_WINDOWS`
#: windows is predicted ``<= max_kl`` at 95% (normal approximation; windows as exchangeable samples).
PROBE_Z = 1.645
#: The size (windows) of the unseen text the prediction is for: as many as ``compare`` evaluates by default.
PROBE_JUDGE_WINDOWS = DEFAULT_EVAL_WINDOWS
#: The embedded corpus' split the default probe reads (the only text defaults may be chosen on).
PROBE_SPLIT = "choose"
#: Windows of the probe text, evenly spaced over all of it (SmolLM2's tokenizer cuts ``choose`` into 39
#: windows of 512 tokens). The unquantized model's fp32 log-probabilities on them are held for the search:
#: ``windows x seq_len x vocab x 4`` bytes (1.6 GB for SmolLM2 at 512 tokens).
PROBE_WINDOWS = 16


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
    #: the probe (unseen text, see :func:`probe_batches`): tokens and windows (0 = no probe), the all-FP8
    #: model's KL on it, the chosen model's KL and its standard error over the probe windows, and the
    #: margin applied to it (:data:`PROBE_Z` prediction standard errors for a text of ``probe_judge_windows``)
    probe_tokens: int = 0
    probe_windows: int = 0
    probe_kl_all_fp8: float = 0.0
    probe_kl: float = 0.0
    probe_se: float = 0.0
    probe_margin: float = 0.0
    probe_z: float = 0.0
    probe_judge_windows: int = 0

    def summary(self) -> str:
        """One line per fact, for logs."""
        mib = 2 ** 20
        return (f"mixed precision: KL {self.kl:.5f} + {self.margin_se:g} x SE {self.kl_se:.5f} <= budget "
                f"{self.max_kl:.5f} nats/token on {self.holdout_tokens} held-out calibration tokens (all FP8: "
                f"{self.kl_all_fp8:.5f}; layers ranked on {self.rank_tokens} other tokens); {self._probe_line()}"
                f"{len(self.kept)} of "
                f"{len(self.sensitivity)} layers kept in high precision: {', '.join(self.kept) or 'none'}; weights "
                f"{self.weight_bytes / mib:.1f} MiB (all FP8 {self.weight_bytes_all_fp8 / mib:.1f}, unquantized "
                f"{self.weight_bytes_unquantized / mib:.1f})")

    def _probe_line(self) -> str:
        if not self.probe_windows:
            return "no unseen-text probe; "
        return (f"unseen-text probe KL {self.probe_kl:.5f} + margin {self.probe_margin:.5f} ({self.probe_z:g} prediction "
                f"SE for {self.probe_judge_windows} windows; probe SE {self.probe_se:.5f}) <= budget on "
                f"{self.probe_tokens} tokens in {self.probe_windows} windows (all FP8: {self.probe_kl_all_fp8:.5f}); ")


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
    return int(sum(_row_tokens(batches)))


def measure_kl(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> float:
    """Mean per-token ``KL(reference || model)`` (nats) over ``batches``."""
    return measure_kl_se(model, batches, refs)[0]


def measure_kl_se(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> tuple[float, float]:
    """``(mean, standard error)`` of the per-token ``KL(reference || model)`` (nats) over ``batches``.

    The mean is over every real predicted token; the standard error treats each sequence (row) as one
    sample (tokens of one window are not independent): that of a token-weighted mean of per-row means,
    ``sqrt(n / (n - 1) * sum_i w_i^2 (m_i - mean)^2) / sum_i w_i``; 0 with fewer than two rows."""
    return kl_mean_se(*_row_kls(model, batches, refs))


def _row_kls(model: nn.Module, batches: list[Batch], refs: list[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Per sequence (row) of ``batches``: the KL sum over its real predicted tokens, and their count."""
    sums, counts = [], []
    with torch.inference_mode():
        for b, r in zip(batches, refs):
            logp = torch.log_softmax(_logits(model, b), -1)
            rows, n = _kl_rows(logp, r.to(logp.device), b)
            sums += rows.double().tolist()
            counts += n.double().tolist()
    return sums, counts


def prediction_se(se: float, windows: int, judge_windows: int) -> float:
    """Standard error of predicting the mean KL of a *new* text of ``judge_windows`` windows from a mean
    measured on ``windows`` windows with standard error ``se``: ``se * sqrt(1 + windows / judge_windows)``.

    Windows as exchangeable samples with per-window spread ``sd = se * sqrt(windows)``: the new text's
    mean has variance ``sd^2 / judge_windows``, the estimate ``sd^2 / windows``, independent."""
    for name, v in (("windows", windows), ("judge_windows", judge_windows)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a number of windows >= 1, got {v!r}")
    if not (isinstance(se, (int, float)) and se >= 0 and math.isfinite(se)):
        raise ValueError(f"se: expected a finite standard error >= 0, got {se!r}")
    return se * math.sqrt(1 + windows / judge_windows)


def probe_batches(tokenizer, seq_len: int = DEFAULT_EVAL_SEQ_LEN, *, text: str | None = None,
                  windows: int = PROBE_WINDOWS, batch_size: int = 4) -> list[Batch]:
    """The unseen-text probe of :func:`keep_to_budget`: ``windows`` windows of ``seq_len`` token ids,
    evenly spaced over all of ``text``'s consecutive windows (default text: the embedded corpus'
    :data:`PROBE_SPLIT` split, disjoint from its calibration split and from the ``report`` split; fewer
    windows if the text has fewer), batched: ``input_ids`` / ``attention_mask`` ``[B, seq_len]`` int64
    (a text shorter than one window gives one shorter row). Raises ValueError without a tokenizer, for
    a text without tokens or bad sizes."""
    for name, v in (("seq_len", seq_len), ("windows", windows), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    text = corpus_text(PROBE_SPLIT) if text is None else text
    if not isinstance(text, str):
        raise ValueError(f"text: expected a str, got {type(text).__name__}")
    wins = text_windows(text, tokenizer, seq_len)
    if not wins:
        raise ValueError("text: expected at least one token, got an empty text")
    n = min(windows, len(wins))
    wins = [wins[(i * len(wins)) // n] for i in range(n)]
    out = []
    for i in range(0, n, batch_size):
        ids = torch.stack(wins[i:i + batch_size])
        out.append(Batch(ids, torch.ones_like(ids)))
    return out


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
                   margin_se: float | None = None, probe: list[Batch] | None = None,
                   probe_refs: list[torch.Tensor] | None = None, probe_z: float | None = None,
                   judge_windows: int | None = None) -> MixedPrecisionReport:
    """Put back the fewest ``originals`` (ranked by :func:`layer_sensitivity` on ``rank_batches``) for a
    held-out KL plus ``margin_se`` standard errors ``<= max_kl`` and, with a ``probe``, a probe KL plus
    ``probe_z`` prediction standard errors ``<= max_kl``; ``quantized[name]`` is the FP8Linear now in
    ``model`` (every one of them must be in place). ``set_module(model, name, module)`` swaps a layer.
    Returns the report.

    ``rank_batches`` / ``rank_refs``: the ranking slice and the unquantized model's log-probabilities on
    it (default: the held-out slice itself, which biases the held-out KL low; see the module docstring).
    ``margin_se``: ``None`` = :data:`MARGIN_SE` (read at call time); 0 = the bare held-out KL.
    ``probe`` / ``probe_refs``: text no calibration step saw (:func:`probe_batches`) and the unquantized
    model's log-probabilities on it; ``None`` = no probe (the held-out slice alone, which reads low on
    unseen text after GPTQ with ``H`` from every token, see docs/calibration.md). ``probe_z`` (``None`` =
    :data:`PROBE_Z`) and ``judge_windows`` (``None`` = :data:`PROBE_JUDGE_WINDOWS`): the margin
    ``probe_z * prediction_se(probe SE, probe windows, judge_windows)``.

    Raises ValueError for a bad budget, margin, z or window count, a slice or probe without its
    references, or a probe without tokens."""
    if not (isinstance(max_kl, (int, float)) and max_kl >= 0 and math.isfinite(max_kl)):
        raise ValueError(f"max_kl: expected a finite KL budget >= 0 (nats/token), got {max_kl!r}")
    margin = MARGIN_SE if margin_se is None else margin_se
    if not (isinstance(margin, (int, float)) and margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"margin_se: expected a finite number of standard errors >= 0, got {margin!r}")
    z = PROBE_Z if probe_z is None else probe_z
    if isinstance(z, bool) or not (isinstance(z, (int, float)) and z >= 0 and math.isfinite(z)):
        raise ValueError(f"probe_z: expected a finite number of standard errors >= 0, got {z!r}")
    judge = PROBE_JUDGE_WINDOWS if judge_windows is None else judge_windows
    if isinstance(judge, bool) or not isinstance(judge, int) or judge < 1:
        raise ValueError(f"judge_windows: expected a number of windows >= 1, got {judge!r}")
    if (rank_batches is None) != (rank_refs is None):
        raise ValueError("rank_batches / rank_refs: give both (the ranking slice and its reference log-probabilities) or neither")
    if (probe is None) != (probe_refs is None):
        raise ValueError("probe / probe_refs: give both (the unseen-text probe and its reference log-probabilities) or neither")
    if probe is not None and _tokens(probe) == 0:
        raise ValueError("probe: expected unseen-text windows with at least one predicted token, got none")
    if rank_batches is None:
        rank_batches, rank_refs = holdout, refs
    fp8_bytes = _weight_bytes(model, quantized)
    unq_bytes = sum(_dense_bytes(originals[n]) for n in quantized)

    def measure() -> tuple[float, float, float, float]:
        """(held-out KL, its SE, probe KL, its SE) of the model as it is now (probe figures 0 without one)."""
        kl, se = measure_kl_se(model, holdout, refs)
        pk, ps = measure_kl_se(model, probe, probe_refs) if probe is not None else (0.0, 0.0)
        return kl, se, pk, ps

    windows = sum(c > 0 for c in _row_tokens(probe)) if probe is not None else 0

    def probe_margin(ps: float) -> float:
        return z * prediction_se(ps, windows, judge) if probe is not None else 0.0

    def meets(m: tuple[float, float, float, float]) -> bool:
        return m[0] + margin * m[1] <= max_kl and m[2] + probe_margin(m[3]) <= max_kl

    m_all = measure()
    sens = layer_sensitivity(model, originals, rank_batches, rank_refs)
    order = sorted(sens, key=lambda n: sens[n], reverse=True)

    def apply(k: int) -> tuple[float, float, float, float]:
        for i, n in enumerate(order):
            set_module(model, n, originals[n] if i < k else quantized[n])
        return measure()

    if not meets(m_all):
        lo, hi = 0, len(order)  # lo misses the budget; hi (every layer back: KL 0) meets it
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(apply(mid)) else (mid, hi)
        k = hi
    else:
        k = 0
    kl, se, pk, ps = apply(k)
    kept = order[:k]
    wb = fp8_bytes - _weight_bytes(_Sub(quantized), kept) + sum(_dense_bytes(originals[n]) for n in kept)
    return MixedPrecisionReport(max_kl=float(max_kl), kl_all_fp8=m_all[0], kl=kl, kept=kept, sensitivity=sens,
                                weight_bytes=wb, weight_bytes_all_fp8=fp8_bytes, weight_bytes_unquantized=unq_bytes,
                                holdout_tokens=_tokens(holdout), kl_se=se, margin_se=float(margin),
                                rank_tokens=_tokens(rank_batches),
                                probe_tokens=_tokens(probe) if probe is not None else 0, probe_windows=windows,
                                probe_kl_all_fp8=m_all[2], probe_kl=pk, probe_se=ps, probe_margin=probe_margin(ps),
                                probe_z=float(z) if probe is not None else 0.0,
                                probe_judge_windows=judge if probe is not None else 0)


def _row_tokens(batches: list[Batch]) -> list[float]:
    """Real predicted tokens per row of ``batches`` (the counts :func:`kl_mean_se` weights by)."""
    return [float(c) for b in batches for c in (b.attention_mask[:, 1:] * b.attention_mask[:, :-1]).sum(-1).tolist()]


def split_ranking(calibration: list[Batch], holdout: list[Batch]) -> list[Batch]:
    """The ranking slice: the last ``len(holdout)`` calibration batches (at most all of them)."""
    return calibration[-min(len(holdout), len(calibration)):]


class _Sub:
    """``get_submodule`` over a dict of modules (for :func:`_weight_bytes` of the FP8 versions)."""

    def __init__(self, mods: dict[str, nn.Module]):
        self.mods = mods

    def get_submodule(self, name: str) -> nn.Module:
        return self.mods[name]
