"""GPU: fused sibling projections (``fp8_linear.fuse_projections``) on the default backend (our sm90
kernel on an H100 / H200), on a Llama-shaped model built from a config (Llama-3.2-1B layer shapes,
2 decoder layers, random weights).

- Each fused group's member outputs, for M in 1, 16, 127, against an fp64 reference on the dequantized
  inputs (the activation quantized by the layer's own op; ``calc_diff`` bar of docs/design.md section 7
  with the tensor-core floor) and against the member's own unfused GEMM within the bound of two FP32
  summation orders plus the tensor core's own accumulation between promotions (the fused N = 3072 /
  16384 GEMMs take other configs than N = 2048 / 512 / 8192: at M = 16 the fused gate_up runs config 1,
  promoting every 32 of K, the unfused gate / up config 17, promoting every 128).
- transformers' compiled static-cache ``generate`` of the fused model: no recompiles over its decode
  steps, no graph breaks, no CUDA-graph skips (no input mutation; the unfused model's count printed
  beside it), every group still fused; its greedy tokens against
  the unfused model's eager ones, bounded as tests/integrations/test_gpu_generate.py bounds compiled
  against eager (identical up to each divergence, logits there within FP8's own effect).

    python -m pytest tests/integrations/test_gpu_fusion.py -q -s
"""

from __future__ import annotations

import copy

import pytest
import torch

from fp8_linear import FP8Linear, fuse_projections
from fp8_linear.backends.base import quantize_activation
from fp8_linear.fusion import fusion_groups

from fp8_models import swap_in_fp8
from helpers import KERNEL_FLOOR, calc_diff, dequant64, gemm_ref64, rounding_bar
# the Llama-3.2-1B-shaped model (2 layers, random weights) and the prompts of the compiled-vs-eager GPU test
from test_gpu_generate import AMAX_MARGIN, BATCH, NEW_TOKENS, bf16_model, prompts  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                       reason="needs a CUDA GPU with FP8 (compute capability >= 8.9)"),
]

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
U32 = 2.0**-24
BF16_MANTISSA = 7
#: Hopper's FP8 tensor-core accumulator keeps about 14 bits between promotions (DeepSeek-V3 report,
#: section 3.3.2; docs/design.md "Accumulation"): each wgmma k-step of 32 can move the running sum by up
#: to 2**-13 of its magnitude, at most |a| @ |b| over the promotion interval.
TC_ACC_REL = 2.0**-13
#: The longest promotion interval of any config (128 of K: n_acc = 1) in wgmma k-steps of 32.
TC_STEPS_PER_PROMOTION = 128 // 32


def _ref_and_bound(layer: FP8Linear, x: torch.Tensor, out: torch.Tensor):
    """fp64 reference of an unfused ``layer(x)`` (``x`` ``[M, K]``; the activation quantized by the
    layer's own op) and the largest difference two kernels' outputs can show: two FP32 summation orders,
    each kernel's tensor-core accumulation between promotions (TC_ACC_REL per k-step over
    TC_STEPS_PER_PROMOTION steps, relative to ``|a| @ |b|``), plus one bf16 ulp."""
    q, sa = quantize_activation(layer, x, layer._plan.spec)
    ref = gemm_ref64(q, layer.weight, sa, layer.weight_scale, layer.bias)
    absref = dequant64(q, sa).abs() @ dequant64(layer.weight, layer.weight_scale).abs().t()
    ulp = torch.exp2(torch.floor(torch.log2(out.double().abs().clamp_min(1e-30))) - BF16_MANTISSA)
    per_kernel = x.shape[-1] * U32 + TC_STEPS_PER_PROMOTION * TC_ACC_REL
    return ref, 2 * per_kernel * absref + ulp


