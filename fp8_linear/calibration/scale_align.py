"""Grid alignment of FP8 weight scales, weighted by the layer's input energy (used with GPTQ).

FP8 is a floating-point grid: multiplying a scale by any factor ``g`` in ``[1, 2)`` keeps the
relative precision and never clips (``amax / (g * scale) <= fmt_max``), but moves every weight to a
different place relative to the grid points, so each weight's rounding error changes. What a layer's
output loses is the rounding error of weight ``w[j, k]`` times the size of input ``k``; LLM inputs
have a few channels with much larger energy (``H[k, k] = sum x_k^2``) than the rest. The search below
picks, per scale cell (the whole tensor, one output channel or one 128 x 128 block), the factor
``g = 2^(i / candidates)`` that minimizes ``sum_k (w[j, k] - q_g(w[j, k]))^2 * H[k, k]`` over the cell,
so that the weights that meet the large inputs land close to grid points; ``g = 1`` (the min-max
scale) is a candidate and wins ties. GPTQ then rounds onto the chosen grid.

Per-channel scales have one free factor per row and gain the most; a per-tensor scale has one for the
whole matrix. Measured on SmolLM2-135M (16 x 512 calibration tokens, GPTQ's own objective
``tr(dW H dW^T) / tr(W H W^T)`` summed over the GPTQ layers): per-channel 0.03193 -> 0.02917 with 16
candidates scored on the 128 highest-energy features (the default; 0.02817 on all features, 0.02728
with 64 candidates), per-tensor 0.03274 -> 0.03241, block 0.03243 -> 0.03132 (all features). The
calibration aligns per-channel scales only (:data:`ALIGN_GRANULARITIES`). The stored scale is simply a
different fp32 number: checkpoints keep their format.
"""

from __future__ import annotations

import torch

from fp8_linear.formats import SCALE_DTYPE, fmt_max, resolve_format
from fp8_linear.quantize import expand_scale

from .observers import cell_reduce

#: Factors tried per scale cell: ``2^(i / ALIGN_CANDIDATES)`` for ``i`` in ``0 .. ALIGN_CANDIDATES - 1``;
#: 1 turns the alignment off.
ALIGN_CANDIDATES = 16
#: Per-tensor and per-channel scales are scored on the ALIGN_MAX_COLUMNS input features of largest
#: energy only: the error of the many low-energy features averages out to about the same value for
#: every factor, so the choice is made by the high-energy ones (and the search is in/128 times cheaper).
ALIGN_MAX_COLUMNS = 128
#: Granularities the calibration aligns (fp8_linear/calibration/quantize.py). Per-channel: GPTQ objective -8.6% on
#: SmolLM2 (16 candidates, 128 features) for about 1 s. Per-tensor (one factor for the whole matrix):
#: -1%. Block (128 x 128 cells): -3.4% when scored on every element, which is slow (with tensor and
#: channel scales also scored on every element, the three recipes' weight pass took 62 s instead of 23 s
#: on a 2-core CPU); scored on every 4th row of each block instead, the choices were noise and the
#: objective got 3.9% worse. So only per-channel scales are aligned.
ALIGN_GRANULARITIES = ("channel",)


def align_factors(candidates: int = ALIGN_CANDIDATES) -> list[float]:
    """The factors the search tries, ascending from 1.0 (one octave: ``2^(i / candidates)``)."""
    if candidates < 1:
        raise ValueError(f"candidates: expected >= 1, got {candidates}")
    return [2.0 ** (i / candidates) for i in range(candidates)]


def align_weight_scale(w: torch.Tensor, scale: torch.Tensor, h_diag: torch.Tensor, granularity: str,
                       fmt: str | torch.dtype = "e4m3", candidates: int | None = None,
                       max_columns: int | None = -1) -> torch.Tensor:
    """``scale`` times the per-cell factor in :func:`align_factors` with the least energy-weighted
    rounding error (see the module docstring).

    Args:
        w: weight ``[out, in]`` (any float dtype; computed in fp32).
        scale: its fp32 scale: ``[1]`` (tensor), ``[out, 1]`` (channel) or ``[ceil(out/128),
            ceil(in/128)]`` (block), with ``|w| / scale <= fmt_max`` (e.g. the min-max scale).
        h_diag: ``[in]`` input energy per input feature (the diagonal of ``H = sum x x^T``), >= 0.
        granularity: ``"tensor"``, ``"channel"`` or ``"block"`` (the shape of ``scale``).
        fmt: FP8 format.
        candidates: number of factors (``None``: :data:`ALIGN_CANDIDATES`, read at call time); 1 returns
            ``scale`` unchanged.
        max_columns: tensor / channel cells are scored on this many highest-energy input features
            (``None``: all; ``-1``: :data:`ALIGN_MAX_COLUMNS`, read at call time); block cells always on
            all of theirs.

    Returns:
        fp32 scale of ``scale``'s shape, each cell ``>= scale`` and ``< 2 * scale``.
    """
    if w.dim() != 2:
        raise ValueError(f"w: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    if h_diag.shape != (w.shape[1],):
        raise ValueError(f"h_diag: expected shape [{w.shape[1]}] (the weight's input width), got {list(h_diag.shape)}")
    candidates = ALIGN_CANDIDATES if candidates is None else candidates
    max_columns = ALIGN_MAX_COLUMNS if max_columns == -1 else max_columns
    dtype = resolve_format(fmt)
    scale = scale.detach().to(SCALE_DTYPE)
    s = expand_scale(scale, w.shape)
    r = w.detach().to(SCALE_DTYPE) / s  # in grid units: |r| <= fmt_max
    if float(r.abs().max()) > fmt_max(dtype) * (1 + 1e-6):
        raise ValueError("scale: the weight exceeds fmt_max * scale (align a scale that does not clip)")
    hd = h_diag.detach().to(w.device, SCALE_DTYPE).clamp_min(0)
    if granularity != "block" and max_columns is not None and r.shape[1] > max_columns:
        top = torch.topk(hd, max_columns, sorted=False).indices
        r, hd = r[:, top], hd[top]
    hd = hd.unsqueeze(0)
    best_err = torch.full(scale.shape, float("inf"), dtype=torch.float64, device=scale.device)
    best = torch.ones_like(scale)
    for g in align_factors(candidates):
        rq = (r / g).to(dtype).to(SCALE_DTYPE).mul_(g)
        # the cell's error in units of its scale^2, which is constant inside a cell: same argmin
        err = cell_reduce(rq.sub_(r).square_().mul_(hd), granularity).reshape(scale.shape)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, g), best)
    return scale * best

