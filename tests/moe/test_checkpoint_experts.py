"""FP8 MoE checkpoints: the per-expert compressed-tensors layout vLLM reads, saved from and loaded back into
fused experts modules; checkpoints written by compressed-tensors itself and DeepSeek-style ``fp8`` block
checkpoints load; damaged ones fail naming the tensor."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized
from fp8_linear.moe.experts import FP8Experts
from helpers import calc_diff
from tiny_moe import NUM_EXPERTS, TINY_QWEN3_MOE, byte_samples, tiny_qwen3_moe

SCHEMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
HIDDEN, INTER = TINY_QWEN3_MOE["hidden_size"], TINY_QWEN3_MOE["moe_intermediate_size"]
SCALE_SHAPES = {"fp8-tensor": [1], "fp8-channel": [INTER, 1], "fp8-dynamic": [INTER, 1], "fp8-block": [1, 1]}


@pytest.fixture(scope="module")
def calib():
    return byte_samples("calib", 8, 64)


@pytest.fixture(scope="module")
def eval_ids():
    return torch.stack(byte_samples("eval", 2, 48))


def _header(folder: str) -> dict[str, tuple[list[int], str]]:
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_per_expert_layout_bitwise(scheme, calib, eval_ids, tmp_path):
    model = quantize_model(tiny_qwen3_moe(), calib, scheme, progress=False, gptq=False)  # GPTQ: not the layout's business
    path = save_quantized(model, tmp_path / "ckpt")
    head = _header(path)
    p = "model.layers.1.mlp.experts"
    assert not any(k.startswith(p + ".gate_up_proj") or k.startswith(p + ".down_proj") for k in head)
    for e in (0, NUM_EXPERTS - 1):
        assert head[f"{p}.{e}.gate_proj.weight"] == ([INTER, HIDDEN], "F8_E4M3")
        assert head[f"{p}.{e}.up_proj.weight"] == ([INTER, HIDDEN], "F8_E4M3")
        assert head[f"{p}.{e}.down_proj.weight"] == ([HIDDEN, INTER], "F8_E4M3")
        assert head[f"{p}.{e}.gate_proj.weight_scale"] == (SCALE_SHAPES[scheme], "F32")
        assert (f"{p}.{e}.down_proj.input_scale" in head) == (scheme in ("fp8-tensor", "fp8-channel"))
    qc = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
    assert [g["targets"] for g in qc["config_groups"].values()] == [["Linear"]]
    assert "model.layers.0.mlp.gate" in qc["ignore"] and "model.layers.1.mlp.gate" in qc["ignore"]
    loaded = load_quantized(path, dtype=None)
    ex = loaded.model.layers[1].mlp.experts
    assert isinstance(ex, FP8Experts) and ex.scheme.weight_granularity == model.model.layers[1].mlp.experts.scheme.weight_granularity
    for name, t in model.model.layers[1].mlp.experts.named_parameters():
        assert torch.equal(t.float(), getattr(ex, name).float()), name
    with torch.no_grad():
        assert torch.equal(model(eval_ids).logits, loaded(eval_ids).logits)


def test_weight_names_are_those_of_the_original_checkpoints(tmp_path):
    """transformers saves the BF16 model's experts per expert under the same names (its conversion mapping)."""
    plain = tiny_qwen3_moe()
    plain.save_pretrained(tmp_path / "bf16")
    fp8 = quantize_model(copy.deepcopy(plain), None, "fp8-dynamic", progress=False, gptq=False)
    path = save_quantized(fp8, tmp_path / "fp8")
    ours = {k for k in _header(path) if "experts" in k and k.endswith(".weight")}
    theirs = {k for k in _header(str(tmp_path / "bf16")) if "experts" in k}
    assert ours == theirs


def test_loads_in_bf16_and_a_second_save_is_identical(calib, eval_ids, tmp_path):
    model = quantize_model(tiny_qwen3_moe(), calib, "fp8-channel", progress=False, gptq=False)
    first = save_quantized(model, tmp_path / "a")
    loaded = load_quantized(first)  # dtype bf16 for the non-FP8 tensors
    assert loaded.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    second = save_quantized(load_quantized(first, dtype=None), tmp_path / "b")
    a, b = load_file(os.path.join(first, "model.safetensors")), load_file(os.path.join(second, "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8) if a[k].dtype.itemsize == 1 else a[k],
                                                    b[k].view(torch.uint8) if b[k].dtype.itemsize == 1 else b[k]) for k in a)
    with torch.no_grad():
        out = loaded(eval_ids).logits
    assert torch.isfinite(out).all()


def test_unquantized_experts_are_ignored_and_load_merged(calib, eval_ids, tmp_path):
    model = quantize_model(tiny_qwen3_moe(), calib, "fp8-dynamic", progress=False, gptq=False,
                           ignore=("lm_head", "re:.*mlp\\.experts$"))
    assert not any(isinstance(m, FP8Experts) for m in model.modules())
    path = save_quantized(model, tmp_path / "ckpt")
    qc = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
    assert any("experts" in p for p in qc["ignore"])
    loaded = load_quantized(path, dtype=None)
    src, got = model.model.layers[0].mlp.experts, loaded.model.layers[0].mlp.experts
    assert type(got) is type(src) and torch.equal(src.gate_up_proj, got.gate_up_proj)
    with torch.no_grad():
        assert torch.equal(model(eval_ids).logits, loaded(eval_ids).logits)


