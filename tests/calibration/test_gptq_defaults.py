"""GPTQ's defaults: act-order on and ``H`` from every calibration token (docs/calibration.md), with the
earlier recipe (natural column order, ``H`` from 4096 tokens) still reachable by ``act_order=False,
hessian_tokens=4096``; each checked against an independent computation."""

from __future__ import annotations

import copy

import pytest
import torch

from fp8_linear import FP8Linear, quantize_model
from fp8_linear.calibration import gptq
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.gptq import HessianAccumulator, column_order_factor, gptq_fp8_many, inverse_factor
from fp8_linear.calibration.quantize import calibrate, prepare_weights, select_linears
from fp8_linear.formats import fmt_max
from fp8_linear.quantize import expand_scale

E4M3 = torch.float8_e4m3fn
M = fmt_max(E4M3)


def _inputs(tokens=1100, n_in=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, n_in, generator=g) * (torch.rand(n_in, generator=g) * 3 + 0.05)


def test_defaults_are_act_order_and_every_token():
    assert gptq.ACT_ORDER is True and gptq.MAX_TOKENS is None


def test_accumulator_folds_every_row_by_default_and_caps_on_request():
    x = _inputs()
    full, capped = HessianAccumulator(x.shape[1]), HessianAccumulator(x.shape[1], max_tokens=700)
    for chunk in x.split(300):  # 300 + 300 + 300 + 200 rows: the cap falls inside the third chunk
        full.update(chunk)
        capped.update(chunk)
    xd = x.double()
    assert full.tokens == 1100 and capped.tokens == 700
    # fp32 products summed in fp32 per chunk, folded into fp64: within fp32 rounding of the fp64 sum
    for acc, rows in ((full, xd), (capped, xd[:700])):
        ref = rows.t() @ rows
        assert float((acc.h - ref).norm() / ref.norm()) < 1e-6


def test_permuted_factor_is_bitwise_the_factor_of_the_permuted_matrix():
    x = _inputs()
    x[:, 7] = 0.0  # a dead input: its flag follows the permutation
    h = x.double().t() @ x.double()
    perm = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    u, dead = inverse_factor(h, perm=perm)
    u_ref, dead_ref = inverse_factor(h[perm][:, perm].contiguous())
    assert torch.equal(u, u_ref) and torch.equal(dead, dead_ref)
    assert int(dead.sum()) == 1 and int(perm[dead.nonzero()[0, 0]]) == 7
    u2, dead2, perm2 = column_order_factor(h)  # act_order=None: the default, act-order
    assert torch.equal(perm2, perm) and torch.equal(u2, u) and torch.equal(dead2, dead)
    assert column_order_factor(h, act_order=False)[2] is None


def test_default_sweep_is_act_order_and_reduces_output_error():
    g = torch.Generator().manual_seed(3)
    x = _inputs(tokens=2000, n_in=160) @ (torch.eye(160) + 0.3 * torch.randn(160, 160, generator=g))  # correlated inputs
    w = torch.randn(64, 160, generator=g) * 0.05
    h = HessianAccumulator(160)
    h.update(x)
    s = w.abs().amax(1, keepdim=True) / M
    default, = gptq_fp8_many([w], h, [s])
    ordered, = gptq_fp8_many([w], h, [s], act_order=True)
    natural, = gptq_fp8_many([w], h, [s], act_order=False)
    assert torch.equal(default, ordered) and not torch.equal(default, natural)
    rtn = (w / expand_scale(s, w.shape)).clamp(-M, M).to(E4M3).float() * expand_scale(s, w.shape)

    def out_err(q):  # ||(Q - W) X^T||^2 in fp64: what GPTQ minimizes
        return float(((q.double() - w.double()) @ x.double().t()).square().sum())

    assert out_err(default) < 0.95 * out_err(rtn) and out_err(natural) < 0.95 * out_err(rtn)


def _ids(n=24, t=48, seed=1) -> list[torch.Tensor]:
    return list(torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed)))


def _batches(n=24, t=48):
    return materialize_batches(_ids(n, t), seq_len=t, max_samples=n, batch_size=4)


def _quantize(model, n=24, t=48, **kwargs):
    return quantize_model(model, _ids(n, t), "fp8-channel", seq_len=t, max_samples=n, batch_size=4, progress=False, **kwargs)


def test_quantize_model_defaults_and_the_earlier_recipe(tiny_llama):
    """Default = H from all 24 x 48 tokens + act-order; act_order=False, hessian_tokens=4096 (here a cap
    of 500 tokens, below the 1152 given) = the natural order on the first tokens only: each equals
    GPTQ computed directly from that H, and the two differ."""
    batches = _batches()
    targets = select_linears(tiny_llama)
    name = "model.layers.0.mlp.down_proj"
    w = targets[name].weight.detach().float()
    results = {}
    for label, kwargs in (("default", {}), ("earlier", {"act_order": False, "hessian_tokens": 500})):
        obs = calibrate(tiny_llama, {name: targets[name]}, batches, progress=False, histogram=False, hessian=True,
                        hessian_tokens=kwargs.get("hessian_tokens"))
        q = _quantize(copy.deepcopy(tiny_llama), **kwargs)
        lin = q.get_submodule(name)
        assert isinstance(lin, FP8Linear)
        hess = obs[name].hessian
        assert hess.tokens == (24 * 48 if label == "default" else 500)
        ref, = gptq_fp8_many([w], hess, [lin.weight_scale.float()], act_order=kwargs.get("act_order"))
        got = lin.weight.float() * expand_scale(lin.weight_scale.float(), w.shape)
        # the same H and scales: the same rounding, up to fp32 ties of the shared column updates
        assert float((got != ref).float().mean()) < 1e-3, label
        results[label] = got
    assert float((results["default"] != results["earlier"]).float().mean()) > 0.01


def test_weight_cache_keeps_column_orders_apart(tiny_llama):
    targets = select_linears(tiny_llama)
    obs = calibrate(tiny_llama, targets, _batches(), progress=False, histogram=False, hessian=True)
    cache: dict = {}
    on = prepare_weights(targets, ["fp8-channel"], obs, True, cache, act_order=True)
    off = prepare_weights(targets, ["fp8-channel"], obs, True, cache, act_order=False)
    dflt = prepare_weights(targets, ["fp8-channel"], obs, True, cache)
    assert len(cache) == 2  # the default is act-order: no third recipe
    (k_on, (_, r_on)), = on.items()
    (k_off, (_, r_off)), = off.items()
    assert k_on != k_off and next(iter(dflt)) == k_on
    n = "model.layers.1.self_attn.o_proj"
    assert not torch.equal(r_on[n], r_off[n])


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_bad_token_cap_is_a_clear_error(tiny_llama, bad):
    with pytest.raises(ValueError, match="hessian_tokens"):
        _quantize(copy.deepcopy(tiny_llama), n=4, hessian_tokens=bad)
    with pytest.raises(ValueError, match="max_tokens"):
        HessianAccumulator(8, max_tokens=bad)
