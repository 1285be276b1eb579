"""GPU: the default GEMM path (sm90 when built, else cuBLASLt) and forced cuBLASLt against emulated.

docs/design.md section 7 shape set (Llama-3 8B / 70B linear layers) with a subsample of M, every preset,
through ``FP8Linear``; ``fp8-block`` runs on cuBLASLt's block scales where its probe passes (else it is
refused there with the reason). Bar: calc_diff(backend, forced emulated) < 1e-5, for ``backend`` = the
default choice (env unset; passes whether or not the sm90 kernel exists) and ``cublaslt`` forced. The
public GEMM on forced cuBLASLt against the fp64 reference includes block scales at M = 1 and 7 (rows
padded) and K = 1040 (9 k-blocks: the padded scale_b rows). Run: ``pytest -m gpu tests/core/backends/test_cublaslt_gpu.py``.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch
from helpers import KERNEL_FLOOR, calc_diff, gemm_ref64, random_fp8, random_scale, rounding_bar, scale_shape_for
from torch import nn

from fp8_linear import PRESETS, FP8Linear, fp8_gemm
import fp8_linear.backends as backends
from fp8_linear.backends import BACKEND_ENV, candidates, get_backend, layer_candidates
from fp8_linear.backends.cublaslt import _block_layout
from fp8_linear.errors import BackendUnavailableError
from fp8_linear.gemm import make_problem
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked
from fp8_linear import settings

FP8_CC = (8, 9)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < FP8_CC,
        reason="needs a CUDA GPU with compute capability >= 8.9",
    ),
]

#: (N, K) of the Llama-3 8B and 70B qkv / o / gate_up / down layers (docs/design.md section 7).
LLAMA_NK = [
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
    (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672),
]
#: A subsample of M in 1, 16, 64, 128, 512, 2048, 4096, 8192 (decode, small, large).
M_SUBSAMPLE = (1, 16, 128, 2048)
#: Extra (M, N, K) of docs/design.md section 7.
EXTRA_MNK = [(8192, 8192, 4096), (1024, 4096, 2048), (6144, 6144, 1280)]
BAR = 1e-5
#: Calibrated input amax for the static presets (activations are N(0, 1)).
INPUT_AMAX = 5.0


@pytest.fixture(autouse=True)
def _no_tf32():
    """The emulated reference multiplies in fp32: TF32 would make it the less accurate side."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@functools.lru_cache(maxsize=2)
def _module(preset: str, n: int, k: int) -> FP8Linear:
    torch.manual_seed(n * 31 + k)
    lin = nn.Linear(k, n, bias=True, device="cuda")
    return FP8Linear.from_linear(lin, preset, input_amax=INPUT_AMAX)


def _problem_of(mod: FP8Linear, x: torch.Tensor):
    """The GemmProblem that ``mod.forward(x)`` hands to the dispatcher."""
    x2 = x.reshape(-1, mod.in_features)
    if mod.input_scale is not None:
        q, sa = quantize_unchecked(x2, mod.weight.dtype, mod.input_scale), mod.input_scale
    else:
        q, sa = dynamic_quantize(x2, mod.weight.dtype, mod.scheme.activation_granularity)
    return make_problem(q, mod.weight, sa, mod.weight_scale, mod.bias, x.dtype)


def _default_vs_emulated(fp8_env, mod: FP8Linear, x: torch.Tensor, backend: str = "default") -> tuple[str, float]:
    """(backend that ran, calc_diff(it, forced emulated)).

    ``backend`` "default" leaves ``FP8_LINEAR_BACKEND`` unset; a name forces that backend.
    """
    fp8_env(FP8_LINEAR_BACKEND=None if backend == "default" else backend)
    out, chosen = mod(x), mod.backend
    fp8_env(FP8_LINEAR_BACKEND="emulated")
    ref = mod(x)
    fp8_env(FP8_LINEAR_BACKEND=None)
    assert out.shape == ref.shape and out.dtype == x.dtype
    return chosen, calc_diff(out, ref)


def _check_backend(mod: FP8Linear, chosen: str) -> None:
    """The default choice is the first backend whose can_implement says yes (block layers included:
    sm90 with BLOCK_SCALES, else cuBLASLt where its block probe passes)."""
    first = next(name for name, ok, _ in layer_candidates(mod) if ok)
    assert chosen == first, layer_candidates(mod)
    assert chosen in ("sm90", "cublaslt"), layer_candidates(mod)


