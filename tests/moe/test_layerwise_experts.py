"""Layer-by-layer calibration (``quantize_model(layerwise=True)``) of fused MoE experts, on the 2-layer
Qwen3-MoE of ``tiny_moe.py`` (8 experts, top-2), against the all-at-once path.

Both paths observe the same routed tokens with the same hooks (``calibration.experts.ExpertsHooks``), in
the model's own dtype (the layer-by-layer path refuses another ``calib_dtype``, and the hidden states it
carries between layers, or offloads to the CPU, keep that dtype), and each decoder layer's inputs come
from the unquantized layers before it. On one device the layer forwards are the same operations on the
same tensors as the full forward, so the FP8 experts (weights, weight scales, per-expert input scales,
token counts, fallback experts) are compared bitwise. Weight scales and FP8 weights do not depend on the
calibration tokens at all.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from fp8_linear import FP8Linear, load_quantized, quantize_model, save_quantized
from fp8_linear.calibration.experts import MIN_EXPERT_TOKENS, moe_report
from fp8_linear.moe.experts import FP8Experts
from helpers import calc_diff
from tiny_moe import NUM_EXPERTS, TINY_QWEN3_MOE, byte_samples, tiny_qwen3_moe

LAYERS = TINY_QWEN3_MOE["num_hidden_layers"]
TOP_K = TINY_QWEN3_MOE["num_experts_per_tok"]
#: The expert the forced router never picks (see :func:`_never_route`).
STARVED = 3
#: Router gain of the expert pairs that outbid the starved one: their logits are far from 0.
PAIR_GAIN = 50.0


@pytest.fixture(scope="module")
def base():
    return tiny_qwen3_moe()


@pytest.fixture(scope="module")
def rows():
    """Ragged byte rows (real text): the batches carry padding, which neither path may count."""
    w = byte_samples("calib", 8, 64)
    return [r[: 40 + 3 * i] for i, r in enumerate(w)]


def _experts(model) -> dict[str, FP8Experts]:
    return {n: m for n, m in model.named_modules() if isinstance(m, FP8Experts)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensors as their bytes (``torch.equal`` on FP8 is not defined everywhere), others as they are."""
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.element_size() == 1 else t


def _real_tokens(rows) -> int:
    return sum(int(r.numel()) for r in rows)


def _quantize(model, rows, scheme, **kw):
    return quantize_model(copy.deepcopy(model), rows, scheme, progress=False, batch_size=3, **kw)


