"""The energy-weighted grid alignment of weight scales (fp8_linear.calibration.scale_align)."""

from __future__ import annotations

import pytest
import torch

from fp8_linear.calibration import scale_align
from fp8_linear.calibration.observers import weight_scale
from fp8_linear.formats import GROUP_SIZE
from fp8_linear.quantize import expand_scale

E4 = torch.float8_e4m3fn


def weighted_error(w: torch.Tensor, scale: torch.Tensor, h_diag: torch.Tensor) -> torch.Tensor:
    """Independent reference, fp64 per output row: sum_k (w - dequant(quant(w)))^2 * h_diag[k], with the
    library's own rounding path (w / scale cast to e4m3)."""
    s = expand_scale(scale.float(), w.shape)
    q = (w.float() / s).clamp(-448, 448).to(E4).float() * s
    return ((w.double() - q.double()) ** 2 * h_diag.double()).sum(1)


def heavy_tailed(k: int, gen: torch.Generator) -> torch.Tensor:
    """Input energies with a few outlier features, as LLM layer inputs have."""
    h = torch.rand(k, generator=gen, dtype=torch.float64) + 0.05
    h[torch.randperm(k, generator=gen)[: max(1, k // 50)]] *= 300.0
    return h


def test_factors_are_one_octave():
    f = scale_align.align_factors(16)
    assert f[0] == 1.0 and len(f) == 16 and all(a < b for a, b in zip(f, f[1:])) and f[-1] < 2.0
    with pytest.raises(ValueError, match="candidates"):
        scale_align.align_factors(0)


def test_finds_what_a_brute_force_scan_finds():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(37, 300, generator=gen) * 0.05
    h = heavy_tailed(300, gen)
    s0 = weight_scale(w, "channel", "e4m3", "minmax")
    got = scale_align.align_weight_scale(w, s0, h, "channel", candidates=16, max_columns=None)
    errs = torch.stack([weighted_error(w, s0 * g, h) for g in scale_align.align_factors(16)], 1)
    best = errs.min(1).values
    assert torch.all(weighted_error(w, got, h) <= best * (1 + 1e-9) + 1e-30)
    assert (best < weighted_error(w, s0, h)).float().mean() > 0.75  # most rows gain from the search


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_never_worse_and_never_clips(granularity):
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(200, 300, generator=gen) * 0.02
    h = heavy_tailed(300, gen)
    s0 = weight_scale(w, granularity, "e4m3", "minmax")
    got = scale_align.align_weight_scale(w, s0, h, granularity)
    assert got.shape == s0.shape and got.dtype == torch.float32
    ratio = got / s0
    assert torch.all(ratio >= 1.0) and torch.all(ratio < 2.0)  # w / got stays within fmt_max: no clipping
    assert weighted_error(w, got, h).sum() <= weighted_error(w, s0, h).sum()
    if granularity == "block":
        assert s0.shape == (-(-200 // GROUP_SIZE), -(-300 // GROUP_SIZE))


def test_the_energy_weights_decide():
    # column 0 meets an input 1000x stronger than the others; its weight lies exactly on the grid of
    # scale 2^(5/16) (13 is an e4m3 value), nowhere near a grid point of scale 1
    g_star = 2.0 ** (5 / 16)
    gen = torch.Generator().manual_seed(7)
    w = torch.rand(1, 64, generator=gen) * 0.5
    w[0, 0] = 13.0 * g_star
    w[0, 1] = 400.0  # the row's max stays below 448: scale 1 does not clip
    h = torch.ones(64, dtype=torch.float64)
    h[0] = 1000.0
    one = torch.ones(1, 1)
    got = scale_align.align_weight_scale(w, one, h, "channel", candidates=16, max_columns=None)
    assert got.item() == pytest.approx(g_star, rel=1e-6)


def test_one_candidate_and_subset_of_columns():
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(16, 1000, generator=gen)
    h = heavy_tailed(1000, gen)
    s0 = weight_scale(w, "channel", "e4m3", "minmax")
    assert torch.equal(scale_align.align_weight_scale(w, s0, h, "channel", candidates=1), s0)
    sub = scale_align.align_weight_scale(w, s0, h, "channel", max_columns=64)
    assert torch.all(sub >= s0) and torch.all(sub < 2 * s0)


def test_bad_inputs():
    w = torch.randn(8, 32)
    s0 = weight_scale(w, "channel", "e4m3", "minmax")
    with pytest.raises(ValueError, match="h_diag"):
        scale_align.align_weight_scale(w, s0, torch.ones(31), "channel")
    with pytest.raises(ValueError, match="2-D"):
        scale_align.align_weight_scale(w[0], s0, torch.ones(32), "channel")
    with pytest.raises(ValueError, match="clip"):
        scale_align.align_weight_scale(w, s0 * 0.5, torch.ones(32), "channel")


def test_gptq_recipes_store_aligned_scales(tiny_llama, monkeypatch):
    """With GPTQ, the min-max per-channel weight scales move to their aligned value (within one octave
    above, never clipping), the other granularities keep min-max; off (1 candidate): min-max everywhere."""
    from fp8_linear.calibration import calibrate, select_linears
    from fp8_linear.calibration.data import materialize_batches
    from fp8_linear.calibration.quantize import prepare_weights

    ids = torch.randint(0, 64, (16, 48), generator=torch.Generator().manual_seed(1))
    batches = materialize_batches(list(ids), seq_len=48, max_samples=16, batch_size=4)
    targets = select_linears(tiny_llama)
    obs = calibrate(tiny_llama, targets, batches, progress=False, histogram=False, hessian=True)
    schemes = ["fp8-tensor", "fp8-channel", "fp8-block"]
    on = prepare_weights(targets, schemes, obs, True)
    monkeypatch.setattr(scale_align, "ALIGN_CANDIDATES", 1)
    off = prepare_weights(targets, schemes, obs, True)
    moved = 0
    for key in on:
        for name, s_on in on[key][0].items():
            s_off = off[key][0][name]
            assert s_on.shape == s_off.shape
            assert torch.all(s_on >= s_off) and torch.all(s_on < 2 * s_off)
            if key[0] != "channel":
                assert torch.equal(s_on, s_off)
            moved += int((s_on != s_off).sum())
            w = targets[name].weight.detach()
            assert float((w.abs() / expand_scale(s_on, w.shape)).max()) <= 448.0 * (1 + 1e-6)
    assert moved > 0
