"""compare_schemes after the speed work: one shared weight pass and in-place quantize-save-restore
(no model copies) give the same table as in-memory copies, and leave the model as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, compare_schemes

SCHEMES = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]


def test_save_reload_in_place_matches_copies_and_restores_model(tiny_llama, tmp_path):
    g = torch.Generator().manual_seed(2)
    calib = [torch.randint(0, 64, (48,), generator=g) for _ in range(16)]
    evald = [torch.randint(0, 64, (32,), generator=g) for _ in range(8)]
    x = torch.stack(evald[:2])
    with torch.inference_mode():
        before = tiny_llama(input_ids=x).logits
    params = {n: p.detach().clone() for n, p in tiny_llama.named_parameters()}
    kw = dict(eval_data=evald, schemes=SCHEMES, calib_data=calib, max_samples=16, seq_len=48, eval_windows=2,
              eval_seq_len=32, progress=False)
    reloaded = compare_schemes(tiny_llama, save_reload=True, checkpoint_dir=tmp_path, **kw)
    in_memory = compare_schemes(tiny_llama, save_reload=False, **kw)
    # the model is back: its own Linear modules, parameters and outputs
    assert not any(isinstance(m, FP8Linear) for m in tiny_llama.modules())
    assert sum(isinstance(m, nn.Linear) for m in tiny_llama.modules()) == 15  # 2 layers x 7 + lm_head
    for n, p in tiny_llama.named_parameters():
        assert torch.equal(p, params[n]), n
    with torch.inference_mode():
        assert torch.equal(tiny_llama(input_ids=x).logits, before)
    # a saved and reloaded checkpoint evaluates exactly as the in-memory model it came from
    assert [r["scheme"] for r in reloaded.rows] == [r["scheme"] for r in in_memory.rows]
    for a, b in zip(reloaded.rows, in_memory.rows):
        for k in ("perplexity", "kl", "top1_agreement", "mean_sqnr_db"):
            assert a[k] == b[k], (a["scheme"], k)
    assert all((tmp_path / s / "config.json").is_file() for s in SCHEMES)


def test_bf16_calibration_forwards_leave_model_and_match_fp32(tiny_llama):
    from fp8_linear.calibration import calibrate, select_linears
    from fp8_linear.calibration.data import materialize_batches

    g = torch.Generator().manual_seed(5)
    batches = materialize_batches([torch.randint(0, 64, (40,), generator=g) for _ in range(8)], seq_len=40, batch_size=4)
    targets = select_linears(tiny_llama)
    ref = calibrate(tiny_llama, targets, batches, progress=False, histogram=False, hessian=True)
    got = calibrate(tiny_llama, targets, batches, progress=False, histogram=False, hessian=True, dtype=torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in tiny_llama.parameters())
    assert all(not m._forward_pre_hooks for m in tiny_llama.modules())
    for n in targets:
        assert got[n].count == ref[n].count
        assert got[n].max == pytest.approx(ref[n].max, rel=0.05)  # bf16 forwards: ~1% apart
        assert got[n].hessian.h.dtype == torch.float64
        rel = float((got[n].hessian.h - ref[n].hessian.h).norm() / ref[n].hessian.h.norm())
        assert rel < 0.05, (n, rel)