def _never_route(model, expert: int = STARVED):
    """A copy whose routers never pick ``expert``: its router row is 0 (logit 0) and two pairs of rows
    are ``+-PAIR_GAIN * v``, so every token has two logits ``|x . v|`` far above 0 and ``expert`` is
    never in its top 2. Real routing through the model's own router; no hook changes it."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    others = [e for e in range(NUM_EXPERTS) if e != expert]
    with torch.no_grad():
        for layer in m.model.layers:
            w = layer.mlp.gate.weight
            for a, b in (others[0:2], others[2:4]):
                v = torch.randn(w.shape[1], generator=g)
                w[a] = PAIR_GAIN * v / v.norm()
                w[b] = -w[a]
            w[expert] = 0
    return m


@pytest.mark.parametrize("scheme,offload", [("fp8-tensor", False), ("fp8-channel", True), ("fp8-dynamic", False),
                                            ("fp8-block", True)])
def test_layerwise_experts_equal_all_at_once(base, rows, scheme, offload):
    ref = _quantize(base, rows, scheme)
    lw = _quantize(base, rows, scheme, layerwise=True, device="cpu", offload_activations=offload)
    a, b = _experts(ref), _experts(lw)
    assert sorted(a) == sorted(b) == [f"model.layers.{i}.mlp.experts" for i in range(LAYERS)]
    for name in a:
        sa, sb = a[name].state_dict(), b[name].state_dict()
        assert sorted(sa) == sorted(sb), name
        for k in sa:
            assert sa[k].dtype == sb[k].dtype and torch.equal(_bits(sa[k]), _bits(sb[k])), f"{name}.{k}"
        assert b[name].calibration_tokens == a[name].calibration_tokens, name
        assert b[name].calibration_fallback == a[name].calibration_fallback, name
        b[name].check()  # finite positive scales of the layout's shapes
        for t in b[name].fp8_tensors():
            assert torch.isfinite(t.float()).all(), name
    # the Linear layers after a MoE layer see the unquantized experts' outputs in both paths
    la = {n: m for n, m in ref.named_modules() if isinstance(m, FP8Linear)}
    lb = {n: m for n, m in lw.named_modules() if isinstance(m, FP8Linear)}
    assert sorted(la) == sorted(lb) and len(la) == 4 * LAYERS
    for n in la:
        if la[n].input_scale is not None:
            assert torch.equal(la[n].input_scale, lb[n].input_scale), n
    ra, rb = moe_report(ref), moe_report(lw)
    assert rb.to_dict() == ra.to_dict()
    assert all(sum(x.tokens) == TOP_K * _real_tokens(rows) for x in rb.layers)  # padding never counted
    x = torch.stack([r[:32] for r in byte_samples("eval", 2, 32)])
    with torch.inference_mode():
        assert torch.equal(lw(x).logits, ref(x).logits)


def test_layerwise_calibrates_experts_in_the_layer_pass(base, rows):
    """One forward of each experts module per calibration batch: no extra whole-model pass for the experts."""
    model = copy.deepcopy(base)
    calls = {i: 0 for i in range(LAYERS)}
    handles = [model.model.layers[i].mlp.experts.register_forward_pre_hook(
        lambda *_a, i=i: calls.__setitem__(i, calls[i] + 1)) for i in range(LAYERS)]
    quantize_model(model, rows, "fp8-tensor", progress=False, batch_size=3, layerwise=True, device="cpu")
    for h in handles:
        h.remove()
    assert calls == {i: 3 for i in range(LAYERS)}  # 8 rows in batches of 3
    assert len(_experts(model)) == LAYERS


def test_layer_with_experts_only_and_ignored_experts(base, rows):
    """A layer whose Linear layers are all ignored still gets its experts quantized with it; ignored experts
    stay in high precision in both paths."""
    ignore = ("lm_head", r"re:model\.layers\.1\.self_attn\..*", "model.layers.0.mlp.experts")
    ref = _quantize(base, rows, "fp8-tensor", ignore=ignore)
    lw = _quantize(base, rows, "fp8-tensor", ignore=ignore, layerwise=True, device="cpu")
    assert sorted(_experts(lw)) == sorted(_experts(ref)) == ["model.layers.1.mlp.experts"]
    assert not isinstance(lw.model.layers[1].self_attn.q_proj, FP8Linear)
    assert isinstance(lw.model.layers[0].self_attn.q_proj, FP8Linear)
    a, b = _experts(ref)["model.layers.1.mlp.experts"], _experts(lw)["model.layers.1.mlp.experts"]
    for k, t in a.state_dict().items():
        assert torch.equal(_bits(t), _bits(b.state_dict()[k])), k
    assert moe_report(lw).to_dict() == moe_report(ref).to_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in moe_report(lw).high_precision


@pytest.mark.parametrize("scheme", ["fp8-channel", "fp8-dynamic"])
def test_layerwise_expert_without_tokens_takes_the_fallback(base, rows, scheme):
    forced = _never_route(base)
    lw = _quantize(forced, rows, scheme, layerwise=True, device="cpu")
    ref = _quantize(forced, rows, scheme)
    rep = moe_report(lw)
    assert len(rep.layers) == LAYERS
    for x in rep.layers:
        assert x.tokens[STARVED] == 0 and STARVED in x.fallback, x
        assert sorted(x.fallback) == [e for e, t in enumerate(x.tokens) if t < MIN_EXPERT_TOKENS]
        assert sum(x.tokens) == TOP_K * _real_tokens(rows)
    assert rep.to_dict() == moe_report(ref).to_dict()
    for name, m in _experts(lw).items():
        m.check()
        other = _experts(ref)[name]
        if scheme == "fp8-channel":
            first, down = m.gate_up_proj_input_scale, m.down_proj_input_scale
            # every token reaches two experts, so the layer-wide amax is the largest expert amax
            assert float(first[STARVED]) == float(first.max()), name
            assert bool(torch.isfinite(down).all()) and bool((down > 0).all()), name
            assert torch.equal(first, other.gate_up_proj_input_scale) and torch.equal(down, other.down_proj_input_scale)
        else:
            assert m.gate_up_proj_input_scale is None
    x = torch.stack([r[:32] for r in byte_samples("eval", 2, 32)])
    with torch.inference_mode():
        assert torch.isfinite(lw(x).logits).all()


def test_layerwise_checkpoint_round_trip(base, rows, tmp_path):
    """Saved in the per-expert compressed-tensors layout, loaded back into the fused module: same logits."""
    from safetensors import safe_open

    q = _quantize(base, rows, "fp8-channel", layerwise=True, device="cpu")
    path = Path(save_quantized(q, tmp_path / "moe-layerwise"))
    keys = set()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            keys |= set(h.keys())
    for i in range(LAYERS):
        for e in range(NUM_EXPERTS):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for field in ("weight", "weight_scale", "input_scale"):
                    assert f"model.layers.{i}.mlp.experts.{e}.{proj}.{field}" in keys
    loaded = load_quantized(path, dtype=None)
    got = _experts(loaded)
    assert sorted(got) == sorted(_experts(q))
    for name, m in _experts(q).items():
        for k, t in m.state_dict().items():
            assert torch.equal(_bits(t), _bits(got[name].state_dict()[k])), f"{name}.{k}"
    x = torch.stack([r[:32] for r in byte_samples("eval", 2, 32)])
    with torch.inference_mode():
        assert torch.equal(q(x).logits, loaded(x).logits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_layerwise_experts_on_cuda(base, rows):
    """The model on the CPU, each layer calibrated on the GPU: the FP8 experts go back to the CPU with their
    layer, every routed token is counted, and the model moved to the GPU agrees with the CPU path's."""
    lw = _quantize(base, rows, "fp8-channel", layerwise=True, device="cuda")
    ref = _quantize(base, rows, "fp8-channel")
    for name, m in _experts(lw).items():
        assert all(t.device.type == "cpu" for t in m.fp8_tensors()), name
        m.check()
    assert all(sum(x.tokens) == TOP_K * _real_tokens(rows) for x in moe_report(lw).layers)
    x = torch.stack([r[:32] for r in byte_samples("eval", 2, 32)])
    with torch.inference_mode():
        want = ref(x).logits.float()
        got = lw.to("cuda")(x.cuda()).logits.float().cpu()
    assert calc_diff(got, want) < 1e-3  # docs/design.md section 7: quantized twins on two devices
