"""Observers: how calibration picks the clipping range (``amax``) that a scale is made from.

Three observers, for weights and for static activation scales (``scale = amax / fmt_max``):

``minmax``      the absolute maximum (the ecosystem default: AutoFP8, llm-compressor ``FP8``).
``percentile``  the ``q``-th percentile of ``|x|`` (clips rare outliers).
``mse``         the clipping value ``r * amax`` (``r`` on a grid in ``[MSE_MIN_RATIO, 1]``) that
                minimizes the squared error of quantize-dequantize; per cell of the granularity.

Weights are observed in one shot (:func:`weight_scale`). Activations stream through
:class:`ActivationObserver`, which keeps only bounded state per layer: an exact running max and a
fixed-size histogram of ``|x|`` on a log2 grid (:data:`HIST_BINS_PER_OCTAVE` bins per octave), never
the activations themselves.
"""

from __future__ import annotations

import contextlib
import math

import torch

from fp8_linear.errors import CalibrationError
from fp8_linear.formats import GROUP_SIZE, SCALE_DTYPE, fmt_max, resolve_format, scale_from_amax
from fp8_linear.quantize import compute_amax, expand_scale, quantize_unchecked, scale_shape

OBSERVERS = ("minmax", "percentile", "mse")

#: Default percentile of ``|x|`` for the ``percentile`` observer (activations and weights).
DEFAULT_PERCENTILE = 99.99
#: Smallest clipping ratio the MSE search tries (``r * amax`` with ``r`` in ``[MSE_MIN_RATIO, 1]``).
#: On SmolLM2-135M the per-channel optimum lies in [0.89, 1.0] for every layer; FP8's relative
#: precision makes deeper clipping pay only for very heavy tails.
MSE_MIN_RATIO = 0.86
#: Number of ratios on the MSE search grid (evenly spaced, 1.0 included).
MSE_GRID_POINTS = 8
#: The MSE search of per-channel / per-tensor weights looks at every k-th column so that at most this
#: many columns are scored (the error estimate stays unbiased; the search is ~in/256 times cheaper).
MSE_MAX_COLUMNS = 256
#: Activation histogram: log2 range of ``|x|`` covered and resolution.
HIST_MIN_EXP, HIST_MAX_EXP = -40, 24
HIST_BINS_PER_OCTAVE = 256
HIST_BINS = (HIST_MAX_EXP - HIST_MIN_EXP) * HIST_BINS_PER_OCTAVE

_WEIGHT_GRANULARITIES = ("tensor", "channel", "block")


