"""GEMM dispatch rules (docs/design.md section 4): forcing, log-once, reasons, fallback."""

from __future__ import annotations

import importlib.util
import logging
import threading

import pytest
import torch
from helpers import random_fp8, random_scale

import fp8_linear.backends as backends
from fp8_linear import BackendUnavailableError, fp8_gemm
from fp8_linear.backends import BACKEND_ENV, BACKEND_NAMES, candidates, get_backend, select_backend
from fp8_linear.backends.cublaslt import CublasLtBackend
from fp8_linear.gemm import make_problem
from fp8_linear import settings

HAS_SM90_MODULE = importlib.util.find_spec("fp8_linear.backends.sm90") is not None
needs_sm90_module = pytest.mark.skipif(not HAS_SM90_MODULE, reason="fp8_linear/backends/sm90.py not written yet")


def _problem(m=8, n=32, k=64, ka=(1,), kb=(1,), device="cpu"):
    a, b = random_fp8((m, k), torch.float8_e4m3fn, device), random_fp8((n, k), torch.float8_e4m3fn, device)
    return make_problem(a, b, random_scale(ka, device), random_scale(kb, device))


@pytest.fixture
def fresh_log(monkeypatch, caplog):
    """An empty log-once memory and INFO capture on the ``fp8_linear`` logger."""
    monkeypatch.setattr(backends, "_logged", set())
    caplog.set_level(logging.INFO, logger="fp8_linear")
    return caplog


def test_backend_order():
    assert BACKEND_NAMES == ("sm90", "cublaslt", "emulated")
    assert [name for name, _, _ in candidates(_problem())] == list(BACKEND_NAMES)


def test_forced_emulated_runs_on_cpu(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "emulated")
    settings.reload()
    assert select_backend(_problem()).name == "emulated"
    a, b = random_fp8((4, 48), torch.float8_e4m3fn), random_fp8((72, 48), torch.float8_e4m3fn)
    assert fp8_gemm(a, b, torch.ones(1), torch.ones(1)).shape == (4, 72)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize("name", ["cublaslt", "sm90"])
def test_forced_backend_that_cannot_run_raises_with_reason(monkeypatch, name):
    monkeypatch.setenv(BACKEND_ENV, name)
    settings.reload()
    p = _problem()
    _, why = dict((nm, (ok, r)) for nm, ok, r in candidates(p))[name]
    with pytest.raises(BackendUnavailableError) as ei:
        select_backend(p)
    msg = str(ei.value)
    assert f"{BACKEND_ENV}={name}" in msg and why in msg and why
    with pytest.raises(BackendUnavailableError):  # fp8_gemm too: never a silent fallback
        fp8_gemm(p.a, p.b, p.scale_a, p.scale_b)


def test_forced_cublaslt_reason_names_the_device(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    monkeypatch.setenv(BACKEND_ENV, "cublaslt")
    settings.reload()
    with pytest.raises(BackendUnavailableError, match="needs a CUDA device, got cpu"):
        select_backend(_problem())


@pytest.mark.parametrize("value", ["cutlass", "EMULATED", "sm100"])
def test_unknown_backend_name_is_a_value_error(monkeypatch, value):
    monkeypatch.setenv(BACKEND_ENV, value)
    settings.reload()
    with pytest.raises(ValueError) as ei:
        select_backend(_problem())
    msg = str(ei.value)
    assert BACKEND_ENV in msg and repr(value) in msg and all(n in msg for n in BACKEND_NAMES)


def test_blank_env_means_not_forced(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "  ")
    settings.reload()
    p = _problem()
    assert select_backend(p).name == next(name for name, ok, _ in candidates(p) if ok)


def test_choice_logged_once_per_backend_and_reason(monkeypatch, fresh_log):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    settings.reload()
    a, b = random_fp8((4, 64), torch.float8_e4m3fn), random_fp8((32, 64), torch.float8_e4m3fn)
    for _ in range(3):
        fp8_gemm(a, b, torch.ones(1), torch.ones(1))
    recs = [r for r in fresh_log.records if r.name == "fp8_linear"]
    assert len(recs) == 1
    msg = recs[0].getMessage()
    assert "emulated" in msg and "sm90 skipped:" in msg and "cublaslt skipped: needs a CUDA device" in msg
    monkeypatch.setenv(BACKEND_ENV, "emulated")  # a new (backend, reason) pair logs once more...
    fp8_gemm(a, b, torch.ones(1), torch.ones(1))
    assert len([r for r in fresh_log.records if r.name == "fp8_linear"]) == 1  # ...once the settings are re-read
    settings.reload()
    for _ in range(2):
        fp8_gemm(a, b, torch.ones(1), torch.ones(1))
    recs = [r.getMessage() for r in fresh_log.records if r.name == "fp8_linear"]
    assert len(recs) == 2 and f"forced by {BACKEND_ENV}" in recs[1]


def test_none_can_run_lists_every_reason(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    settings.reload()
    p = _problem(m=5, n=40, k=48)
    only_gpu = [b for b in backends.BACKENDS if b.name != "emulated"]
    if any(b.supports(p.device)[0] and b.can_run(p)[0] for b in only_gpu):
        pytest.skip("a GPU backend can run this problem here")
    with pytest.raises(BackendUnavailableError) as ei:
        select_backend(p, backends=only_gpu)
    msg = str(ei.value)
    assert "M=5 N=40 K=48" in msg
    for b in only_gpu:
        ok, why = b.supports(p.device)
        why = why if not ok else b.can_run(p)[1]
        assert f"{b.name} skipped: {why}" in msg


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(k=40), "K=40"),
        (dict(n=72), "N=72"),
        (dict(ka=(8, 1), kb=(1, 1)), None),
        (dict(ka=(8, 2), k=256), "group"),
        (dict(kb=(1, 1), n=256, k=200), "K=200"),
    ],
)
def test_cublaslt_can_run_reasons(kwargs, reason):
    ok, why = CublasLtBackend().can_run(_problem(**kwargs))
    assert ok is (reason is None)
    if reason:
        assert reason in why


