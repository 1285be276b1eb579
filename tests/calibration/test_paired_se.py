"""The standard error of "ppl vs base %": per-window NLLs, paired with the baseline's windows."""

from __future__ import annotations

import math

import torch

from fp8_linear import compare_schemes
from fp8_linear.calibration.evaluate import EvalResult, evaluate_models, paired_delta_se


def test_paired_se_known_answer():
    base = EvalResult("base", window_nll=[2.0, 2.0, 2.0, 2.0])
    model = EvalResult("m", window_nll=[3.0, 4.0, 5.0, 6.0])  # differences 1, 2, 3, 4
    # sample variance of (1, 2, 3, 4) is 5/3; SE of the mean = sqrt(5/3 / 4)
    assert math.isclose(paired_delta_se(model, base), math.sqrt(5 / 12), rel_tol=1e-12)


def test_paired_se_undefined_cases():
    assert paired_delta_se(EvalResult("m", window_nll=[1.0]), EvalResult("b", window_nll=[0.5])) is None
    assert paired_delta_se(EvalResult("m", window_nll=[1.0, 2.0]), EvalResult("b", window_nll=[0.5])) is None
    same = EvalResult("m", window_nll=[1.0, 1.5, 2.0])
    assert paired_delta_se(same, same) == 0.0


def test_window_nll_averages_to_the_perplexity(tiny_llama):
    """Equal windows: the mean of the per-window NLLs is the run's NLL, and exp of it the perplexity."""
    from fp8_linear.calibration.data import Batch

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (6, 24), generator=g)
    batches = [Batch(ids[:3], torch.ones_like(ids[:3])), Batch(ids[3:], torch.ones_like(ids[3:]))]
    res = evaluate_models({"base": tiny_llama}, "base", batches, progress=False)["base"]
    assert len(res.window_nll) == 6
    assert math.isclose(sum(res.window_nll) / 6, res.nll, rel_tol=1e-6)
    assert math.isclose(math.exp(res.nll), res.perplexity, rel_tol=1e-12)


def test_compare_table_reports_the_se_column(tiny_llama):
    g = torch.Generator().manual_seed(3)
    calib = [torch.randint(0, 64, (48,), generator=g) for _ in range(8)]
    evald = [torch.randint(0, 64, (32,), generator=g) for _ in range(8)]
    table = compare_schemes(tiny_llama, eval_data=evald, schemes=["fp8-tensor"], calib_data=calib, max_samples=8,
                            seq_len=48, eval_windows=4, eval_seq_len=32, progress=False, save_reload=False)
    base, row = table.rows
    assert "ppl_delta_se_pct" not in base or base["ppl_delta_se_pct"] is None
    assert row["ppl_delta_se_pct"] > 0 and math.isfinite(row["ppl_delta_se_pct"])
    assert "+- SE %" in table.to_markdown()
