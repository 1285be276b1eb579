"""Layer-by-layer calibration (one decoder layer on the device at a time) against the all-at-once path.

On one device the two observe the same rows, so the static input scales, the weight scales (with the
GPTQ grid alignment) and the GPTQ-rounded FP8 weights must agree; only the order of floating-point
sums in the layer forwards may differ, so codes are compared by counted flips, never bitwise.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, quantize_model
from fp8_linear.calibration.data import materialize_batches
from fp8_linear.calibration.layerwise import capture_layer_inputs, decoder_layers
from fp8_linear.calibration.quantize import calibrate, select_linears

from calib_helpers import calc_diff, tiny_llama_config


def _rows(n: int = 10, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 64, (int(torch.randint(12, 33, (1,), generator=g)),), generator=g) for _ in range(n)]


def _llama(**kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(num_hidden_layers=3, **kw)).eval()


def _fp8(model) -> dict[str, FP8Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}


@pytest.mark.parametrize("scheme", ["fp8-tensor", "fp8-channel", "fp8-dynamic"])
@pytest.mark.parametrize("offload", [False, True])
def test_layerwise_matches_all_at_once(scheme, offload):
    model = _llama()
    rows = _rows()  # ragged rows: batches carry padding, which must stay out of both paths
    kw = dict(scheme=scheme, progress=False, gptq=True, batch_size=4)
    ref = quantize_model(copy.deepcopy(model), rows, **kw)
    lw = quantize_model(copy.deepcopy(model), rows, layerwise=True, device="cpu", offload_activations=offload, **kw)
    a, b = _fp8(ref), _fp8(lw)
    assert set(a) == set(b) and len(a) == 3 * 7
    flips = total = 0
    for name in a:
        if a[name].input_scale is not None:
            torch.testing.assert_close(b[name].input_scale, a[name].input_scale, rtol=1e-6, atol=0, msg=name)
        torch.testing.assert_close(b[name].weight_scale, a[name].weight_scale, rtol=1e-6, atol=0, msg=name)
        flips += int((a[name].weight.view(torch.uint8) != b[name].weight.view(torch.uint8)).sum())
        total += a[name].weight.numel()
    # GPTQ carries rounding decisions through each row, so one fp32 difference in H may flip a few
    # codes downstream; bar: at most 0.1% of the codes
    assert flips <= 1e-3 * total, f"{flips} of {total} FP8 codes differ"
    x = torch.randint(2, 64, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert calc_diff(lw(x).logits, ref(x).logits) < 1e-6


def test_layerwise_observers_equal_all_at_once():
    """The observed statistics themselves (max, count, H) are those of the full forward."""
    from fp8_linear.calibration.layerwise import calibrate_layerwise
    from fp8_linear.calibration.observers import ActivationObserver

    model = _llama()
    targets = select_linears(model)
    batches = materialize_batches(_rows(), batch_size=3)
    full = calibrate(model, targets, batches, progress=False, hessian=True)
    obs = {n: ActivationObserver(n, True) for n in targets}
    seen = []
    stats = calibrate_layerwise(model.model, targets, batches, device="cpu", observers=obs, hessian=True,
                                on_layer=lambda i, lt: seen.append((i, sorted(lt))), progress=False)
    assert {k: stats[k] for k in ("layers", "peak_gpu_bytes")} == {"layers": 3, "peak_gpu_bytes": None}
    assert len(stats["layer_seconds"]) == 3 and all(t >= 0 for t in stats["layer_seconds"])
    assert [i for i, _ in seen] == [0, 1, 2] and all(len(t) == 7 for _, t in seen)
    for n in targets:
        assert obs[n].count == full[n].count, n
        assert obs[n].max == pytest.approx(full[n].max, rel=1e-6), n
        assert torch.equal(obs[n].hist, full[n].hist) or int((obs[n].hist - full[n].hist).abs().sum()) <= 4, n
        h, hf = obs[n].hessian.h, full[n].hessian.h
        assert float((h - hf).norm() / hf.norm()) < 1e-6, n
    # q/k/v (and gate/up) share one H in both paths
    assert obs["model.layers.0.self_attn.q_proj"].hessian is obs["model.layers.0.self_attn.v_proj"].hessian


def test_capture_stops_before_first_layer():
    model = _llama()
    _, layers = decoder_layers(model.model, select_linears(model))
    calls = []
    h = layers[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        got = capture_layer_inputs(model.model, layers, materialize_batches(_rows(4), batch_size=2), "cpu", "cpu")
    finally:
        h.remove()
    assert not calls and len(got) == 2
    hidden, kw = got[0]
    assert hidden.shape[0] == 2 and hidden.shape[-1] == 32 and "position_embeddings" in kw


def test_decoder_layers_is_the_model_layers():
    model = _llama()
    name, layers = decoder_layers(model.model, select_linears(model))
    assert name == "layers" and layers is model.model.layers


def test_target_outside_layers_raises():
    model = _llama(tie_word_embeddings=False)
    with pytest.raises(ValueError, match="outside the decoder layers"):
        quantize_model(model, _rows(4), "fp8-tensor", ignore=(), layerwise=True, device="cpu", progress=False)


def test_device_without_layerwise_raises():
    with pytest.raises(ValueError, match="layerwise"):
        quantize_model(_llama(), _rows(4), "fp8-tensor", device="cpu", progress=False)


def test_layerwise_calib_dtype_mismatch_raises():
    with pytest.raises(ValueError, match="calib_dtype"):
        quantize_model(_llama(), _rows(4), "fp8-tensor", layerwise=True, device="cpu", calib_dtype=torch.bfloat16,
                       progress=False)


def test_no_decoder_stack_raises():
    from fp8_linear.calibration.layerwise import decoder_layers as find

    with pytest.raises(ValueError, match="ModuleList"):
        find(nn.Sequential(nn.Linear(4, 4)), {"0": nn.Linear(4, 4)})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layerwise_on_gpu_matches_cpu_scales():
    model = _llama().to(torch.bfloat16)
    rows = _rows()
    ref = quantize_model(copy.deepcopy(model), rows, "fp8-channel", progress=False)
    gpu = quantize_model(copy.deepcopy(model), rows, "fp8-channel", layerwise=True, device="cuda", progress=False)
    for name, m in _fp8(ref).items():
        g = dict(gpu.named_modules())[name]
        assert g.weight.device.type == "cpu"
        # bf16 layer forwards on the GPU differ from the CPU's in rounding: scales within 1%
        torch.testing.assert_close(g.input_scale, m.input_scale, rtol=1e-2, atol=0, msg=name)
        torch.testing.assert_close(g.weight_scale, m.weight_scale, rtol=0.1, atol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layerwise_on_gpu_leaves_nothing_on_the_gpu():
    """Every layer goes back home after its turn, the bf16 Linear layers that were swapped for FP8Linear
    included (a reference kept by the caller would otherwise pin their weights on the GPU), and the peak
    stays below the bf16 weights of two layers plus one layer's hidden states and H matrices."""
    model = _llama(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2).to(torch.bfloat16)
    rows = [torch.randint(2, 64, (64,), generator=torch.Generator().manual_seed(i)) for i in range(16)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    quantize_model(model, rows, "fp8-channel", layerwise=True, device="cuda", batch_size=4, progress=False)
    torch.cuda.synchronize()
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.cuda.memory_allocated() - base < 2**20, "GPU memory left allocated after layer-wise calibration"
    stats = model.fp8_layerwise
    assert stats["layers"] == 3 and len(stats["layer_seconds"]) == 3 and stats["peak_gpu_bytes"] > 0
