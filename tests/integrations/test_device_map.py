"""``device_map`` and ``dtype`` with ``FP8LinearConfig`` behave as for transformers' other quantizers;
offloading FP8 weights (to disk, or to the CPU beside a GPU) and impossible backends are refused
with a message that says why."""

from __future__ import annotations

import pytest
import torch

from fp8_linear import FP8Linear, FP8LinearConfig
from fp8_linear.integrations.transformers_quantizer import check_device_map

from integ_helpers import assert_same_state, random_ids


def _load(path, cfg=None, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg or FP8LinearConfig("fp8-dynamic"), **kw)


@pytest.mark.parametrize("device_map", ["cpu", {"": "cpu"}, "auto", torch.device("cpu")])
def test_cpu_device_maps(tiny_bf16_dir, device_map):
    model = _load(tiny_bf16_dir, dtype=torch.float32, device_map=device_map)
    ref = _load(tiny_bf16_dir, dtype=torch.float32)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert_same_state(model, ref)
    with torch.inference_mode():
        assert torch.equal(model(random_ids((1, 12))).logits, ref(random_ids((1, 12))).logits)


def test_per_module_dict_on_one_device(tiny_bf16_dir):
    dmap = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model = _load(tiny_bf16_dir, dtype=torch.float32, device_map=dmap)
    assert isinstance(model.model.layers[1].mlp.gate_proj, FP8Linear)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_sets_the_high_precision_parts(tiny_bf16_dir, dtype):
    model = _load(tiny_bf16_dir, FP8LinearConfig("fp8-block"), dtype=dtype)
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == dtype and model.model.layers[0].input_layernorm.weight.dtype == dtype
    with torch.inference_mode():
        assert model(random_ids((1, 8))).logits.dtype == dtype


def test_fp8_dtype_refused(tiny_bf16_dir):
    with pytest.raises((TypeError, ValueError), match="float8|dtype"):
        _load(tiny_bf16_dir, dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("dmap, match", [
    ({"model.embed_tokens": "cpu", "model.layers": "disk", "model.norm": "cpu", "lm_head": "cpu"}, "offloading FP8 weights to disk"),
    ({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0, "lm_head": 0},
     "CPU offload of FP8 weights beside an accelerator"),
    ("disk", "offloads FP8 weights to disk"),
])
def test_offloading_maps_refused(dmap, match):
    with pytest.raises(ValueError, match=match):
        check_device_map(dmap)


@pytest.mark.parametrize("dmap", [None, "auto", "cpu", "cuda:0", 0, {"": 0}, {"a": 0, "b": 1}, {"": "cpu"}])
def test_ordinary_maps_accepted(dmap):
    check_device_map(dmap)


def test_disk_offload_refused_by_from_pretrained(tiny_bf16_dir, tmp_path):
    dmap = {"model.embed_tokens": "cpu", "model.layers": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    with pytest.raises(ValueError, match="offloading FP8 weights to disk"):
        _load(tiny_bf16_dir, device_map=dmap, offload_folder=str(tmp_path / "off"))


def test_auto_map_that_would_offload_is_refused(tiny_bf16_dir, tmp_path):
    """``"auto"`` with too little memory resolves to disk offload: checked again after it is resolved."""
    with pytest.raises(ValueError, match="offloading FP8 weights to disk"):
        _load(tiny_bf16_dir, device_map="auto", max_memory={"cpu": 50_000}, offload_folder=str(tmp_path / "off"))


def test_named_backend_pins_every_layer(tiny_bf16_dir):
    model = _load(tiny_bf16_dir, FP8LinearConfig("fp8-dynamic", backend="emulated"), dtype=torch.float32)
    assert {m.backend for m in model.modules() if isinstance(m, FP8Linear)} == {"emulated"}
    with torch.inference_mode():
        model(random_ids((1, 8)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only machine")
@pytest.mark.parametrize("backend", ["sm90", "cublaslt"])
def test_gpu_backend_refused_on_cpu(tiny_bf16_dir, backend):
    with pytest.raises(ValueError, match=f"backend: '{backend}' cannot run on cpu"):
        _load(tiny_bf16_dir, FP8LinearConfig("fp8-dynamic", backend=backend), device_map="cpu")


def test_backend_disagreeing_with_the_environment_refused(tiny_bf16_dir, monkeypatch):
    from fp8_linear import settings

    monkeypatch.setenv(settings.BACKEND_ENV, "cublaslt")
    settings.reload()
    try:
        with pytest.raises(ValueError, match="disagrees with FP8_LINEAR_BACKEND=cublaslt"):
            _load(tiny_bf16_dir, FP8LinearConfig("fp8-dynamic", backend="emulated"))
    finally:
        monkeypatch.delenv(settings.BACKEND_ENV)
        settings.reload()
