"""Greedy tokens of a compiled ``generate`` against eager's, and how far apart the two runs' logits are.

:class:`FirstScores` (a logits processor that changes nothing) keeps the raw logits of the first
:data:`COMPARED_TOKENS` steps on the host, and :func:`compare_greedy` compares a compiled run's tokens
with eager's: rows identical for all compared tokens, and for the others where they diverge and by how
much the two logit vectors differ there (in units of the logits' standard deviation). On random weights
the logits are near-flat, so greedy tokens flip wherever the eager top-2 margin is below the
compiled-vs-eager difference (a near-tie); BF16's own row says how often that happens.
"""

from __future__ import annotations

import torch

#: Greedy tokens compared between the compiled and the eager path.
COMPARED_TOKENS = 32


class FirstScores:
    """A logits processor that keeps (on the host, fp32) the raw logits ``[batch, vocab]`` of the first ``n`` steps."""

    def __init__(self, n: int):
        self.n = n
        self.scores: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if len(self.scores) < self.n:
            self.scores.append(scores.detach().float().cpu())
        return scores


def compare_greedy(eager_tokens: torch.Tensor, eager_scores: list[torch.Tensor], tokens: torch.Tensor,
                   scores: list[torch.Tensor]) -> dict:
    """Compiled (``tokens`` ``[b, T]``, ``scores``: T x ``[b, V]``) against eager over the first
    ``n = min(T, len(scores))`` tokens.

    Returns ``rows`` (``"identical/b"``), ``diverged`` (per row that differs: the step, the eager margin
    between its token and the compiled one, and the largest |compiled - eager| logit difference there,
    both over the eager logits' standard deviation) and ``logit_diff`` (the largest such difference
    over every step where the two runs still had the same prefix).
    """
    n = min(eager_tokens.shape[1], tokens.shape[1], len(eager_scores), len(scores))
    e_tok, c_tok = eager_tokens[:, :n], tokens[:, :n]
    same = e_tok == c_tok
    e, c = torch.stack(eager_scores[:n]), torch.stack(scores[:n])  # [n, b, V] fp32
    sd = e.std(dim=-1)
    diff = (c - e).abs().amax(dim=-1) / sd  # [n, b]
    # step p of a row is comparable while the prefix before it is shared: up to and including its first divergence
    first_bad = torch.where(same.all(dim=1), n - 1, (~same).int().argmax(dim=1))  # [b]
    shared = torch.arange(n)[:, None] <= first_bad[None, :]
    diverged = []
    for r in (~same.all(dim=1)).nonzero().flatten().tolist():
        p = int(first_bad[r])
        margin = float(e[p, r, e_tok[r, p]] - e[p, r, c_tok[r, p]]) / float(sd[p, r])
        diverged.append(dict(row=r, step=p, margin=margin, logit_diff=float(diff[p, r])))
    worst = float(diff[shared].max()) if n else 0.0
    return dict(rows=f"{int(same.all(dim=1).sum())}/{e_tok.shape[0]}", tokens=n, diverged=diverged, logit_diff=worst)


def describe_greedy(cmp: dict | None) -> str:
    """One line: identical rows, and where the others diverge (near-ties or not)."""
    if not cmp:
        return "greedy tokens not compared"
    text = f"first {cmp['tokens']} greedy tokens compiled == eager in {cmp['rows']} rows"
    if cmp["diverged"]:
        steps = sorted(d["step"] for d in cmp["diverged"])
        ties = all(d["margin"] <= 2 * d["logit_diff"] for d in cmp["diverged"])
        margin = max(d["margin"] for d in cmp["diverged"])
        text += (f" (the others diverge at steps {steps[:6]}{'...' if len(steps) > 6 else ''}, where eager's margin "
                 f"between the two tokens is <= {margin:.3f} sd: {'near-ties' if ties else 'NOT explained by the logit difference'})")
    return text + f"; max |compiled - eager| logits {cmp['logit_diff']:.3f} sd"
