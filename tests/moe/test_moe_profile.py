"""The prefill profile of ``benchmarks/moe_profile.py`` (``moe_bench --profile-prefill``) on the CPU: which
modules and functions it times, that the experts' own ops are counted apart from their grouped GEMMs, and
that it leaves the model and the patched functions as they were. The GPU run is
``python -m benchmarks.moe_bench --quick --skip-gemm --profile-prefill`` (docs/moe-investigations.md,
"Prefill at 0.64x BF16")."""

from __future__ import annotations

import math

import pytest
import torch

import fp8_linear.grouped_gemm as grouped_gemm
from benchmarks.moe_profile import CATEGORIES, category, module_kinds, profile_prefill
from fp8_linear import quantize_model
from tests.moe.tiny_moe import tiny_qwen3_moe

transformers_moe = pytest.importorskip("transformers.integrations.moe")
LAYERS = 2


def _model(scheme):
    model = tiny_qwen3_moe(dtype=torch.bfloat16)
    return model if scheme == "bf16" else quantize_model(model, None, scheme, progress=False, gptq=False)


def test_module_kinds_find_every_layers_parts():
    kinds = {k: [n for n, _ in v] for k, v in module_kinds(tiny_qwen3_moe()).items()}
    assert kinds["experts"] == [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)]
    assert kinds["router"] == [f"model.layers.{i}.mlp.gate" for i in range(LAYERS)]
    assert len(kinds["attn linears"]) == 4 * LAYERS and len(kinds["attention"]) == LAYERS
    assert kinds["lm_head"] == ["lm_head"] and kinds["embedding"] == ["model.embed_tokens"]


@pytest.mark.parametrize("scheme", ["bf16", "fp8-dynamic"])
def test_experts_ops_are_counted_apart_from_their_grouped_gemms(scheme, capsys):
    model = _model(scheme)
    original = (grouped_gemm.run_grouped_problem, getattr(transformers_moe, "_grouped_mm", None))
    r = profile_prefill(model, scheme, prefill=24, reps=2, device="cpu")
    assert "eager prefill of 24 tokens" in capsys.readouterr().out
    # the wrappers are gone and no hook stays behind
    assert (grouped_gemm.run_grouped_problem, getattr(transformers_moe, "_grouped_mm", None)) == original
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    p = r["profile"]
    assert set(r["modules"]) >= {"attention", "router", "experts", "grouped gemm", "lm_head"}
    assert r["modules"]["grouped gemm"]["host_ms"] > 0
    own = p["aten_ops_by_kind"]["experts"]
    # one routing per layer and forward: a sort, a histogram, the offsets' cumsum
    for op in ("aten::sort", "aten::histc", "aten::cumsum"):
        assert own.get(op) == LAYERS, (op, own)
    # the projections' matrix products ran inside the grouped GEMM range, not in the experts' own ops
    assert not any(n in own for n in ("aten::mm", "aten::_grouped_mm", "aten::bmm", "aten::matmul")), own
    assert p["top_level_aten_ops"]["grouped gemm"] >= 2 * LAYERS
    assert r["wall_ms"] > 0 and r["host_ms"] > 0


@pytest.mark.parametrize("name, label", [
    ("void fp8sm90::fp8_grouped_sm90_kernel<16, 4, 0, 0, false, false>(CUtensorMap, CUtensorMap)", "grouped fp8 gemm (ours)"),
    ("quant_rows", "act quant (ours)"),
    ("void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::GemmUniversal"
     "<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >", "bf16 grouped_mm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("nvjet_tst_192x192_64x3_2x1_v_bz_coopA_TNT", "cuBLAS gemm"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>", "sort"),
    ("void at::native::index_elementwise_kernel<128, 4, ...>", "gather / scatter / index"),
    ("void at::cuda::kernelHistogram1D<int, int, long, 1, 2, -1, ...>", "histc / cumsum"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>", "elementwise"),
    ("Memcpy DtoH (Device -> Pageable)", "copy / fill"),
    ("some_new_kernel", "other"),
])
def test_kernel_categories(name, label):
    assert category(name) == label
    assert label == "other" or label in dict(CATEGORIES)


def test_decode_profile_runs_generate_and_reports_a_step(capsys):
    from benchmarks.moe_profile import profile_decode

    model = _model("fp8-dynamic")
    r = profile_decode(model, "fp8-dynamic", new=3, device="cpu")
    assert "compiled decode step at batch 1" in capsys.readouterr().out
    assert r["new_tokens"] == 3 and r["kernels"] == 0 and r["categories"] == {}  # no CUDA kernels on a CPU
    # the steady step (median token interval) and the first step are timed apart; the profiled difference too
    assert r["step_ms"] > 0 and r["first_step_ms"] > 0 and math.isfinite(r["profiled_step_ms"])
    assert r["launch_calls"] == {} and r["graph_breaks"] == 0  # no CUDA calls on a CPU; eager generate there


SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA device of compute capability 9.0")
def test_gpu_fp8_prefill_is_one_grouped_launch_per_projection_without_host_sync():
    """On the device the FP8 experts forward launches our grouped kernel once per projection and layer and
    never synchronizes with the host (what the CPU reading of docs/moe-investigations.md says)."""
    model = quantize_model(tiny_qwen3_moe(dtype=torch.bfloat16).cuda(), None, "fp8-dynamic", progress=False, gptq=False)
    r = profile_prefill(model, "fp8-dynamic", prefill=64, reps=2, device="cuda")
    p = r["profile"]
    assert p["categories"]["grouped fp8 gemm (ours)"]["kernels"] == 2 * LAYERS
    assert p["categories"]["act quant (ours)"]["kernels"] >= 2 * LAYERS
    assert [s for s in p["syncs"] if s["module"] in ("experts", "grouped gemm")] == []
    assert r["modules"]["experts"]["gpu_span_ms"] > 0 and p["gpu_busy_ms"] > 0