def test_cublaslt_refuses_misaligned_operand():
    buf = random_fp8((8 * 64 + 8,), torch.float8_e4m3fn)
    a = buf[8:].view(8, 64)  # contiguous, but 8 bytes past a 16-byte boundary
    assert a.is_contiguous() and a.data_ptr() % 16
    p = make_problem(a, random_fp8((32, 64), torch.float8_e4m3fn), torch.ones(1), torch.ones(1))
    ok, why = CublasLtBackend().can_run(p)
    assert not ok and "aligned" in why


def test_cublaslt_block_scales_need_e4m3_and_a_cuda_device():
    b = random_fp8((256, 128), torch.float8_e5m2)
    p = make_problem(random_fp8((4, 128), torch.float8_e5m2), b, torch.ones(1), torch.ones(1))
    assert CublasLtBackend().can_run(p) == (False, "cuBLASLt has no e5m2 x e5m2 FP8 GEMM")
    p = make_problem(random_fp8((4, 128), torch.float8_e4m3fn), b, random_scale((4, 1)), random_scale((2, 1)))
    assert p.scale_b_kind == "block"
    ok, why = CublasLtBackend().can_run(p)
    assert not ok and "e4m3 operands only" in why
    e4 = b.to(torch.float32).to(torch.float8_e4m3fn)
    p = make_problem(random_fp8((4, 128), torch.float8_e4m3fn), e4, random_scale((4, 1)), random_scale((2, 1)))
    ok, why = CublasLtBackend().can_run(p)
    assert not ok and why == "needs a CUDA device, got cpu"  # the block probe runs on CUDA devices only


def test_get_backend_by_name():
    assert get_backend("emulated").name == "emulated"
    with pytest.raises(ValueError, match="got 'nope'"):
        get_backend("nope")


@needs_sm90_module
def test_sm90_refuses_k_not_multiple_of_16_and_dispatch_falls_back(monkeypatch, fresh_log):
    from fp8_linear.backends.sm90 import Sm90Backend

    monkeypatch.delenv(BACKEND_ENV, raising=False)
    settings.reload()
    p = _problem(m=16, n=64, k=40)
    ok, why = Sm90Backend().can_run(p)
    assert not ok and "16" in why and "40" in why
    chosen = select_backend(p)
    assert chosen.name != "sm90"
    verdicts = {name: (ok, r) for name, ok, r in candidates(p)}
    assert verdicts["sm90"][0] is False and verdicts["sm90"][1]
    assert any("sm90 skipped:" in r.getMessage() for r in fresh_log.records)


def test_log_once_under_concurrent_first_calls(monkeypatch, fresh_log):
    monkeypatch.setenv(BACKEND_ENV, "emulated")
    settings.reload()
    p = _problem()
    start = threading.Barrier(8)

    def worker():
        start.wait()
        for _ in range(20):
            select_backend(p)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([r for r in fresh_log.records if r.name == "fp8_linear"]) == 1


