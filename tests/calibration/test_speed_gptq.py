"""GPTQ after the speed work: the factor of H^-1, the stacked multi-recipe sweep, and the shared
weight pass of compare_schemes, against independent fp64 references."""

from __future__ import annotations

import copy

import pytest
import torch

from fp8_linear import FP8Linear
from fp8_linear.calibration import calibrate, select_linears
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.gptq import (
    DAMP,
    HessianAccumulator,
    column_order_factor,
    gptq_fp8,
    gptq_fp8_many,
    inverse_factor,
)
from fp8_linear.calibration.quantize import apply_quantization, prepare_weights
from fp8_linear.formats import fmt_max
from fp8_linear.quantize import expand_scale

E4M3 = torch.float8_e4m3fn
M = fmt_max(E4M3)


def _problem(n_in=192, rows=96, tokens=1500, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n_in, generator=g) * (torch.rand(n_in, generator=g) * 3 + 0.05)
    x[:, 5] = 0.0  # one dead input
    w = torch.randn(rows, n_in, generator=g) * 0.05
    return x, w


def _hessian(x):
    h = HessianAccumulator(x.shape[1], max_tokens=x.shape[0])
    h.update(x)
    return h


def _rtn(w, s):
    return (w / s).clamp(-M, M).to(E4M3).float() * s


def _out_err(q, w, x) -> float:
    """||(Q - W) X^T||^2 in fp64: what GPTQ minimizes."""
    return float(((q.double() - w.double()) @ x.double().t()).square().sum())


def _gptq_reference(w, h, s, damp=DAMP, act_order=False):
    """Textbook GPTQ (Frantar et al., Alg. 1 without lazy batching) in fp64, one column at a time;
    with ``act_order`` the columns go in order of decreasing ``h[i, i]`` (argsort of the diagonal)."""
    if act_order:
        perm = torch.argsort(torch.diag(h), descending=True, stable=True)
        inv = torch.argsort(perm)
        sx = expand_scale(s, w.shape)
        return _gptq_reference(w[:, perm], h[perm][:, perm], sx[:, perm], damp)[:, inv]
    w = w.double().clone()
    s = (s if s.shape == w.shape else expand_scale(s, w.shape)).double()
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += torch.eye(h.shape[0], dtype=h.dtype) * damp * torch.diag(h).mean()
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    q = torch.empty_like(w)
    for j in range(w.shape[1]):
        q[:, j] = (w[:, j] / s[:, j]).clamp(-M, M).float().to(E4M3).double() * s[:, j]
        e = (w[:, j] - q[:, j]) / u[j, j]
        w[:, j + 1:] -= e[:, None] * u[j, j + 1:][None, :]
    return q.float()


def test_inverse_factor_is_cholesky_of_dampened_inverse():
    x, _ = _problem()
    h = x.double().t() @ x.double()
    u, dead = inverse_factor(h)
    hd = h.clone()
    hd[dead, dead] = 1.0
    hd += torch.eye(h.shape[0], dtype=h.dtype) * DAMP * torch.diag(hd).mean()
    ref = torch.linalg.cholesky(torch.linalg.inv(hd), upper=True)
    assert dead.tolist() == [i == 5 for i in range(h.shape[0])]
    assert torch.equal(u, torch.triu(u)) and bool((torch.diag(u) > 0).all())
    assert float((u.double() - ref).norm() / ref.norm()) < 1e-6


