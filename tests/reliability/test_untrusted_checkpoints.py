"""A checkpoint folder is untrusted input: one case per class of hostile-but-realistic damage to a
real sharded tiny-Llama checkpoint (``fp8-tensor``: weights, weight and input scales, an index), each
refused with a ``CheckpointError`` naming the field, file or tensor, the expected and the actual
value, without opening any file outside the folder and within a time bound."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from audit_opens import outside, recording_opens
from ckpt_mutations import CONFIG, INDEX, Snapshot, edit_json, poke, rewrite_header, tensor_bytes
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized

Q = "model.layers.0.self_attn.q_proj"
SHARD_SIZE = "40KB"
#: Seconds any refusal may take on a busy 2-core CI box (a catastrophic regex must not run on).
REFUSAL_S = 30
QC = "quantization_config"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``(snapshot, model)``: a tiny Llama in fp8-tensor, saved sharded, held in memory."""
    model = quantize_model(tiny_llama(seed=5), [token_batch()], "fp8-tensor", progress=False)
    folder = save_quantized(model, tmp_path_factory.mktemp("base") / "ckpt", max_shard_size=SHARD_SIZE)
    snap = Snapshot(folder)
    if INDEX not in snap.files or len(snap.shards()) < 2:
        raise RuntimeError(f"expected a sharded checkpoint, got {sorted(snap.files)}")
    return snap, model


def _shard_of(folder: str, key: str) -> str:
    with open(os.path.join(folder, INDEX)) as f:
        return os.path.join(folder, json.load(f)["weight_map"][key])


def _qc(edit):
    return lambda d: edit_json(os.path.join(d, CONFIG), lambda c: (edit(c[QC]), c)[1])


def _cfg(edit):
    return lambda d: edit_json(os.path.join(d, CONFIG), lambda c: (edit(c), c)[1])


def _index_points_to(target: str):
    def damage(d):
        edit_json(os.path.join(d, INDEX), lambda ix: (ix["weight_map"].__setitem__(f"{Q}.weight", target), ix)[1])
    return damage


def _outside_copy_of_shard(d):
    """Put a real shard outside the folder (``../outside/x.safetensors``) and point the index at it."""
    src = _shard_of(d, f"{Q}.weight")
    away = os.path.join(os.path.dirname(d), "outside", "x.safetensors")
    os.makedirs(os.path.dirname(away), exist_ok=True)
    os.replace(src, away)
    name = os.path.basename(src)

    def edit(ix):
        ix["weight_map"] = {k: "../outside/x.safetensors" if v == name else v for k, v in ix["weight_map"].items()}
        return ix
    edit_json(os.path.join(d, INDEX), edit)


def _symlink_shard_outside(d):
    src = _shard_of(d, f"{Q}.weight")
    away = os.path.join(os.path.dirname(d), "outside", os.path.basename(src))
    os.makedirs(os.path.dirname(away), exist_ok=True)
    os.replace(src, away)
    os.symlink(away, src)


def _fifo_shard(d):
    src = _shard_of(d, f"{Q}.weight")
    os.remove(src)
    os.mkfifo(src)


def _header(key_of_shard: str, edit):
    return lambda d: rewrite_header(_shard_of(d, key_of_shard), edit)


def _set_entry(key: str, field: str, value):
    def edit(h):
        h[key][field] = value
        return h
    return _header(key, edit)


def _nan_weight_byte(d):
    path = _shard_of(d, f"{Q}.weight")
    begin, _ = tensor_bytes(path, f"{Q}.weight")
    poke(path, begin + 5, b"\x7f")  # e4m3fn NaN


def _scale_as(key: str, value: float, dtype: torch.dtype):
    def damage(d):
        from safetensors.torch import load_file, save_file

        path = _shard_of(d, key)
        t = load_file(path)
        t[key] = torch.tensor([value], dtype=dtype)
        save_file(t, path, metadata={"format": "pt"})
    return damage