@pytest.mark.parametrize("preset,ours", [("FP8", "tensor"), ("FP8_DYNAMIC", "channel"), ("FP8_BLOCK", "block")])
def test_compressed_tensors_moe_checkpoint_loads(preset, ours, calib, eval_ids, tmp_path):
    import ct_moe

    base = tiny_qwen3_moe()
    twin = copy.deepcopy(base)
    compressor = ct_moe.write(twin, str(tmp_path), preset, torch.stack(calib))
    loaded = load_quantized(tmp_path, dtype=None)
    ex = loaded.model.layers[1].mlp.experts
    assert isinstance(ex, FP8Experts) and ex.scheme.weight_granularity == ours
    # every expert's weights, as compressed-tensors itself decompresses them
    compressor.decompress_model(twin)
    for e in range(NUM_EXPERTS):
        mlp = twin.model.layers[1].mlp.experts[e]
        for part, rows in (("gate_proj", slice(0, INTER)), ("up_proj", slice(INTER, 2 * INTER))):
            deq = _dequant(ex.gate_up_proj[e, rows], _part_scale(ex, "gate_up_proj", e, 0 if part == "gate_proj" else 1, rows))
            assert torch.equal(deq, getattr(mlp, part).weight.float()), (e, part)
        assert torch.equal(_dequant(ex.down_proj[e], _part_scale(ex, "down_proj", e, 0, slice(None))), mlp.down_proj.weight.float())
        if preset == "FP8":
            assert ex.gate_up_proj_input_scale[e] == max(mlp.gate_proj.input_scale.item(), mlp.up_proj.input_scale.item())
    # and the whole model runs as compressed-tensors' own (fake-quantized) forward of the same checkpoint.
    # The two libraries sum their matmuls in their own orders (and, with MKL's AVX2 kernels, in other
    # orders than with its AVX-512 ones), so an activation value next to an e4m3 rounding midpoint can
    # round the other way in the next layer: the logits agree within one FP8 rounding step of each other
    # (calc_diff ~3.5e-4 measured for per-token scales), bitwise where no value flips.
    with torch.no_grad():
        ref, out = twin(eval_ids).logits, loaded(eval_ids).logits
    assert calc_diff(out, ref) < 1e-3


def _part_scale(ex, proj, e, p, rows):
    s = getattr(ex, f"{proj}_scale")
    gran = ex.scheme.weight_granularity
    if gran == "tensor":
        return s[e, p]
    if gran == "channel":
        return s[e, rows]
    return s[e, p].repeat_interleave(128, 0).repeat_interleave(128, 1)


def _dequant(q, s):
    q = q.float()
    if s.dim() == 2 and s.shape[1] > 1:
        s = s[: q.shape[0], : q.shape[1]]
    return q * s


def test_deepseek_style_fp8_block_checkpoint_loads(calib, eval_ids, tmp_path):
    """quant_method ``fp8`` with ``weight_block_size`` and ``weight_scale_inv`` (DeepSeek-V3 / Qwen3-FP8 layout)."""
    model = quantize_model(tiny_qwen3_moe(), calib, "fp8-block", progress=False, gptq=False)
    path = save_quantized(model, tmp_path / "ours")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    renamed = {(k[: -len("weight_scale")] + "weight_scale_inv" if k.endswith("weight_scale") else k): v for k, v in tensors.items()}
    out_dir = tmp_path / "deepseek"
    out_dir.mkdir()
    save_file(renamed, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": [128, 128]}
    json.dump(cfg, open(out_dir / "config.json", "w"))
    loaded = load_quantized(out_dir, dtype=None)
    assert isinstance(loaded.model.layers[0].mlp.experts, FP8Experts)
    with torch.no_grad():
        assert torch.equal(model(eval_ids).logits, loaded(eval_ids).logits)


def _rewrite(path, edit):
    f = os.path.join(path, "model.safetensors")
    t = load_file(f)
    edit(t)
    save_file(t, f, metadata={"format": "pt"})


@pytest.mark.parametrize("damage,match", [
    (lambda t: t.pop("model.layers.0.mlp.experts.5.up_proj.weight"), r"experts\.5\.up_proj\.weight: missing"),
    (lambda t: t.pop("model.layers.1.mlp.experts.7.down_proj.weight_scale"), r"experts\.7\.down_proj\.weight_scale: missing"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.2.gate_proj.weight_scale", torch.ones(3, 1)), "expected shape"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.2.gate_proj.weight",
                             torch.zeros(INTER, HIDDEN, dtype=torch.bfloat16)), "expected F8_E4M3"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.1.down_proj.weight_scale",
                             torch.full((HIDDEN, 1), float("nan"))), "finite positive"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.9.down_proj.weight",
                             torch.zeros(HIDDEN, INTER, dtype=torch.float8_e4m3fn)), "unexpected tensor"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.gate_up_proj",
                             torch.zeros(NUM_EXPERTS, 2 * INTER, HIDDEN, dtype=torch.float8_e4m3fn)), "stored per expert"),
])
def test_damaged_expert_tensors_fail_naming_them(damage, match, calib, tmp_path):
    model = quantize_model(tiny_qwen3_moe(), None, "fp8-dynamic", progress=False, gptq=False)
    path = save_quantized(model, tmp_path / "ckpt")
    _rewrite(path, damage)
    with pytest.raises(CheckpointError, match=match):
        load_quantized(path)
