"""Fused projections on the GPU backends at prefill size (``fp8_linear.fusion``, docs/serving.md "Prefill-sized
inputs"): from FP8_LINEAR_SPLIT_ROWS rows an eager fused group quantizes its input once and runs each member's
own GEMM; the members' outputs are then contiguous and bit for bit those of the unfused layers (the same
quantization kernel and GEMM op on the same operands), on the sm90 kernel and on cuBLASLt, for the per-tensor,
per-channel and per-token presets; block-scaled groups keep the fused output (column slices) and still match
the unfused layers within two FP32 summation orders' difference (fp64 reference, docs/design.md section 7)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, fuse_projections, settings
from helpers import calc_diff, rounding_bar

pytestmark = pytest.mark.gpu


class _GateUp(nn.Module):
    """A gated MLP's two siblings on one input (the pattern ``gate_proj`` / ``up_proj``)."""

    def __init__(self, preset: str, k: int, n: int):
        super().__init__()
        for name in ("gate_proj", "up_proj"):
            lin = nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device="cuda")
            setattr(self, name, FP8Linear.from_linear(lin, preset, input_amax=7.0))

    def forward(self, x):
        return self.gate_proj(x), self.up_proj(x)


@pytest.fixture
def backend(request, monkeypatch):
    monkeypatch.setenv(settings.BACKEND_ENV, request.param)
    settings.reload()
    yield request.param
    monkeypatch.delenv(settings.BACKEND_ENV, raising=False)
    settings.reload()


@pytest.mark.parametrize("backend", ["sm90", "cublaslt"], indirect=True)
@pytest.mark.parametrize("preset", ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"])
@pytest.mark.parametrize("rows", [512, 2048, 3000])
def test_prefill_sized_fused_group_matches_unfused(backend, preset, rows):
    if backend == "cublaslt" and preset == "fp8-block":
        pytest.skip("cuBLASLt block scales: covered by the backend's own tests")
    mod = _GateUp(preset, 4096, 1536)
    twin = copy.deepcopy(mod)
    fuse_projections(mod)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16) * 2
    with torch.no_grad():
        got, want = mod(x), twin(x)
    for g, w in zip(got, want):
        if preset == "fp8-block":
            assert not g.is_contiguous()
            bar = rounding_bar(w.double(), torch.bfloat16)
            assert calc_diff(g, w) <= bar
        else:
            assert g.is_contiguous() and torch.equal(g, w), (backend, preset, rows)