# The top decorator varies fastest: M innermost, so each cached module serves all its M.
def _compare(fp8_env, backend: str, preset: str, mod: FP8Linear, x: torch.Tensor) -> None:
    if backend == "cublaslt":
        ok, why = get_backend("cublaslt").can_implement(mod)
        if not ok:
            assert PRESETS[preset].weight_granularity == "block" and "block" in why, why  # refused with the reason
            return
    chosen, diff = _default_vs_emulated(fp8_env, mod, x, backend)
    if backend == "default":
        _check_backend(mod, chosen)
    m, k = x.reshape(-1, x.shape[-1]).shape
    assert diff < BAR, f"{chosen}: calc_diff {diff:.3g} at M={m} N={mod.out_features} K={k}"


@pytest.mark.parametrize("m", M_SUBSAMPLE)
@pytest.mark.parametrize("backend", ["default", "cublaslt"])
@pytest.mark.parametrize("n,k", LLAMA_NK)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_llama_shapes_vs_emulated(fp8_env, preset, n, k, backend, m):
    mod = _module(preset, n, k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    _compare(fp8_env, backend, preset, mod, x)


@pytest.mark.parametrize("backend", ["default", "cublaslt"])
@pytest.mark.parametrize("m,n,k", EXTRA_MNK)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_extra_shapes_vs_emulated(fp8_env, preset, m, n, k, backend):
    mod = _module(preset, n, k)
    x = torch.randn(2, m // 2, k, device="cuda", dtype=torch.float16)  # leading batch dims
    _compare(fp8_env, backend, preset, mod, x)


@pytest.mark.parametrize("preset", ["fp8-tensor", "fp8-dynamic"])
def test_repeated_runs_bitwise_identical(monkeypatch, preset):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    settings.reload()
    mod = _module(preset, 4096, 4096)
    x = torch.randn(127, 4096, device="cuda", dtype=torch.bfloat16)
    first = mod(x)
    for _ in range(10):
        assert torch.equal(mod(x).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kinds", [("tensor", "tensor"), ("row", "row"), ("tensor", "row"), ("group", "block"),
                                   ("tensor", "block"), ("row", "block")])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (7, 208, 1040), (127, 4112, 1040), (64, 80, 16400)])  # N, K % 16 == 0
def test_forced_cublaslt_vs_fp64_reference(fp8_env, out_dtype, kinds, m, n, k):
    fp8_env(FP8_LINEAR_BACKEND="cublaslt")
    a, b = random_fp8((m, k), torch.float8_e4m3fn, "cuda"), random_fp8((n, k), torch.float8_e4m3fn, "cuda")
    sa = random_scale(scale_shape_for(kinds[0], m, k), "cuda")
    sb = random_scale(scale_shape_for(kinds[1], n, k), "cuda")
    bias = torch.randn(n, device="cuda")
    if kinds[1] == "block":
        ok, why, _ = _block_layout(torch.device("cuda"))
        if not ok:
            with pytest.raises(BackendUnavailableError, match="block"):
                fp8_gemm(a, b, sa, sb, bias, out_dtype)
            pytest.skip(why)
    out = fp8_gemm(a, b, sa, sb, bias, out_dtype)
    ref = gemm_ref64(a, b, sa, sb, bias)
    # Older torch builds write row-wise / block torch._scaled_mm results in bf16 only (the backend then converts).
    effective = torch.bfloat16 if kinds != ("tensor", "tensor") else out_dtype
    assert calc_diff(out, ref) <= max(rounding_bar(ref, effective, KERNEL_FLOOR), rounding_bar(ref, out_dtype, KERNEL_FLOOR))


def test_k_not_multiple_of_16_falls_back_with_reason_logged(monkeypatch, caplog):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    settings.reload()
    monkeypatch.setattr(backends, "_logged", set())
    caplog.set_level(logging.INFO, logger="fp8_linear")
    mod = FP8Linear.from_linear(nn.Linear(40, 256, device="cuda"), "fp8-dynamic")
    x = torch.randn(8, 40, device="cuda", dtype=torch.bfloat16)
    verdicts = {n: (ok, r) for n, ok, r in candidates(_problem_of(mod, x))}
    assert verdicts["cublaslt"][0] is False and "K=40" in verdicts["cublaslt"][1]
    if "kernel module unavailable" not in verdicts["sm90"][1]:
        assert verdicts["sm90"][0] is False
    out = mod(x)
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "fp8_linear")
    assert "GEMM backend emulated" in logged and "cublaslt skipped: K=40" in logged
    monkeypatch.setenv(BACKEND_ENV, "emulated")
    settings.reload()
    assert torch.equal(out, mod(x))