def test_accumulator_memoizes_factor_until_updated():
    x, _ = _problem()
    h = HessianAccumulator(x.shape[1])
    h.update(x[:1000])
    u1, _, perm1 = h.inverse_factor(act_order=True)
    assert h.inverse_factor(act_order=True)[0] is u1
    h.update(x[1000:])
    u2, _, perm2 = h.inverse_factor(act_order=True)
    assert u2 is not u1 and torch.allclose(u2, column_order_factor(h.h, act_order=True)[0])
    assert torch.equal(perm2, torch.argsort(torch.diag(h.h), descending=True, stable=True))
    u3, _, perm3 = h.inverse_factor(act_order=False)  # the natural order: its own factor
    assert perm3 is None and torch.allclose(u3, inverse_factor(h.h)[0])


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_gptq_matches_textbook_reference_and_beats_rtn(granularity, act_order):
    x, w = _problem(n_in=320, rows=160)
    h = _hessian(x)
    from fp8_linear.quantize import compute_amax
    s = compute_amax(w, granularity) / M
    q = gptq_fp8(w, h, s, act_order=act_order)
    ref = _gptq_reference(w, h.h, s, act_order=act_order)
    se = expand_scale(s, w.shape)
    # on the grid of the fixed scale: quantizing again is exact
    assert torch.equal(_rtn(q, se), q)
    assert bool((q[:, 5] == 0).all())  # the dead input's weights are dropped, as in the reference
    # same algorithm: rounding decisions agree except where fp32 vs fp64 updates straddle a tie
    assert float((q != ref).float().mean()) < 0.01
    e_q, e_ref, e_rtn = _out_err(q, w, x), _out_err(ref, w, x), _out_err(_rtn(w, se), w, x)
    assert abs(e_q - e_ref) <= 0.01 * e_ref
    assert e_q < 0.95 * e_rtn


def test_stacked_sweep_equals_separate_calls():
    x, w = _problem()
    w2 = torch.randn(40, w.shape[1]) * 0.02
    h = _hessian(x)
    s_chan = w.abs().amax(1, keepdim=True) / M
    s_tens = (w2.abs().amax() / M).reshape(1)
    many = gptq_fp8_many([w, w2, w], h, [s_chan, s_tens, s_tens.clone()])
    singles = [gptq_fp8(w, h, s_chan), gptq_fp8(w2, h, s_tens), gptq_fp8(w, h, s_tens)]
    for a, b in zip(many, singles):
        assert a.shape == b.shape
        assert float((a != b).float().mean()) < 1e-3  # rows never mix: equal up to fp32 GEMM blocking
        assert abs(_out_err(a, w if a.shape == w.shape else w2, x) - _out_err(b, w if a.shape == w.shape else w2, x)) \
            <= 1e-4 * _out_err(b, w if a.shape == w.shape else w2, x)


def test_many_rejects_mismatched_inputs():
    x, w = _problem()
    h = _hessian(x)
    with pytest.raises(ValueError, match="ws/scales"):
        gptq_fp8_many([w], h, [])
    with pytest.raises(ValueError, match=r"ws\[1\]"):
        gptq_fp8_many([w, w[:, :10]], h, [torch.ones(1), torch.ones(1)])


def test_shared_weight_pass_equals_per_scheme_quantization(tiny_llama):
    """compare_schemes' single weight pass gives each preset the FP8 weights a per-preset run gives."""
    ids = torch.randint(0, 64, (16, 48), generator=torch.Generator().manual_seed(1))
    batches = materialize_batches(list(ids), seq_len=48, max_samples=16, batch_size=4)
    targets = select_linears(tiny_llama)
    obs = calibrate(tiny_llama, targets, batches, progress=False, histogram=False, hessian=True)
    schemes = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
    shared: dict = {}
    prepare_weights(targets, schemes, obs, True, shared)
    assert len(shared) == 3  # fp8-channel and fp8-dynamic share one recipe
    for s in schemes:
        a, b = copy.deepcopy(tiny_llama), copy.deepcopy(tiny_llama)
        apply_quantization(a, select_linears(a), s, obs, gptq=True, cache=shared)
        apply_quantization(b, select_linears(b), s, obs, gptq=True)
        mods = [(m, dict(b.named_modules())[n]) for n, m in a.named_modules() if isinstance(m, FP8Linear)]
        assert mods
        for ma, mb in mods:
            assert torch.equal(ma.weight_scale, mb.weight_scale)
            assert float((ma.weight.float() != mb.weight.float()).float().mean()) < 1e-3
