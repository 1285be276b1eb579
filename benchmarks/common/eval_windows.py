"""Evaluation windows and the unquantized reference the calibration benchmarks score against
(``calibration_ablation``, ``mixed_precision_budget``)."""

from __future__ import annotations

import math

import torch

from fp8_linear.calibration.data import Batch, text_windows

#: Tokens per evaluation window.
SEQ_LEN = 512


def spread_windows(text: str, tok, n: int, seq_len: int = SEQ_LEN) -> list[torch.Tensor]:
    """``n`` windows of ``seq_len`` tokens (1-D token-id tensors), evenly spaced over all of ``text``'s windows."""
    wins = text_windows(text, tok, seq_len)
    if len(wins) < n:
        raise ValueError(f"text: expected at least {n} windows of {seq_len} tokens, got {len(wins)}")
    return [wins[(i * len(wins)) // n] for i in range(n)]


def to_batches(wins: list[torch.Tensor], batch_size: int = 4) -> list[Batch]:
    """Windows of equal length stacked ``batch_size`` at a time into :class:`Batch` es ([B, T] ids, mask of ones)."""
    out = []
    for i in range(0, len(wins), batch_size):
        ids = torch.stack(wins[i:i + batch_size])
        out.append(Batch(ids, torch.ones_like(ids)))
    return out


class Reference:
    """The unquantized model's next-token log-probabilities on ``batches`` (kept in fp16: one forward
    of the reference for all variants), and the metrics of a quantized model against them (the same
    definitions as :func:`fp8_linear.calibration.evaluate.evaluate_models`)."""

    def __init__(self, model, batches: list[Batch]):
        self.batches = batches
        self.logp, self.window_nll = [], []
        with torch.inference_mode():
            for b in batches:
                lp = torch.log_softmax(model(input_ids=b.input_ids).logits[:, :-1].float(), -1)
                self.window_nll += (-lp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1).double().mean(-1)).tolist()
                self.logp.append(lp.half())

    def compare(self, q) -> dict:
        from fp8_linear.backends.emulated import weight_cache

        nll, kl, agree, count = [], 0.0, 0, 0
        with torch.inference_mode(), weight_cache():
            for b, ref in zip(self.batches, self.logp):
                lp = torch.log_softmax(q(input_ids=b.input_ids).logits[:, :-1].float(), -1)
                nll += (-lp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1).double().mean(-1)).tolist()
                r = ref.float()
                kl += float(torch.sub(r, lp).mul_(r.exp()).sum())
                agree += int((lp.argmax(-1) == r.argmax(-1)).sum())
                count += lp.shape[0] * lp.shape[1]
        base = self.window_nll
        d = [x - y for x, y in zip(nll, base)]
        mean = sum(d) / len(d)
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
        ppl, base_ppl = math.exp(sum(nll) / len(nll)), math.exp(sum(base) / len(base))
        ratio = ppl / base_ppl
        return {"ppl": ppl, "base_ppl": base_ppl, "ppl_delta_pct": 100 * (ratio - 1), "ppl_delta_se_pct": 100 * ratio * se,
                "kl": kl / count, "top1": agree / count, "window_nll": nll, "base_window_nll": base}
