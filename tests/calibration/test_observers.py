"""Observers on synthetic tensors with known answers, against independent fp64 references."""

from __future__ import annotations

import pytest
import torch

from fp8_linear.calibration.observers import (
    HIST_BINS_PER_OCTAVE,
    ActivationObserver,
    mse_ratio_grid,
    mse_weight_amax,
    percentile_weight_amax,
    weight_scale,
)
from fp8_linear.errors import CalibrationError

FP8 = torch.float8_e4m3fn
FMAX = float(torch.finfo(FP8).max)
HIST_REL_TOL = 2 ** (1 / HIST_BINS_PER_OCTAVE) - 1


def _student_t(shape, g, df):
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    chi = torch.randn((*shape, int(df)), generator=g, dtype=torch.float64).square().sum(-1)
    return (z / torch.sqrt(chi / df)).float() * 0.02


def _fp64_err(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Squared quantize-dequantize error per row (independent of the package: plain casts, fp64)."""
    s = (amax.double() / FMAX).clamp(min=1e-12)
    q = (x.double() / s).clamp(-FMAX, FMAX).float().to(FP8).double() * s
    return (q - x.double()).square().sum(dim=-1)


@pytest.mark.parametrize("gran", ["tensor", "channel"])
def test_minmax_is_amax(gran):
    w = torch.randn(37, 53, generator=torch.Generator().manual_seed(0))
    s = weight_scale(w, gran, "e4m3", "minmax")
    ref = w.abs().amax() if gran == "tensor" else w.abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(s * FMAX, ref.reshape(s.shape), rtol=1e-6, atol=0)


@pytest.mark.parametrize("q", [50.0, 99.0, 99.9])
def test_weight_percentile_matches_torch_quantile(q):
    w = _student_t((16, 300), torch.Generator().manual_seed(1), 3.0)
    got = percentile_weight_amax(w, "channel", q)
    ref = torch.quantile(w.abs().double(), q / 100, dim=1, keepdim=True)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=0)
    got_t = percentile_weight_amax(w, "tensor", q)
    torch.testing.assert_close(got_t.double(), torch.quantile(w.abs().double().flatten(), q / 100).reshape(1), rtol=1e-6, atol=0)


@pytest.mark.parametrize("gran", ["channel", "tensor"])
def test_mse_weight_search_finds_brute_force_ratio(gran):
    w = _student_t((24, 256), torch.Generator().manual_seed(2), 3.0)
    rows = w if gran == "channel" else w.reshape(1, -1)
    base = rows.abs().amax(dim=1, keepdim=True)
    errs = torch.stack([_fp64_err(rows, base * r) for r in mse_ratio_grid().tolist()])  # [R, rows]
    best = base.squeeze(1) * mse_ratio_grid()[errs.argmin(dim=0)].float()
    got = mse_weight_amax(w, gran).flatten()
    torch.testing.assert_close(got, best, rtol=1e-6, atol=0)
    assert (_fp64_err(rows, got.reshape(-1, 1)) <= _fp64_err(rows, base) * (1 + 1e-12)).all()
    assert (got < base.flatten()).any(), "heavy tails: clipping should pay on some cell"


def test_mse_block_weights_never_worse_than_minmax():
    w = _student_t((200, 300), torch.Generator().manual_seed(3), 3.0)
    s_mse, s_mm = weight_scale(w, "block", observer="mse"), weight_scale(w, "block", observer="minmax")
    assert s_mse.shape == (2, 3) and (s_mse <= s_mm).all()


def test_activation_minmax_exact_and_streaming():
    g = torch.Generator().manual_seed(4)
    chunks = [torch.randn(50, 64, generator=g) * (i + 1) for i in range(3)]
    obs = ActivationObserver("x")
    for c in chunks:
        obs.update(c)
    allx = torch.cat(chunks)
    assert obs.amax("minmax") == float(allx.abs().max())
    assert obs.count == allx.numel()


@pytest.mark.parametrize("q", [90.0, 99.0, 99.99])
def test_activation_percentile_matches_torch_quantile(q):
    x = _student_t((4000, 32), torch.Generator().manual_seed(5), 4.0)
    obs = ActivationObserver("x")
    for c in x.split(1000):
        obs.update(c)
    a = x.abs().double().flatten()
    ref = float(torch.quantile(a, q / 100))
    # the histogram answer lies within one bin of the order statistics torch.quantile interpolates
    srt = a.sort().values
    pos = q / 100 * (a.numel() - 1)
    lo, hi = float(srt[int(pos)]), float(srt[min(int(pos) + 1, a.numel() - 1)])
    got = obs.percentile(q)
    assert lo / (1 + HIST_REL_TOL) <= got <= hi * (1 + HIST_REL_TOL), (got, ref, lo, hi)
    if hi - lo < HIST_REL_TOL * lo:  # dense part of the distribution: matches torch.quantile to a bin
        assert got == pytest.approx(ref, rel=HIST_REL_TOL)


def test_activation_mse_close_to_brute_force_on_raw_data():
    x = _student_t((8000, 16), torch.Generator().manual_seed(6), 2.0).flatten()
    obs = ActivationObserver("x")
    obs.update(x)
    base = x.abs().max()
    errs = torch.stack([_fp64_err(x, base * r) for r in mse_ratio_grid().tolist()])
    got_err = _fp64_err(x, torch.tensor(obs.amax("mse")))
    assert float(got_err) <= float(errs.min()) * 1.02
    assert float(got_err) < float(errs[0])  # better than min-max on heavy tails


def test_activation_observer_rejects_nan():
    obs = ActivationObserver("model.layers.3.mlp.down_proj")
    with pytest.raises(CalibrationError, match="down_proj"):
        obs.update(torch.tensor([1.0, float("inf")]))


def test_unknown_observer():
    with pytest.raises(ValueError, match="observer"):
        weight_scale(torch.ones(2, 2), "tensor", observer="bogus")


def _rel_row_err(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Relative squared quantize-dequantize error per row, fp64, plain casts (independent reference)."""
    s = scale.double().expand(w.shape[0], 1)
    q = (w.double() / s).clamp(-FMAX, FMAX).float().to(FP8).double() * s
    return (q - w.double()).square().sum(1) / w.double().square().sum(1)


def test_fp8_channel_scales_pay_only_below_the_normal_range():
    """Why fp8-channel barely beats fp8-tensor (docs/performance.md, Accuracy): e4m3 is a float format, so its
    relative error does not depend on the scale while values stay in the normal range; per-channel
    scales only help rows that per-tensor scaling pushes into subnormals (amax ratio > 2**8 here)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 512, generator=g, dtype=torch.float64).float()
    row_gain = torch.exp2(torch.linspace(0, -16, 64)).reshape(-1, 1)  # rows spread over 16 octaves
    w = w * row_gain
    tensor = _rel_row_err(w, weight_scale(w, "tensor", "e4m3", "minmax"))
    channel = _rel_row_err(w, weight_scale(w, "channel", "e4m3", "minmax"))
    near = row_gain.flatten() >= 2 ** -8   # amax within 8 octaves of the tensor's: same relative error
    far = row_gain.flatten() <= 2 ** -14   # deep below: per-tensor rounds into subnormals
    ratio = channel[near] / tensor[near]
    assert 0.9 < float(ratio.mean()) < 1.1       # on average a tie ...
    assert (ratio > 1).any() and (ratio < 1).any()  # ... and row by row either one wins (grid alignment)
    assert (channel[far] * 5 < tensor[far]).all()
    assert channel.max() < 2e-3  # ~e4m3's 2**-4 relative step squared / 3 for every channel-scaled row