CASES = [
    # paths outside the folder
    ("index-parent-path", _outside_copy_of_shard, "weight_map", "inside the checkpoint folder", "../outside/x.safetensors"),
    ("index-absolute-path", _index_points_to("/etc/hostname"), "weight_map", "inside the checkpoint folder", "/etc/hostname"),
    ("index-not-safetensors", _index_points_to("config.json"), "weight_map", ".safetensors file", "config.json"),
    ("shard-symlink-outside", _symlink_shard_outside, "model-0000", "inside the checkpoint folder", "outside it"),
    ("shard-fifo", _fifo_shard, "model-0000", "a regular file", "a FIFO"),
    # denial of service
    ("ignore-catastrophic-regex", _qc(lambda q: q.__setitem__("ignore", ["re:(.|..)+[A-Z]$"])), "re:(.|..)+[A-Z]$",
     "linear time", "catastrophic backtracking"),
    ("ignore-bad-regex", _qc(lambda q: q.__setitem__("ignore", ["re:(unclosed"])), "quantization_config.ignore[0]",
     "valid regular expression", "re:(unclosed"),
    # values that would pass silently
    ("fp8-weight-nan-byte", _nan_weight_byte, f"{Q}.weight", "finite e4m3 values", "NaN/inf entries"),
    ("f64-scale-underflows-fp32", _scale_as(f"{Q}.weight_scale", 1e-50, torch.float64), f"{Q}: weight_scale",
     "representable in fp32", "1e-50"),
    ("f64-scale-overflows-fp32", _scale_as(f"{Q}.input_scale", 1e300, torch.float64), f"{Q}: input_scale",
     "representable in fp32", "1e+300"),
    ("f32-scale-subnormal", _scale_as(f"{Q}.weight_scale", 1e-40, torch.float32), f"{Q}: weight_scale",
     "representable in fp32", "F32"),
    # malformed quantization_config values
    ("ignore-string-not-list", _qc(lambda q: q.__setitem__("ignore", "lm_head")), "quantization_config.ignore",
     "a list", "'lm_head'"),
    ("targets-string-not-list", _qc(lambda q: q["config_groups"]["group_0"].__setitem__("targets", "Linear")),
     "group_0.targets", "a list", "'Linear'"),
    ("format-list-not-string", _qc(lambda q: q.__setitem__("format", ["float-quantized"])), "quantization_config.format",
     "'float-quantized'", "['float-quantized']"),
    ("strategy-list", _qc(lambda q: q["config_groups"]["group_0"]["weights"].__setitem__("strategy", ["tensor"])),
     "weights.strategy", "a string", "['tensor']"),
    ("num-bits-bool", _qc(lambda q: q["config_groups"]["group_0"]["weights"].__setitem__("num_bits", True)),
     "weights.type/num_bits", "float / 8", "True"),
    ("extras-name-list", _qc(lambda q: q["fp8_linear"]["schemes"]["group_0"].__setitem__("name", ["x"])),
     "fp8_linear.schemes.group_0.name", "a str field", "['x']"),
    ("fp8-int-block-size", _cfg(lambda c: c.__setitem__(QC, {"quant_method": "fp8", "activation_scheme": "static",
                                                             "weight_block_size": 128})),
     "weight_block_size", "a list of integers", "128"),
    ("fp8-activation-scheme-list", _cfg(lambda c: c.__setitem__(QC, {"quant_method": "fp8", "activation_scheme": ["static"]})),
     "activation_scheme", "a string", "['static']"),
    # the model config
    ("architectures-auto-class", _cfg(lambda c: c.__setitem__("architectures", ["AutoModelForCausalLM"])),
     "architectures[0]", "not an auto class", "AutoModelForCausalLM"),
    ("architectures-other-model", _cfg(lambda c: c.__setitem__("architectures", ["BertModel"])),
     "architectures[0]", "model_type 'llama'", "BertModel"),
    ("architectures-string", _cfg(lambda c: c.__setitem__("architectures", "LlamaForCausalLM")),
     "architectures", "a non-empty list", "'LlamaForCausalLM'"),
    ("zero-heads", _cfg(lambda c: c.__setitem__("num_attention_heads", 0)), "num_attention_heads", "an integer in [1", "0"),
    ("negative-vocab", _cfg(lambda c: c.__setitem__("vocab_size", -64)), "vocab_size", "an integer in [1", "-64"),
    ("layers-beyond-tensors", _cfg(lambda c: c.__setitem__("num_hidden_layers", 10**9)), "num_hidden_layers",
     "an integer in [1", "1000000000"),
    ("unknown-model-type", _cfg(lambda c: c.__setitem__("model_type", "no-such-model")), "model_type",
     "a model type transformers knows", "no-such-model"),
    ("rope-theta-negative", _cfg(lambda c: c.__setitem__("rope_theta", -1.0)), "rope_theta", "finite number > 0", "-1.0"),
    ("config-json-list", lambda d: open(os.path.join(d, CONFIG), "w").write("[1, 2]"), CONFIG, "a JSON object", "list"),
    ("config-duplicate-key", lambda d: open(os.path.join(d, CONFIG), "w").write('{"a": 1, "a": 2}'), CONFIG,
     "valid JSON", "duplicate key"),
    # lying safetensors headers
    ("header-json-list", _header(f"{Q}.weight", lambda h: [h]), "model-0000", "JSON safetensors header", "got"),
    ("header-string-offsets", _set_entry(f"{Q}.weight", "data_offsets", ["0", "4096"]), "model-0000",
     "data_offsets [begin, end] of non-negative ints", "['0', '4096']"),
    ("header-string-shape", _set_entry(f"{Q}.weight", "shape", ["64", "64"]), "model-0000", "non-negative ints",
     "['64', '64']"),
    ("header-negative-shape", _set_entry(f"{Q}.weight", "shape", [-64, -64]), "model-0000", "non-negative ints", "[-64, -64]"),
    ("header-unknown-dtype", _set_entry(f"{Q}.weight", "dtype", "F8_E4M3FNUZ"), "model-0000", "a dtype of", "F8_E4M3FNUZ"),
    ("header-entry-not-object", _header(f"{Q}.weight", lambda h: dict(h, **{f"{Q}.weight": 7})), "model-0000",
     "dtype, shape and data_offsets", "'int'"),
    ("header-metadata-not-strings", _header(f"{Q}.weight", lambda h: dict(h, __metadata__={"format": 1})), "model-0000",
     "__metadata__ as an object of strings", "{'format': 1}"),
]