@pytest.mark.parametrize("preset", PRESETS)
def test_fused_groups_match_reference_and_unfused_on_gpu(bf16_model, prompts, preset):
    plain = swap_in_fp8(copy.deepcopy(bf16_model), prompts, preset, AMAX_MARGIN)
    fused = copy.deepcopy(plain)
    report = fuse_projections(fused)
    assert len(report.fused) == 4, report
    layer = fused.model.layers[0]
    for group in fusion_groups(layer):
        parent = layer.self_attn if group.names[0] == "q_proj" else layer.mlp
        twin_parent = plain.model.layers[0].self_attn if group.names[0] == "q_proj" else plain.model.layers[0].mlp
        backend = group.fused.backend
        largest = 0.0
        for m in (1, 16, 127):
            x = torch.randn(m, group.fused.in_features, device=group.fused.weight.device, dtype=torch.bfloat16) * 2
            with torch.inference_mode():
                fused_out = _call_inside(parent, group.names, x)
                apart = {n: getattr(twin_parent, n)(x) for n in group.names}
                for n in group.names:
                    ref, bound = _ref_and_bound(getattr(twin_parent, n), x, apart[n])
                    bar = rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)
                    assert calc_diff(apart[n], ref) <= bar, (preset, backend, n, m)
                    assert calc_diff(fused_out[n], ref) <= bar, (preset, backend, n, m, calc_diff(fused_out[n], ref), bar)
                    worst = ((fused_out[n].double() - apart[n].double()).abs() / bound).max().item()
                    assert worst <= 1.0, (preset, backend, n, m, f"largest |fused - unfused| / bound {worst:.3f}")
                    largest = max(largest, worst)
            assert group._state is None and group.enabled
        print(f"{preset}: {'/'.join(group.names)} fused on {backend}: outputs within the bars at M = 1, 16, 127 "
              f"(largest |fused - unfused| / bound {largest:.3f})")


def _call_inside(parent, names, x):
    """Every member of ``names`` called on ``x`` from inside ``parent``'s forward (its hooks run), as the
    model's own code calls them."""
    parent.forward = lambda x: {n: getattr(parent, n)(x) for n in names}
    try:
        return parent(x)
    finally:
        del parent.forward  # the class's forward again


def _generate(model, ids, compiled: bool):
    from transformers.generation.configuration_utils import CompileConfig

    kw = dict(cache_implementation="static", compile_config=CompileConfig(fullgraph=True)) if compiled else dict(
        disable_compile=True)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:].cpu(), [s.float().cpu() for s in out.logits]


@pytest.mark.parametrize("preset", ["fp8-tensor", "fp8-dynamic"])
def test_compiled_static_cache_fused_has_no_recompiles_and_agrees(bf16_model, prompts, preset):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    plain = swap_in_fp8(copy.deepcopy(bf16_model), prompts, preset, AMAX_MARGIN)
    eager_bf16 = _generate(bf16_model, prompts, compiled=False)
    eager = _generate(plain, prompts, compiled=False)
    fused = copy.deepcopy(plain)
    counters.clear()
    plain_compiled = _generate(plain, prompts, compiled=True)
    plain_skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    torch._dynamo.reset()
    del plain
    assert len(fuse_projections(fused).fused) == 4
    counters.clear()
    compiled = _generate(fused, prompts, compiled=True)
    recompiles, skips = dict(counters["recompiles"]), dict(counters["inductor"]).get("cudagraph_skips", 0)
    breaks = dict(counters["graph_break"])
    again = _generate(fused, prompts, compiled=True)  # a second call: a new static cache, the same graph
    torch._dynamo.reset()
    assert not recompiles, recompiles
    assert not breaks, breaks
    # CUDA graphs capture the fused step wherever they capture the unfused one (on a GPU: no skips at all)
    assert skips <= plain_skips and not skips, (skips, plain_skips)
    assert all(g.enabled and g._state is None for g in fusion_groups(fused))
    assert torch.equal(again[0], compiled[0])
    fp8_effect = calc_diff(eager[1][0], eager_bf16[1][0])
    backends = sorted({m.backend for m in fused.modules() if isinstance(m, FP8Linear)})
    for what, ref in (("the unfused eager run", eager), ("the unfused compiled run", plain_compiled)):
        same, diffs, first = _agreement(ref, compiled)
        print(f"{preset} fused on {backends}, compiled: {same}/{BATCH} rows identical to {what} for {NEW_TOKENS} tokens "
              f"(first divergences {first}); logits calc_diff <= {max(diffs):.3g} up to them, FP8 vs BF16 {fp8_effect:.3g}")
        assert max(diffs) < fp8_effect, (preset, what, max(diffs), fp8_effect)
    print(f"{preset}: no recompiles, no graph breaks; CUDA-graph skips {skips} (unfused {plain_skips})")


def _agreement(ref, run) -> tuple[int, list[float], list[int]]:
    """Rows of ``run`` identical to ``ref`` (``(tokens, logits)`` of :func:`_generate`), the calc_diff of the
    logits at every step up to and including each row's first divergence, and those divergences."""
    diffs, first = [], []
    for r in range(ref[0].shape[0]):
        bad = (ref[0][r] != run[0][r]).nonzero()
        last = int(bad[0]) if len(bad) else NEW_TOKENS - 1
        first.append(int(bad[0]) if len(bad) else NEW_TOKENS)
        diffs += [calc_diff(run[1][p][r], ref[1][p][r]) for p in range(last + 1)]
    return sum(f == NEW_TOKENS for f in first), diffs, first