def test_shared_plan_keys_one_per_identity_smallest_free(monkeypatch):
    """shared_plan_key (fresh tables): one key per (backend, spec, generation), in order of first use
    (0, 1, ...); a backend's slot likewise; concurrent first uses of one identity get one key."""
    from torch import nn

    from fp8_linear import FP8Linear
    from fp8_linear.backends import base

    spec = base.LinearSpec.of(FP8Linear.from_linear(nn.Linear(64, 32), "fp8-dynamic"))  # (plans it: before)
    for name in ("SHARED_PLANS", "BACKEND_SLOTS", "_shared_keys", "_slots"):
        monkeypatch.setattr(base, name, {})
    emulated, cublaslt = get_backend("emulated"), get_backend("cublaslt")
    assert [base.shared_plan_key(b, spec, g) for b, g in
            ((emulated, 1), (emulated, 2), (emulated, 1), (cublaslt, 1), (cublaslt, 2))] == [0, 1, 0, 2, 3]
    assert base.BACKEND_SLOTS == {0: emulated, 1: cublaslt}
    assert base.SHARED_PLANS[3] == base.SharedPlan(1, spec, 2)
    start, keys = threading.Barrier(8), []

    def worker():
        start.wait()
        keys.append(base.shared_plan_key(emulated, spec, 3))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and base.SHARED_PLANS[keys[0]] == base.SharedPlan(0, spec, 3)
    assert sorted(base.SHARED_PLANS) == list(range(len(base.SHARED_PLANS)))  # never a gap, whoever raced


def test_one_granularity_vocabulary_for_scale_kinds():
    """fp8_gemm's scale kinds use quantize_fp8's / QuantScheme's words; the older "row" still reads."""
    from fp8_linear.backends.base import GemmProblem
    from fp8_linear.quantize import GRANULARITIES
    from fp8_linear.scheme import ACTIVATION_GRANULARITIES, WEIGHT_GRANULARITIES

    kinds = {}
    for ka, kb in [((1,), (1,)), ((8, 1), (32, 1)), ((8, 1), (1, 1)), ((8, 2), (1, 2))]:
        p = _problem(m=8, n=32, k=256 if ka[-1] == 2 else 64, ka=ka, kb=kb)
        kinds[(ka, kb)] = (p.scale_a_kind, p.scale_b_kind)
    assert kinds[((8, 1), (32, 1))] == ("token", "channel")
    assert kinds[((8, 2), (1, 2))] == ("group", "block")
    assert {a for a, _ in kinds.values()} <= set(ACTIVATION_GRANULARITIES)
    assert {b for _, b in kinds.values()} <= set(WEIGHT_GRANULARITIES)
    assert set(ACTIVATION_GRANULARITIES) | set(WEIGHT_GRANULARITIES) == set(GRANULARITIES)
    p = _problem()
    old = GemmProblem(p.a, p.b, p.scale_a, p.scale_b, None, torch.bfloat16, "row", "row")
    assert (old.scale_a_kind, old.scale_b_kind) == ("token", "channel")


@pytest.mark.parametrize("act", ["tensor", "token", "group"])
def test_block_weights_take_any_activation_kind(act):
    """Loaded block checkpoints come with 1x128 groups, per-token or static activations: each runs (the
    GPU backends spread a per-tensor / per-token scale over the groups); the reference is fp64."""
    from helpers import calc_diff

    from fp8_linear import FP8Linear, QuantScheme
    from fp8_linear.backends.base import LinearSpec
    from fp8_linear.backends.cublaslt import CublasLtBackend as Lt
    from fp8_linear.backends.sm90 import Sm90Backend, block_scales_available

    scheme = QuantScheme(f"block-{act}", "block", act != "tensor", act)
    lin = torch.nn.Linear(300, 200)
    mod = FP8Linear.from_linear(lin, scheme, input_amax=8.0)
    spec = LinearSpec.of(mod)
    assert (spec.weight_kind, spec.activation_kind) == ("block", act)
    ok, why = Sm90Backend._kinds_ok(spec.activation_kind, spec.weight_kind)
    assert ok == block_scales_available()[0], why
    assert "CUDA" in Lt._kinds_ok(act, "block", torch.device("cpu"), torch.float8_e4m3fn, torch.float8_e4m3fn)[1]
    x = torch.randn(5, 300) * 2
    ref = x.double() @ mod.dequantized_weight(torch.float64).t() + mod.bias.double()
    assert calc_diff(mod(x), ref) < 1e-3  # quantized activations against the exact product
    assert Sm90Backend._kinds_ok("group", "channel")[0] is False