@contextlib.contextmanager
def single_thread():
    """Run a block with one intra-op torch thread (the searches here are many mid-sized ops, which on
    a shared 2-core CPU run several times faster without thread hand-offs); restores the count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def mse_ratio_grid(points: int = MSE_GRID_POINTS, min_ratio: float = MSE_MIN_RATIO) -> torch.Tensor:
    """The clipping ratios the MSE search tries: fp64 ``[points]``, descending from 1.0 to ``min_ratio``."""
    if points < 1:
        raise ValueError(f"points: expected >= 1, got {points}")
    if not 0.0 < min_ratio <= 1.0:
        raise ValueError(f"min_ratio: expected a value in (0, 1], got {min_ratio}")
    return torch.linspace(1.0, min_ratio, points, dtype=torch.float64)


def _check_observer(observer: str, name: str = "observer") -> None:
    if observer not in OBSERVERS:
        raise ValueError(f"{name}: expected one of {OBSERVERS}, got {observer!r}")


def cell_reduce(err: torch.Tensor, granularity: str) -> torch.Tensor:
    """Sum a per-element error ``[out, in]`` over each scale cell -> shaped like the scale."""
    if granularity == "tensor":
        return err.sum(dtype=torch.float64).reshape(1)
    if granularity == "channel":
        return err.sum(dim=1, keepdim=True, dtype=torch.float64)
    # block: pad to multiples of 128 with zeros (zeros add no error) and sum each 128x128 block
    rows, cols = scale_shape(err.shape, "block")
    padded = torch.zeros(rows * GROUP_SIZE, cols * GROUP_SIZE, dtype=err.dtype, device=err.device)
    padded[: err.shape[0], : err.shape[1]] = err
    return padded.reshape(rows, GROUP_SIZE, cols, GROUP_SIZE).sum(dim=(1, 3), dtype=torch.float64)


def mse_weight_amax(
    w: torch.Tensor, granularity: str, fmt: str | torch.dtype = "e4m3", ratios: torch.Tensor | None = None
) -> torch.Tensor:
    """The clipping amax minimizing ``||dequant(quant(w)) - w||^2`` in each scale cell.

    Args:
        w: weight ``[out, in]``, any float dtype (computed in fp32).
        granularity: ``"tensor"`` (result ``[1]``), ``"channel"`` (``[out, 1]``) or ``"block"``
            (``[ceil(out/128), ceil(in/128)]``).
        fmt: FP8 format.
        ratios: candidate ratios of the cell's amax (default :func:`mse_ratio_grid`); ties go to
            the first (largest) ratio. Tensor and channel cells wider than :data:`MSE_MAX_COLUMNS`
            are scored on a strided subset of their columns (the amax itself is exact).

    Returns:
        fp32 amax of the scale's shape (``ratio * amax`` of the best ratio per cell).
    """
    dtype = resolve_format(fmt)
    w = w.detach().to(SCALE_DTYPE)
    amax = compute_amax(w, granularity)
    if granularity in ("tensor", "channel") and w.shape[1] > MSE_MAX_COLUMNS:
        w = w[:, :: -(-w.shape[1] // MSE_MAX_COLUMNS)]  # score a strided subset of columns
    with single_thread():
        return _mse_search(w, amax, granularity, dtype, ratios)


def _mse_search(w, amax, granularity, dtype, ratios) -> torch.Tensor:
    """Grid search of :func:`mse_weight_amax` on ``w`` for the candidate ``ratio * amax``."""
    grid = mse_ratio_grid() if ratios is None else ratios.to(torch.float64)
    best_err = torch.full_like(amax, math.inf, dtype=torch.float64)
    best_amax = amax.clone()
    m = fmt_max(dtype)
    for r in grid.tolist():
        cand = amax * r
        s = expand_scale(scale_from_amax(cand, dtype), w.shape)
        deq = (w / s).clamp_(-m, m).to(dtype).to(SCALE_DTYPE).mul_(s)
        err = cell_reduce(deq.sub_(w).square_(), granularity)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_amax = torch.where(better, cand, best_amax)
    return best_amax


def percentile_weight_amax(w: torch.Tensor, granularity: str, q: float = DEFAULT_PERCENTILE) -> torch.Tensor:
    """The ``q``-th percentile (0-100, linear interpolation as ``torch.quantile``) of ``|w|`` per cell.

    ``w`` is ``[out, in]``; granularity ``"tensor"`` -> ``[1]``, ``"channel"`` -> ``[out, 1]``.
    """
    if not 0.0 < q <= 100.0:
        raise ValueError(f"q: expected a percentile in (0, 100], got {q}")
    a = w.detach().abs().to(torch.float64)
    if granularity == "tensor":
        return _quantile(a.flatten(), q / 100.0).reshape(1).to(SCALE_DTYPE)
    if granularity == "channel":
        return torch.stack([_quantile(row, q / 100.0) for row in a]).reshape(-1, 1).to(SCALE_DTYPE)
    raise ValueError(f"granularity: the percentile observer supports 'tensor' and 'channel', got {granularity!r}")


def _quantile(flat: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(flat, q)`` (linear interpolation) for any size, via sort (quantile caps at 16M)."""
    s, _ = torch.sort(flat)
    pos = q * (s.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, s.numel() - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def weight_scale(
    w: torch.Tensor, granularity: str, fmt: str | torch.dtype = "e4m3", observer: str = "mse"
) -> torch.Tensor:
    """fp32 weight scale ``amax / fmt_max`` of the granularity's shape, ``amax`` picked by ``observer``.

    ``w``: ``[out, in]``; ``granularity``: ``"tensor"`` / ``"channel"`` / ``"block"`` (block weights
    support ``minmax`` and ``mse``; ``percentile`` falls back to ``minmax`` there).
    """
    _check_observer(observer, "weight_observer")
    if granularity not in _WEIGHT_GRANULARITIES:
        raise ValueError(f"granularity: expected one of {_WEIGHT_GRANULARITIES}, got {granularity!r}")
    if w.dim() != 2:
        raise ValueError(f"w: expected a 2-D weight [out, in], got shape {list(w.shape)}")
    dtype = resolve_format(fmt)
    if observer == "mse":
        amax = mse_weight_amax(w, granularity, dtype)
    elif observer == "percentile" and granularity != "block":
        amax = percentile_weight_amax(w, granularity)
    else:
        amax = compute_amax(w, granularity)
    return scale_from_amax(amax, dtype)


class ActivationObserver:
    """Streaming statistics of one layer's input, in bounded memory.

    ``update(x)`` takes ``x`` of shape ``[tokens, features]`` (padding already removed). It keeps the
    exact running max of ``|x|`` and (``histogram=True``, needed by ``percentile`` and ``mse``) a histogram of ``|x|`` (:data:`HIST_BINS` int64 counts on a log2
    grid from ``2**HIST_MIN_EXP`` to ``2**HIST_MAX_EXP``; smaller magnitudes count in bin 0, exact
    zeros separately). ``amax(observer)`` turns them into a clipping value.
    """

    def __init__(self, name: str = "layer", histogram: bool = True):
        self.name = name
        self.max = 0.0
        self.count = 0
        self.zeros = 0
        self.hist = torch.zeros(HIST_BINS, dtype=torch.int64) if histogram else None

    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of activations ``[..., features]`` into the statistics.

        Raises :class:`CalibrationError` naming the layer if ``x`` holds NaN or inf.
        """
        a = x.detach().abs().float().flatten()
        if a.numel() == 0:
            return
        m = a.max()
        if not torch.isfinite(m):
            raise CalibrationError(
                f"activations of layer {self.name!r}: expected finite values, got NaN/inf "
                f"({int((~torch.isfinite(a)).sum())} of {a.numel()} elements)"
            )
        self.max = max(self.max, float(m))
        self.count += a.numel()
        if self.hist is None:
            return
        nz = a[a > 0]
        self.zeros += a.numel() - nz.numel()
        idx = ((torch.log2(nz) - HIST_MIN_EXP) * HIST_BINS_PER_OCTAVE).floor().clamp_(0, HIST_BINS - 1).long()
        self.hist += torch.bincount(idx, minlength=HIST_BINS)

    def merge(self, other: "ActivationObserver") -> None:
        """Add another observer's statistics (same layer, other data) into this one."""
        self.max = max(self.max, other.max)
        self.count += other.count
        self.zeros += other.zeros
        if self.hist is not None and other.hist is not None:
            self.hist += other.hist
        else:
            self.hist = None

    def _bin_edges(self) -> torch.Tensor:
        e = torch.arange(HIST_BINS + 1, dtype=torch.float64) / HIST_BINS_PER_OCTAVE + HIST_MIN_EXP
        return torch.exp2(e)

    def percentile(self, q: float = DEFAULT_PERCENTILE) -> float:
        """Approximate ``q``-th percentile (0-100) of ``|x|``: interpolated inside the histogram bin
        (relative error below ``2**(1/HIST_BINS_PER_OCTAVE) - 1`` ~ 0.27%), capped at the exact max."""
        if not 0.0 < q <= 100.0:
            raise ValueError(f"q: expected a percentile in (0, 100], got {q}")
        if self.count == 0:
            return 0.0
        target = q / 100.0 * (self.count - 1)
        if target < self.zeros:
            return 0.0
        cum = torch.cumsum(self.hist, 0).double() + self.zeros
        i = int(torch.searchsorted(cum, torch.tensor(target + 1, dtype=torch.float64)).clamp(max=HIST_BINS - 1))
        edges = self._bin_edges()
        before = float(cum[i - 1]) if i > 0 else float(self.zeros)
        frac = (target + 1 - before) / max(float(self.hist[i]), 1.0)
        lo, hi = float(edges[i]), float(edges[i + 1])
        return min(lo * (hi / lo) ** min(max(frac, 0.0), 1.0), self.max)

    def mse_amax(self, fmt: str | torch.dtype = "e4m3", ratios: torch.Tensor | None = None) -> float:
        """The clipping value ``r * max`` minimizing the histogram-weighted squared quantization error
        (each bin represented by its geometric centre; ratios from :func:`mse_ratio_grid`)."""
        if self.count == 0 or self.max == 0.0:
            return self.max
        dtype = resolve_format(fmt)
        edges = self._bin_edges()
        centres = torch.sqrt(edges[:-1] * edges[1:]).clamp(max=self.max)
        keep = self.hist > 0
        c, n = centres[keep].float(), self.hist[keep].double()
        grid = mse_ratio_grid() if ratios is None else ratios.to(torch.float64)
        best, best_err = self.max, math.inf
        for r in grid.tolist():
            s = scale_from_amax(torch.tensor([self.max * r]), dtype)
            deq = quantize_unchecked(c, dtype, s).float() * s
            err = float(((deq - c).double().square() * n).sum())
            if err < best_err:
                best, best_err = self.max * r, err
        return best

    def amax(self, observer: str = "minmax", fmt: str | torch.dtype = "e4m3") -> float:
        """The clipping amax the ``observer`` picks (``minmax``: the exact max)."""
        _check_observer(observer, "activation_observer")
        if observer != "minmax" and self.hist is None:
            raise CalibrationError(
                f"activation_observer: {observer!r} needs the histogram of layer {self.name!r}, "
                "but it was calibrated with histogram=False"
            )
        if observer == "percentile":
            return self.percentile()
        if observer == "mse":
            return self.mse_amax(fmt)
        return self.max