@pytest.mark.parametrize("cid,damage,named,expected,actual", CASES, ids=[c[0] for c in CASES])
def test_untrusted_checkpoint_refused(base, tmp_path, cid, damage, named, expected, actual):
    folder = str(tmp_path / "ckpt")
    base[0].restore(folder)
    damage(folder)
    t0 = time.monotonic()
    with recording_opens() as opened, pytest.raises(CheckpointError) as ei:
        load_quantized(folder, dtype=torch.float32)
    took = time.monotonic() - t0
    msg = str(ei.value)
    for part in (named, expected, actual):
        assert part in msg, f"{part!r} missing from: {msg}"
    assert outside(opened, str(tmp_path), folder) == [], "read a file outside the checkpoint folder"
    assert took < REFUSAL_S


def test_undamaged_copy_loads_bitwise(base, tmp_path):
    """The copy the cases damage loads and reproduces the model, so each refusal is due to its damage."""
    folder = str(tmp_path / "ckpt")
    base[0].restore(folder)
    with recording_opens() as opened:
        loaded = load_quantized(folder, dtype=torch.float32)
    x = token_batch(1, 12, seed=3)
    assert torch.equal(loaded(x).logits, base[1](x).logits)
    assert outside(opened, str(tmp_path), folder) == []


def test_symlink_inside_the_folder_is_followed(base, tmp_path):
    """A shard that is a symlink to another file inside the folder is fine (resolved, then checked)."""
    folder = str(tmp_path / "ckpt")
    base[0].restore(folder)
    src = _shard_of(folder, f"{Q}.weight")
    os.makedirs(os.path.join(folder, "blobs"))
    os.replace(src, os.path.join(folder, "blobs", "b1"))
    os.symlink(os.path.join("blobs", "b1"), src)
    assert load_quantized(folder, dtype=torch.float32) is not None


def test_hf_cache_snapshot_layout_loads(base, tmp_path):
    """The Hugging Face cache keeps files as ``snapshots/<rev>/f -> ../../blobs/<sha>``: links into that
    repository's own ``blobs`` folder are inside the checkpoint."""
    repo = tmp_path / "models--tiny--llama"
    snap = repo / "snapshots" / "0123abcd"
    blobs = repo / "blobs"
    os.makedirs(snap)
    os.makedirs(blobs)
    for i, (name, data) in enumerate(base[0].files.items()):
        (blobs / f"blob{i}").write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", f"blob{i}"), snap / name)
    with recording_opens() as opened:
        assert load_quantized(snap, dtype=torch.float32) is not None
    assert outside(opened, str(tmp_path), str(repo)) == []


def test_regex_that_backtracks_only_in_re_is_matched_fast(base, tmp_path):
    """``re:(.+)+X`` (the catastrophic pattern of Python's ``re``) matches in bounded time: the load
    ends with the model (the pattern ignores nothing)."""
    folder = str(tmp_path / "ckpt")
    base[0].restore(folder)
    _qc(lambda q: q["ignore"].append("re:(.+)+X"))(folder)
    t0 = time.monotonic()
    assert load_quantized(folder, dtype=torch.float32) is not None
    assert time.monotonic() - t0 < REFUSAL_S
