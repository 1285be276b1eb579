"""FP8 layers made under ``torch.inference_mode`` keep working after a device move outside it.

A tensor made under inference_mode has no version counter. ``nn.Module._apply`` (``.to``, ``.cuda``,
``.half``) writes the moved tensor into the old parameter (``param.data = new``); the parameter then
carries a normal tensor's dispatch keys without a version counter, and the first view of it raises
"Inference tensors do not track version counter" (seen on the H200 as the post-check of
``benchmarks/calibrate_gpu.py`` failing on a layer-wise-calibrated model moved to the GPU).

On the CPU, ``.to("cpu")`` returns the same tensors, so the CPU tests move with ``_apply(torch.clone)``
(a new tensor per parameter, written back exactly as a device move writes it) and with ``.half()``
(the bias follows the dtype: a real new tensor); the GPU twin uses ``.to("cuda")`` itself.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear, quantize_model
from fp8_linear.quantize import quantize_fp8

from calib_helpers import tiny_llama_config
from helpers import calc_diff, gemm_ref64, rounding_bar

SCHEMES = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
ACT_GRANULARITY = {"fp8-tensor": "tensor", "fp8-channel": "tensor", "fp8-dynamic": "token", "fp8-block": "group"}
CONTEXTS = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "grad": torch.enable_grad}


def _linear(k: int = 200, n: int = 72, seed: int = 0) -> nn.Linear:
    """An awkward-shaped bf16 Linear with bias (K not a multiple of 128, N not of 64)."""
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, bias=True, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        lin.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return lin


def _build(lin: nn.Linear, scheme: str) -> FP8Linear:
    static = ACT_GRANULARITY[scheme] == "tensor"
    return FP8Linear.from_linear(lin, scheme, input_amax=3.0 if static else None)


def _reference(layer: FP8Linear, x: torch.Tensor, scheme: str) -> torch.Tensor:
    """fp64 ``dequant(quantized x) @ dequant(W).T + bias`` (docs/design.md section 7)."""
    gran = ACT_GRANULARITY[scheme]
    scale = layer.input_scale if gran == "tensor" else None
    qx, sx = quantize_fp8(x, layer.weight.dtype, gran, scale=scale)
    return gemm_ref64(qx, layer.weight, sx, layer.weight_scale, layer.bias)


def _has_version_counter(t: torch.Tensor) -> bool:
    try:
        t._version
    except RuntimeError:
        return False
    return True


def _check_layer(layer: FP8Linear, scheme: str, ctx: str, device: str = "cpu") -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(7, layer.in_features, generator=g) * 2).to(torch.bfloat16).to(device)
    if ctx == "grad":
        x.requires_grad_(True)
    with CONTEXTS[ctx]():
        y = layer(x)
    ref = _reference(layer, x.detach(), scheme)
    y = y.detach()
    assert y.dtype == torch.bfloat16 and y.shape == (7, layer.out_features)
    assert calc_diff(y, ref) <= rounding_bar(ref, torch.bfloat16, floor=1e-12 if device == "cpu" else 1e-8)
    if ctx == "grad":  # the straight-through gradient reaches x through the moved weight
        layer(x).float().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("ctx", list(CONTEXTS))
def test_layer_made_under_inference_mode_runs_after_a_move(scheme, ctx):
    lin = _linear()
    with torch.inference_mode():
        layer = _build(lin, scheme)
    twin = _build(lin, scheme)  # the same layer made outside inference_mode
    layer._apply(torch.clone)  # a move: every tensor replaced by a new one (as .to("cuda") does)
    layer.half()  # and a real one: the fp32 bias becomes fp16; the FP8 weight and fp32 scales stay
    twin.half()
    for name, p in layer.named_parameters():
        assert _has_version_counter(p) and not p.is_inference(), name
    assert layer.weight.dtype == twin.weight.dtype and layer.bias.dtype == torch.float16
    _check_layer(layer, scheme, ctx)
    x = torch.randn(3, lin.in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), twin(x))  # same tensors, same code path: bitwise the same output


def test_layer_moved_under_inference_mode_runs_outside_it():
    """The other direction: a normal layer moved inside inference_mode, then used and moved outside it."""
    layer = _build(_linear(), "fp8-tensor")
    with torch.inference_mode():
        layer._apply(torch.clone)
    _check_layer(layer, "fp8-tensor", "no_grad")
    layer._apply(torch.clone)
    _check_layer(layer, "fp8-tensor", "inference_mode")
    layer.load_state_dict(copy.deepcopy(layer.state_dict()))
    _check_layer(layer, "fp8-tensor", "grad")


def _rows(n: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 64, (int(torch.randint(12, 33, (1,), generator=g)),), generator=g) for _ in range(n)]


@pytest.mark.parametrize("scheme", ["fp8-tensor", "fp8-dynamic"])
def test_layerwise_model_has_no_inference_tensors_and_moves(scheme):
    """``quantize_model(layerwise=True)`` builds its FP8 layers outside inference_mode: the model can be
    moved and run afterwards, and its logits stay those of the unmoved model."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=2)).eval()
    quantize_model(model, _rows(), scheme, gptq=True, batch_size=4, layerwise=True, device="cpu", progress=False)
    fp8 = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert len(fp8) == 2 * 7
    for name, p in model.named_parameters():
        assert _has_version_counter(p) and not p.is_inference(), name
    x = torch.randint(2, 64, (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = model(x).logits
    model._apply(torch.clone)
    with torch.no_grad():
        after = model(x).logits
    assert torch.equal(before, after)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("ctx", ["inference_mode", "no_grad"])
def test_gpu_layer_made_under_inference_mode_runs_after_to_cuda(scheme, ctx):
    """The failing path on the device: made under inference_mode on the CPU, ``.to("cuda")`` outside it,
    re-planned for CUDA (any backend, the fused activation quantization included), called."""
    with torch.inference_mode():
        layer = _build(_linear(), scheme)
    layer = layer.to("cuda")
    for name, p in layer.named_parameters():
        assert p.device.type == "cuda" and _has_version_counter(p), name
    _check_layer(layer, scheme, ctx, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_layerwise_model_moves_to_cuda_and_runs():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(num_hidden_layers=2)).to(torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    quantize_model(model, _rows(), "fp8-channel", batch_size=4, layerwise=True, device="cuda", progress=False)
    model.to("cuda")
    x = torch.randint(2, 64, (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got = model(x.cuda()).logits.float().cpu()
        want = ref(x).logits.float()
    assert calc_diff(got, want) < 1e-3  # quantized vs unquantized model outputs (docs/design.md section 7)
