"""FP8 ``lm_head`` and FP8 input embedding (``quantize_model(quantize_lm_head=True, quantize_embeddings=True)``):
the options' decisions, and round trips through real safetensors folders (tied: one table in the file
and one in memory after the load; untied: the head as a compressed-tensors layer that is not ignored),
bitwise logits after the load, the stored tensors against an fp64 reference, and damaged configs and
tensors refused with a ``CheckpointError`` naming them."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ckpt_helpers import dequant64, fast_scheme, outputs_of, random_ids, tiny_llama
from fp8_linear import CheckpointError, FP8Embedding, FP8Linear, load_quantized, quantize_model, save_quantized
from fp8_linear.embedding import shares_weights

CALIB = 4, 32


def _quantize(model, preset: str, **kw):
    calib = list(random_ids(CALIB, model.config.vocab_size, 1))
    return quantize_model(model, calib, fast_scheme(preset), progress=False, gptq=False, **kw)


def _header(path: str) -> dict[str, tuple[str, list[int]]]:
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    return {k: (v["dtype"], v["shape"]) for k, v in head.items() if k != "__metadata__"}


def _batch(vocab: int) -> dict:
    ids = random_ids((2, 12), vocab, 7)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize("preset", ["fp8-dynamic", "fp8-channel", "fp8-tensor"])
def test_tied_round_trip_keeps_one_table(tmp_path, preset):
    model = tiny_llama()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    emb_bf = model.model.embed_tokens.weight.detach().double().clone()
    _quantize(model, preset, quantize_lm_head=True, quantize_embeddings=True)
    head, emb = model.lm_head, model.model.embed_tokens
    assert isinstance(head, FP8Linear) and isinstance(emb, FP8Embedding) and shares_weights(emb, head)
    assert head.scheme.weight_granularity == "channel"
    assert head.scheme.static == (preset != "fp8-dynamic")
    # the shared table is the embedding rounded to nearest with min-max row scales
    amax = emb_bf.abs().amax(dim=1, keepdim=True)
    assert torch.equal(emb.weight_scale, (amax.float() / 448.0).float())
    err = (dequant64(emb.weight, emb.weight_scale) - emb_bf).abs()
    assert bool((err <= torch.maximum(emb_bf.abs() / 16, emb.weight_scale.double() / 1024) * (1 + 1e-6)).all())
    batch = _batch(model.config.vocab_size)
    before = outputs_of(model, batch)

    path = save_quantized(model, tmp_path / "ck")
    header = _header(path)
    assert header["model.embed_tokens.weight"] == ("F8_E4M3", [256, 256])
    assert header["model.embed_tokens.weight_scale"] == ("F32", [256, 1])
    head_keys = sorted(k for k in header if k.startswith("lm_head."))  # one copy of the table, the head's input scale
    assert head_keys == (["lm_head.input_scale"] if head.scheme.static else [])
    assert not any("dtype_anchor" in k for k in header)
    cfg = json.load(open(os.path.join(path, "config.json")))
    qc = cfg["quantization_config"]
    assert cfg["tie_word_embeddings"] is True and "lm_head" not in qc["ignore"]
    assert qc["fp8_linear"]["embeddings"] == {"model.embed_tokens": {"format": "e4m3", "weight_scale": "channel",
                                                                    "shares_weight_with": "lm_head"}}

    loaded = load_quantized(path, dtype=torch.float32)
    lh, le = loaded.lm_head, loaded.model.embed_tokens
    assert isinstance(lh, FP8Linear) and isinstance(le, FP8Embedding) and shares_weights(le, lh)
    assert lh.scheme.name == head.scheme.name and le.output_dtype == torch.float32 and loaded.dtype == torch.float32
    assert torch.equal(le.weight.view(torch.uint8), emb.weight.view(torch.uint8))
    assert torch.equal(outputs_of(loaded, batch), before)


def test_untied_round_trip_fp8_channel_static_head(tmp_path):
    model = tiny_llama(tie_word_embeddings=False)
    _quantize(model, "fp8-channel", quantize_lm_head=True, quantize_embeddings=True)
    head, emb = model.lm_head, model.model.embed_tokens
    assert isinstance(head, FP8Linear) and head.scheme.name == "fp8-channel" and head.input_scale is not None
    assert isinstance(emb, FP8Embedding) and not shares_weights(emb, head)
    batch = _batch(model.config.vocab_size)
    before = outputs_of(model, batch)
    path = save_quantized(model, tmp_path / "ck")
    header = _header(path)
    assert header["lm_head.weight"] == ("F8_E4M3", [256, 256]) and header["lm_head.input_scale"][0] == "F32"
    assert header["model.embed_tokens.weight"] == ("F8_E4M3", [256, 256])
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["tie_word_embeddings"] is False
    assert cfg["quantization_config"]["fp8_linear"]["embeddings"]["model.embed_tokens"]["shares_weight_with"] is None
    loaded = load_quantized(path, dtype=torch.float32)
    assert isinstance(loaded.model.embed_tokens, FP8Embedding) and isinstance(loaded.lm_head, FP8Linear)
    assert torch.equal(outputs_of(loaded, batch), before)
    assert torch.equal(loaded.lm_head.input_scale, head.input_scale)


def test_head_only_is_plain_compressed_tensors(tmp_path):
    model = tiny_llama(tie_word_embeddings=False)
    _quantize(model, "fp8-dynamic", quantize_lm_head=True)
    assert isinstance(model.lm_head, FP8Linear) and type(model.model.embed_tokens) is nn.Embedding
    path = save_quantized(model, tmp_path / "ck")
    qc = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
    assert qc["ignore"] == [] and "embeddings" not in qc["fp8_linear"]
    batch = _batch(model.config.vocab_size)
    assert torch.equal(outputs_of(load_quantized(path, dtype=torch.float32), batch), outputs_of(model, batch))


def test_defaults_unchanged():
    model = tiny_llama(tie_word_embeddings=False)
    _quantize(model, "fp8-dynamic")
    assert type(model.lm_head) is nn.Linear and type(model.model.embed_tokens) is nn.Embedding


def test_option_refusals():
    tied = tiny_llama()
    for kw in (dict(quantize_lm_head=True), dict(quantize_embeddings=True)):
        with pytest.raises(ValueError, match="share one weight"):
            _quantize(tied, "fp8-dynamic", **kw)
    with pytest.raises(ValueError, match="per-channel weights"):
        _quantize(tiny_llama(), "fp8-block", quantize_lm_head=True, quantize_embeddings=True)
    with pytest.raises(TypeError, match="quantize_lm_head"):
        _quantize(tiny_llama(), "fp8-dynamic", quantize_lm_head=1)
    untied = tiny_llama(tie_word_embeddings=False)
    with pytest.raises(ValueError, match="layerwise"):
        _quantize(untied, "fp8-dynamic", quantize_embeddings=True, layerwise=True)
    with pytest.raises(ValueError, match="still matched"):
        _quantize(untied, "fp8-dynamic", quantize_lm_head=True, ignore=("re:lm_.*",))
    assert type(untied.lm_head) is nn.Linear  # refused before anything changed


@pytest.fixture(scope="module")
def tied_ckpt(tmp_path_factory):
    model = _quantize(tiny_llama(), "fp8-dynamic", quantize_lm_head=True, quantize_embeddings=True)
    return save_quantized(model, tmp_path_factory.mktemp("tied") / "ck")


def _copy_with(src: str, dst, config=None, tensors=None) -> str:
    os.makedirs(dst)
    cfg = json.load(open(os.path.join(src, "config.json")))
    if config:
        config(cfg)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    sd = load_file(os.path.join(src, "model.safetensors"))
    if tensors:
        tensors(sd)
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def _entry(cfg) -> dict:
    return cfg["quantization_config"]["fp8_linear"]["embeddings"]["model.embed_tokens"]


@pytest.mark.parametrize("damage,match", [
    (dict(config=lambda c: _entry(c).update(format="e5m2")), r"embeddings\.model\.embed_tokens\.format"),
    (dict(config=lambda c: _entry(c).update(weight_scale="tensor")), r"embed_tokens\.weight_scale"),
    (dict(config=lambda c: _entry(c).update(extra=1)), "exactly the keys"),
    (dict(config=lambda c: _entry(c).update(shares_weight_with=3)), "shares_weight_with"),
    (dict(config=lambda c: c["quantization_config"]["fp8_linear"].update(embeddings=[1])), "embeddings"),
    (dict(config=lambda c: c["quantization_config"]["fp8_linear"]["embeddings"].update(
        {"model.norm": _entry(c)})), "model.norm: expected an nn.Embedding"),
    (dict(tensors=lambda sd: sd.update({"model.embed_tokens.weight": sd["model.embed_tokens.weight"].to(torch.bfloat16)})),
     "model.embed_tokens.weight: expected F8_E4M3"),
    (dict(tensors=lambda sd: sd["model.embed_tokens.weight_scale"].__setitem__(5, 0.0)), "model.embed_tokens: weight_scale"),
    (dict(tensors=lambda sd: sd.update({"model.embed_tokens.weight_scale": sd["model.embed_tokens.weight_scale"][:10]})),
     "model.embed_tokens.weight_scale: expected shape"),
    (dict(tensors=lambda sd: sd.pop("model.embed_tokens.weight_scale")), "weight_scale: missing"),
])
def test_damaged_checkpoints_refused(tied_ckpt, tmp_path, damage, match):
    path = _copy_with(tied_ckpt, tmp_path / "bad", **damage)
    with pytest.raises(CheckpointError, match=match):
        load_quantized(path)


def test_embedding_listed_without_fp8_head_refused(tied_ckpt, tmp_path):
    """A file that says the table is shared with a head the config leaves in BF16."""
    path = _copy_with(tied_ckpt, tmp_path / "bad", config=lambda c: c["quantization_config"]["ignore"].append("lm_head"))
    with pytest.raises(CheckpointError, match="shares_weight_with"):
        load_quantized(path)


def test_stored_table_matches_fp64_reference(tied_ckpt):
    loaded = load_quantized(tied_ckpt, dtype=torch.bfloat16)
    with safe_open(os.path.join(tied_ckpt, "model.safetensors"), "pt") as f:
        q, s = f.get_tensor("model.embed_tokens.weight"), f.get_tensor("model.embed_tokens.weight_scale")
    ids = torch.arange(256)
    ref = dequant64(q, s)[ids]
    out = loaded.model.embed_tokens(ids)
    assert out.dtype == torch.bfloat16 and loaded.dtype == torch.bfloat16
    assert torch.equal(out, ref.float().to(torch.bfloat16))


def test_transformers_reads_fp8_head_not_fp8_embedding(tmp_path):
    """What docs/checkpoints.md says other readers do: transformers + compressed-tensors loads an FP8
    ``lm_head`` as ours does (a compressed-tensors layer that is not ignored), and reads an FP8 embedding
    table unscaled (its ``weight_scale`` unexpected), so such a file is for ``load_quantized`` only."""
    pytest.importorskip("compressed_tensors")
    from test_transformers_loader import _assert_same_logits_up_to_flips
    from transformers import AutoModelForCausalLM

    model = _quantize(tiny_llama(tie_word_embeddings=False), "fp8-dynamic", quantize_lm_head=True)
    path = save_quantized(model, tmp_path / "head")
    batch = _batch(model.config.vocab_size)
    theirs = AutoModelForCausalLM.from_pretrained(path).eval()
    _assert_same_logits_up_to_flips(model, batch, outputs_of(model, batch), outputs_of(theirs, batch))

    both = _quantize(tiny_llama(tie_word_embeddings=False), "fp8-dynamic", quantize_lm_head=True, quantize_embeddings=True)
    path = save_quantized(both, tmp_path / "both")
    theirs = AutoModelForCausalLM.from_pretrained(path).eval()
    table = theirs.model.embed_tokens.weight.detach()
    assert torch.equal(table, both.model.embed_tokens.weight.float())  # FP8 values, no scale applied
    assert not torch.equal(table, both.model.embed_tokens.dequantized_weight())


def test_tied_table_goes_through_gptq_as_the_head(tmp_path):
    """With GPTQ on, the tied table is rounded as the head's weight (GPTQ with the head's inputs) and the
    embedding reads that table; the pair still round-trips as one tensor."""
    from fp8_linear.embedding import FP8Embedding as Emb

    model = tiny_llama()
    rtn = Emb.from_embedding(nn.Embedding.from_pretrained(model.model.embed_tokens.weight.detach().clone()))
    calib = list(random_ids((8, 64), model.config.vocab_size, 3))  # 512 tokens: enough for H of a 256-wide input
    quantize_model(model, calib, fast_scheme("fp8-dynamic"), progress=False, gptq=True,
                   quantize_lm_head=True, quantize_embeddings=True)
    emb, head = model.model.embed_tokens, model.lm_head
    assert shares_weights(emb, head)
    assert not torch.equal(rtn.weight.view(torch.uint8), emb.weight.view(torch.uint8))  # not the nearest rounding
    assert bool((emb.weight_scale > 0).all()) and emb.weight_scale.shape == (model.config.vocab_size, 1)
    batch = _batch(model.config.vocab_size)
    loaded = load_quantized(save_quantized(model, tmp_path / "ck"), dtype=torch.float32)
    assert shares_weights(loaded.model.embed_tokens, loaded.lm_head)
    assert torch.equal(outputs_of(loaded, batch), outputs_of(model, batch))
