"""quantize_fp8 / dequantize_fp8 against the numerics contract (docs/design.md section 2)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8_linear import dequantize_fp8, fmt_max, quantize_fp8
from fp8_linear.formats import FORMATS, MIN_SCALE

FMTS = list(FORMATS)
DRAWS = 100_000
STD_ERRORS = 3.0
#: Seed of the statistical tests (their bar is probabilistic, so their draws are fixed).
STAT_SEED = 20251129


def _all_finite_values(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of the FP8 ``dtype``, sorted, as fp32 (from all 256 bit patterns)."""
    v = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return torch.unique(v[torch.isfinite(v)])


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16])
def test_nearest_matches_torch_cast_bit_for_bit(fmt, src):
    dtype = FORMATS[fmt]
    m = fmt_max(dtype)
    grid = _all_finite_values(dtype)
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties: round-half-to-even decides
    rand = (torch.rand(50_000) * 2 - 1) * m
    tiny = torch.randn(10_000) * torch.finfo(dtype).smallest_normal  # subnormal range
    x = torch.cat([grid, mids, rand, tiny]).to(src)
    x = x[x.abs() <= m]  # values inside the range (a bf16/fp16 cast may round a value past max)
    q, s = quantize_fp8(x, fmt, scale=torch.ones(1))
    assert s.item() == 1.0
    assert torch.equal(_bits(q), _bits(x.to(dtype)))


@pytest.mark.parametrize("fmt", FMTS)
def test_grid_values_round_trip_exactly(fmt):
    dtype = FORMATS[fmt]
    grid = _all_finite_values(dtype)
    scale = torch.tensor([0.037])
    q, _ = quantize_fp8(grid * 0.037, fmt, scale=scale)
    back = dequantize_fp8(q, scale)
    assert torch.equal(q.float(), grid)  # x/scale lands back on the grid (fp32 division rounding <= 0.5 ulp fp32)
    assert torch.allclose(back, grid * 0.037, rtol=2 ** -22, atol=0)


@pytest.mark.parametrize("fmt", FMTS)
def test_saturates_at_format_max(fmt):
    dtype = FORMATS[fmt]
    m = fmt_max(dtype)
    x = torch.tensor([m * 1.01, -m * 5, 1e30, -1e30, float("inf"), float("-inf"), m, -m])
    q, _ = quantize_fp8(x, fmt, scale=torch.ones(1))
    assert q.float().tolist() == [m, -m, m, -m, m, -m, m, -m]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("granularity", ["tensor", "token", "group"])
def test_nan_stays_nan_and_does_not_poison_scale(fmt, granularity):
    x = torch.randn(4, 300)
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    q, s = quantize_fp8(x, fmt, granularity)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert torch.isnan(q[1, 7].float())
    assert q[2, 9].float().item() == fmt_max(FORMATS[fmt])
    finite = torch.isfinite(x)
    assert torch.isfinite(q.float()[finite]).all()


@pytest.mark.parametrize(
    "granularity,zero_cell",
    [("tensor", None), ("channel", (3, 0)), ("token", (3, 0)), ("group", (3, 1)), ("group", (5, 0)), ("block", (0, 0))],
)
def test_all_zero_cell_gets_small_positive_scale(granularity, zero_cell):
    x = torch.randn(130, 260) + 0.5
    x[3] = 0  # an all-zero channel / token
    x[:, :128] = 0 if granularity == "group" else x[:, :128]  # an all-zero 1x128 group in every row
    x[:128, :128] = 0 if granularity == "block" else x[:128, :128]  # an all-zero 128x128 block
    if zero_cell is None:
        x = torch.zeros_like(x)
    q, s = quantize_fp8(x, "e4m3", granularity)
    assert torch.isfinite(s).all() and (s > 0).all()
    cell = s.flatten()[0] if zero_cell is None else s[zero_cell]
    assert cell.item() == pytest.approx(MIN_SCALE)
    assert torch.equal(q.float()[x == 0], torch.zeros(int((x == 0).sum())))


@pytest.mark.parametrize(
    "granularity,shape,expected",
    [
        ("tensor", (5, 300), (1,)),
        ("channel", (72, 48), (72, 1)),
        ("token", (2, 3, 300), (2, 3, 1)),
        ("group", (7, 300), (7, 3)),
        ("group", (7, 128), (7, 1)),
        ("block", (300, 129), (3, 2)),
    ],
)
def test_scale_shapes_and_amax_semantics(granularity, shape, expected):
    x = torch.randn(shape) * 3
    q, s = quantize_fp8(x, "e4m3", granularity)
    assert tuple(s.shape) == expected and s.dtype == torch.float32
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    # The element with the largest magnitude in each cell maps onto +-fmt_max.
    assert q.float().abs().max().item() == fmt_max(torch.float8_e4m3fn)
    assert math.isclose(s.max().item(), x.abs().max().item() / 448, rel_tol=1e-6)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("value", [0.3, -0.3, 1.1e-2, 300.0, -400.0, 3e-3])
def test_stochastic_rounding_is_unbiased(fmt, value):
    dtype = FORMATS[fmt]
    x = torch.full((DRAWS,), value)
    # A fixed seed: a 3-standard-error bar fails 0.3 % of fresh draws, which CI must not see.
    g = torch.Generator().manual_seed(STAT_SEED)
    q, _ = quantize_fp8(x, fmt, scale=torch.ones(1), rounding="stochastic", generator=g)
    qf = q.double()
    lo, hi = qf.min().item(), qf.max().item()
    grid = _all_finite_values(dtype).double()
    below, above = grid[grid <= value].max().item(), grid[grid >= value].min().item()
    assert (lo, hi) == (below, above), "stochastic rounding must pick one of the two neighbours"
    err = qf - value
    sem = err.std().item() / math.sqrt(DRAWS)
    assert abs(err.mean().item()) <= STD_ERRORS * sem


def test_stochastic_rounding_unbiased_over_random_values():
    x = torch.randn(DRAWS, generator=torch.Generator().manual_seed(STAT_SEED + 1)) * 10
    g = torch.Generator().manual_seed(STAT_SEED)
    q, s = quantize_fp8(x, "e4m3", scale=torch.tensor([0.05]), rounding="stochastic", generator=g)
    err = dequantize_fp8(q, s).double() - x.double()
    assert abs(err.mean().item()) <= STD_ERRORS * err.std().item() / math.sqrt(DRAWS)


@pytest.mark.parametrize("fmt", FMTS)
def test_stochastic_rounding_seeded_deterministic(fmt):
    x = torch.randn(64, 256)
    runs = [
        quantize_fp8(x, fmt, "token", rounding="stochastic", generator=torch.Generator().manual_seed(seed))[0]
        for seed in (7, 7, 8)
    ]
    assert torch.equal(_bits(runs[0]), _bits(runs[1]))
    assert not torch.equal(_bits(runs[0]), _bits(runs[2]))


def test_stochastic_rounding_keeps_grid_values_and_nan():
    grid = _all_finite_values(torch.float8_e4m3fn)
    x = torch.cat([grid, torch.tensor([float("nan"), 1e9])])
    q, _ = quantize_fp8(x, "e4m3", scale=torch.ones(1), rounding="stochastic", generator=torch.Generator().manual_seed(0))
    assert torch.equal(q.float()[:-2], grid)
    assert torch.isnan(q[-2].float()) and q[-1].float().item() == 448.0
