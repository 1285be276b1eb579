"""Evaluation of quantized models against their unquantized twin.

Metrics (all computed in lockstep over the same batches, so one batch of activations is alive at a time):

- causal LMs: perplexity (next-token NLL over fixed, non-overlapping windows of held-out text), top-1
  agreement with the reference model's argmax, and ``KL(reference || quantized)`` per token (nats);
- encoders: cosine between mean-pooled (attention-masked, as sentence-transformers all-MiniLM does)
  last hidden states of the quantized and the reference model;
- per layer: SQNR in dB of each ``FP8Linear`` output against the unquantized linear's output on the
  *same* input (``10 log10(sum y_ref^2 / sum (y - y_ref)^2)``).

The reference is the unquantized model in the dtype it is evaluated in (fp32 on CPU by default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fp8_linear.backends.emulated import weight_cache
from fp8_linear.module import FP8Linear

from .data import Batch, corpus_text, text_windows

#: Default evaluation: windows of this many tokens from the eval split, at most this many windows.
DEFAULT_EVAL_SEQ_LEN = 512
#: The default window count follows from the main job's time budget alone, never from which preset
#: ranks first. Rule: the whole eval split if the main job (``fp8-linear compare``) stays under
#: :data:`MAIN_JOB_TARGET_S` on an idle 2-core CPU, else the largest multiple of the eval batch size
#: that does. Measured (2026-11-29, idle 2-core CPU, SmolLM2-135M): one 512-token window costs 6.75 s
#: (the unquantized model + 4 presets), the job took 121 s with 8 windows, so it takes about
#: ``121 + 6.75 * (windows - 8)`` s; the eval split holds 63 windows (about 490 s: over the 5-minute
#: budget), 20 windows about 202 s, 16 windows about 175 s. Then measured with the default command:
#: 16 windows 151 s, 20 windows 222 s (benchmarks/results/compare_smollm2_cpu_20261129_w16, _w20), so 16.
DEFAULT_EVAL_WINDOWS = 16
#: Wall-time target of the main job on an idle 2-core CPU (the budget is 300 s; the rest is margin
#: for slower or shared machines).
MAIN_JOB_TARGET_S = 200
DEFAULT_EVAL_BATCH_SIZE = 4
#: Batches used for per-layer SQNR (each costs one extra high-precision matmul per layer).
SQNR_BATCHES = 1


@dataclass
class EvalResult:
    """Metrics of one model (``None`` where the metric does not apply)."""

    name: str
    perplexity: float | None = None
    nll: float | None = None
    #: Causal LMs: mean next-token NLL (nats) of each eval window, in batch order (for paired errors).
    window_nll: list[float] = field(default_factory=list)
    tokens: int = 0
    top1_agreement: float | None = None
    kl: float | None = None
    embedding_cosine: float | None = None
    layer_sqnr_db: dict[str, float] = field(default_factory=dict)

    @property
    def mean_sqnr_db(self) -> float | None:
        v = [x for x in self.layer_sqnr_db.values() if math.isfinite(x)]
        return sum(v) / len(v) if v else None

    @property
    def min_sqnr_db(self) -> float | None:
        return min(self.layer_sqnr_db.values()) if self.layer_sqnr_db else None


def eval_batches(tokenizer, text: str | None = None, *, seq_len: int = DEFAULT_EVAL_SEQ_LEN,
                 max_windows: int = DEFAULT_EVAL_WINDOWS, batch_size: int = DEFAULT_EVAL_BATCH_SIZE) -> list[Batch]:
    """Fixed, non-overlapping ``seq_len``-token windows of ``text`` (default: the embedded corpus' eval
    split, disjoint from calibration), batched: ``input_ids``/``attention_mask`` ``[B, seq_len]`` int64."""
    wins = text_windows(corpus_text("eval") if text is None else text, tokenizer, seq_len, max_windows)
    if not wins:
        raise ValueError("eval text: expected at least one token, got an empty text")
    out = []
    for i in range(0, len(wins), batch_size):
        chunk = wins[i: i + batch_size]
        t = min(w.numel() for w in chunk)
        ids = torch.stack([w[:t] for w in chunk])
        out.append(Batch(ids, torch.ones_like(ids)))
    return out


def is_causal_lm(model: nn.Module) -> bool:
    """True for models with a language-modelling head (``*ForCausalLM``)."""
    return hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None and \
        type(model).__name__.endswith("ForCausalLM")


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


class _SqnrProbe:
    """Forward hooks on the FP8Linear modules of a quantized model: accumulate ``sum y_ref^2`` and
    ``sum (y - y_ref)^2`` where ``y_ref`` is the reference Linear applied to the same input (fp32)."""

    def __init__(self, model: nn.Module, reference: nn.Module):
        ref_mods = dict(reference.named_modules())
        self.sig: dict[str, float] = {}
        self.noise: dict[str, float] = {}
        self.handles = []
        for name, mod in model.named_modules():
            if isinstance(mod, FP8Linear) and isinstance(ref_mods.get(name), nn.Linear):
                self.handles.append(mod.register_forward_hook(self._hook(name, ref_mods[name])))

    def _hook(self, name, ref: nn.Linear):
        def hook(_m, args, out):
            # fp32 reference: its own error (~1e-7 relative) is far below FP8's (~3e-2); sums in fp64
            x = args[0].float()
            y_ref = F.linear(x, ref.weight.float(), None if ref.bias is None else ref.bias.float())
            self.sig[name] = self.sig.get(name, 0.0) + float(y_ref.square().sum(dtype=torch.float64))
            self.noise[name] = self.noise.get(name, 0.0) + float(torch.sub(out.float(), y_ref).square_().sum(dtype=torch.float64))

        return hook

    def remove(self) -> dict[str, float]:
        for h in self.handles:
            h.remove()
        return {n: 10 * math.log10(self.sig[n] / self.noise[n]) if self.noise[n] > 0 else math.inf for n in self.sig}


def evaluate_models(
    models: dict[str, nn.Module],
    reference: str,
    batches: Sequence[Batch],
    *,
    progress: bool = True,
    sqnr_batches: int = SQNR_BATCHES,
) -> dict[str, EvalResult]:
    """Evaluate several models against ``models[reference]`` on the same ``batches``, in lockstep.

    Args:
        models: name -> model (all causal LMs, or all encoders); one of them is the reference.
        reference: the name of the unquantized model.
        batches: from :func:`eval_batches` (causal LMs: every position is a real token) or any
            :class:`Batch` es (encoders; padding excluded from pooling).
        sqnr_batches: how many batches feed the per-layer SQNR of quantized models.

    Returns:
        name -> :class:`EvalResult`. Causal LMs: ``perplexity`` (exp of the mean next-token NLL),
        ``top1_agreement`` and ``kl`` (mean ``KL(reference || model)`` per predicted token, nats).
        Encoders: ``embedding_cosine`` (mean over sentences). ``layer_sqnr_db`` for quantized models.
    """
    from tqdm.auto import tqdm

    if reference not in models:
        raise ValueError(f"reference: expected one of {list(models)}, got {reference!r}")
    ref_model = models[reference]
    causal = is_causal_lm(ref_model)
    res = {n: EvalResult(n) for n in models}
    nll = {n: 0.0 for n in models}
    agree = {n: 0 for n in models}
    kl = {n: 0.0 for n in models}
    cos = {n: 0.0 for n in models}
    count, sentences = 0, 0
    order = [reference] + [n for n in models if n != reference]
    # weight_cache: CPU runs reuse each model's dequantized FP8 weights across batches (bitwise the same)
    with torch.inference_mode(), weight_cache():
        for bi, b in enumerate(tqdm(batches, desc="evaluating", unit="batch", disable=not progress)):
            ref_out = ref_top = None
            for n in order:
                m = models[n]
                probe = _SqnrProbe(m, ref_model) if n != reference and bi < sqnr_batches else None
                dev = next(m.parameters()).device
                out = m(input_ids=b.input_ids.to(dev), attention_mask=b.attention_mask.to(dev))
                if probe is not None:
                    for k, v in probe.remove().items():
                        res[n].layer_sqnr_db.setdefault(k, [])
                        res[n].layer_sqnr_db[k].append(v)
                if causal:
                    # [B, T, vocab] logits are the largest tensors here (400 MB for SmolLM2 at 4 x 512):
                    # at most the reference's log-probs, one model's logits and its log-probs are alive
                    logits = out.logits[:, :-1]
                    del out
                    logp = torch.log_softmax(logits.float(), dim=-1).cpu()
                    del logits
                    tgt = b.input_ids[:, 1:]
                    tok_logp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # [B, T-1]
                    nll[n] -= float(tok_logp.sum())
                    res[n].window_nll.extend((-tok_logp.double().mean(-1)).tolist())
                    if ref_out is None:
                        ref_out, ref_top = logp, logp.argmax(-1)
                    else:
                        agree[n] += int((logp.argmax(-1) == ref_top).sum())
                        kl[n] += _kl_sum(ref_out, logp)
                    del logp
                else:
                    emb = _mean_pool(out.last_hidden_state.float().cpu(), b.attention_mask)
                    if ref_out is None:
                        ref_out = emb
                    cos[n] += float(F.cosine_similarity(emb.double(), ref_out.double(), dim=-1).sum())
            count += b.input_ids[:, 1:].numel()
            sentences += b.input_ids.shape[0]
    for n, r in res.items():
        r.layer_sqnr_db = {k: _combine_db(v) for k, v in r.layer_sqnr_db.items()}
        if causal:
            r.tokens = count
            r.nll = nll[n] / count
            r.perplexity = math.exp(r.nll)
            r.top1_agreement = 1.0 if n == reference else agree[n] / count
            r.kl = 0.0 if n == reference else kl[n] / count
        else:
            r.tokens = sentences
            r.embedding_cosine = cos[n] / sentences
    return res


def _kl_sum(ref_logp: torch.Tensor, logp: torch.Tensor) -> float:
    """``sum exp(ref) * (ref - logp)`` over ``[B, T, vocab]`` log-probs (``KL(ref || model)`` summed over
    positions), one batch row at a time: two row-sized temporaries instead of batch-sized ones."""
    return sum(float(torch.sub(r, q).mul_(r.exp()).sum()) for r, q in zip(ref_logp, logp))


def paired_delta_se(model: EvalResult, base: EvalResult) -> float | None:
    """Standard error (nats) of the mean per-window NLL difference ``model - base``.

    Both results must come from the same eval windows (one :func:`evaluate_models` call). With equal
    windows, ``perplexity(model) / perplexity(base) = exp(mean difference)``, so ``100 * ratio * SE``
    is the standard error of the "ppl vs base %" column. ``None`` with fewer than 2 windows.
    """
    d = [m - b for m, b in zip(model.window_nll, base.window_nll)]
    if len(d) < 2 or len(model.window_nll) != len(base.window_nll):
        return None
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return math.sqrt(var / len(d))


def _combine_db(values: list[float]) -> float:
    """Mean of per-batch SQNRs in dB (batches are equal-sized windows)."""
    return sum(values) / len(values)
