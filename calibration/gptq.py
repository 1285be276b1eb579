"""GPTQ-style error compensation for FP8 weights (optional; ``quantize_model(..., gptq=True)``).

Rounding each weight to the FP8 grid independently leaves an output error ``(W_q - W) x``. GPTQ
(Frantar et al., 2022) quantizes the input columns one at a time and spreads each column's rounding
error over the columns not yet quantized, weighted by the inverse of ``H = sum x x^T`` (the layer's
input second moment), which minimizes ``||(W_q - W) X||^2`` greedily. The scales stay those of the
scheme (per-tensor, per-channel or 128x128 blocks), so the result is an ordinary FP8 checkpoint.

Memory: one ``[in, in]`` fp64 matrix per distinct layer input (q/k/v share one, gate/up share one).
"""

from __future__ import annotations

import torch

from fp8_linear.formats import SCALE_DTYPE, fmt_max, resolve_format
from fp8_linear.quantize import expand_scale

from .observers import single_thread

#: Relative dampening added to H's diagonal (as in GPTQ), for a well-conditioned inverse.
DAMP = 0.01
#: Columns processed per lazy-update block.
BLOCK = 32
#: Tokens folded into each H: accumulating H costs 2 * in^2 flops per token and layer input, as much
#: as the forward pass itself for SmolLM2; 4096 tokens keep H full-rank for widths up to 4096.
MAX_TOKENS = 4096


class HessianAccumulator:
    """``H = sum x x^T`` (fp64 ``[in, in]``) over at most :data:`MAX_TOKENS` input rows ``x`` ``[tokens, in]``."""

    def __init__(self, in_features: int, max_tokens: int = MAX_TOKENS):
        self.h = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.tokens = 0
        self.max_tokens = max_tokens

    def update(self, x: torch.Tensor) -> None:
        """Fold the rows of ``x`` (``[tokens, in]``) into ``H``, up to ``max_tokens`` in total."""
        room = self.max_tokens - self.tokens
        if room <= 0:
            return
        x = x.reshape(-1, x.shape[-1])[:room].to(torch.float32)
        self.h += (x.t() @ x).double()
        self.tokens += x.shape[0]


def gptq_fp8(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, fmt: str | torch.dtype = "e4m3",
             damp: float = DAMP, block: int = BLOCK) -> torch.Tensor:
    """GPTQ-quantize ``w`` onto the FP8 grid of the fixed ``scale``.

    Args:
        w: weight ``[out, in]`` (any float dtype; computed in fp32). Rows are independent, so the
            weights of several layers that share one input (q/k/v, gate/up) can be stacked.
        h: ``sum x x^T`` of the layer's inputs, ``[in, in]`` (fp64).
        scale: the weight scale: ``[1]``, ``[out, 1]``, 128x128 blocks, or already expanded ``[out, in]``; fp32.
        fmt: FP8 format.
        damp: dampening, as a fraction of the mean diagonal of ``h``.
        block: columns per lazy update.

    Returns:
        fp32 ``[out, in]`` whose every element is ``q * scale`` with ``q`` on the FP8 grid, so that
        quantizing it again with ``scale`` gives ``q`` exactly.
    """
    dtype = resolve_format(fmt)
    m = fmt_max(dtype)
    w = w.detach().to(SCALE_DTYPE).clone()
    n_in = w.shape[1]
    s = (scale if scale.shape == w.shape else expand_scale(scale, w.shape)).to(SCALE_DTYPE).contiguous()
    inv = 1.0 / s
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += torch.eye(n_in, dtype=h.dtype) * (damp * torch.diag(h).mean())
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).to(SCALE_DTYPE)
    out = torch.empty_like(w)
    with single_thread():
        for i0 in range(0, n_in, block):
            i1 = min(i0 + block, n_in)
            wb = w[:, i0:i1].t().contiguous()  # [cols, rows]: each column is a contiguous row here
            eb = torch.empty_like(wb)
            qb = torch.empty_like(wb)
            hb = hinv[i0:i1, i0:i1]
            sb, ib = s[:, i0:i1].t().contiguous(), inv[:, i0:i1].t().contiguous()
            for j in range(i1 - i0):
                col = wb[j]
                q = torch.mul(col, ib[j]).clamp_(-m, m).to(dtype).to(SCALE_DTYPE).mul_(sb[j])
                e = torch.sub(col, q).div_(hb[j, j])
                if j + 1 < i1 - i0:
                    wb[j + 1:].addr_(hb[j, j + 1:], e, alpha=-1.0)
                qb[j] = q
                eb[j] = e
            out[:, i0:i1] = qb.t()
            if i1 < n_in:
                w[:, i1:] -= eb.t() @ hinv[i0:i1, i1:]
    return out
