"""Broken checkpoints are refused with a CheckpointError naming the tensor or file, the expected and
the actual value (docs/design.md section 8): one sharded checkpoint of a tiny Llama (``fp8-tensor``,
so every kind of tensor is present), copied and damaged once per case."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_helpers import quantize_tiny, tiny_llama

Q = "model.layers.0.self_attn.q_proj"
K = "model.layers.0.self_attn.k_proj"
D = "model.layers.0.mlp.down_proj"  # first quantized module in sorted order: its tensors are checked first
INDEX = "model.safetensors.index.json"
SHARD_SIZE = "300KB"


@dataclass(frozen=True)
class Corrupt:
    """``damage(folder)`` must make ``load_quantized(folder)`` raise ``error`` whose message holds
    ``argument`` (the tensor or file), ``expected`` and ``actual``."""

    id: str
    damage: Callable[[str], None]
    argument: str
    expected: str
    actual: str
    error: type = None  # CheckpointError, filled in lazily (keeps collection import-light)


def _index(folder: str) -> dict:
    with open(os.path.join(folder, INDEX)) as f:
        return json.load(f)


def _write_index(folder: str, index: dict) -> None:
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump(index, f)


def _shard(folder: str, key: str) -> str:
    return os.path.join(folder, _index(folder)["weight_map"][key])


def edit(key: str, fn: Callable[[dict, str], None]) -> Callable[[str], None]:
    """Damage: rewrite the shard holding ``key`` after ``fn(tensors, key)``; the index follows added/removed keys."""

    def damage(folder: str) -> None:
        path = _shard(folder, key)
        tensors = load_file(path)
        fn(tensors, key)
        save_file(tensors, path, metadata={"format": "pt"})
        index = _index(folder)
        fname = os.path.basename(path)
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != fname or k in tensors}
        index["weight_map"].update({k: fname for k in tensors})
        _write_index(folder, index)

    return damage


def edit_config(fn: Callable[[dict], None]) -> Callable[[str], None]:
    def damage(folder: str) -> None:
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        fn(cfg)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg, f)

    return damage


def _pop(t, k):
    del t[k]


def _set(name, value):
    def fn(t, k):
        t[name] = value(t[k]) if callable(value) else value
    return fn


def _truncate(key: str, keep: int | None = None, cut: int = 64):
    def damage(folder):
        path = _shard(folder, key)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(keep if keep is not None else size - cut)
    return damage


def _garble_header(key: str):
    def damage(folder):
        path = _shard(folder, key)
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"\xff\xfe not json")
    return damage


def _group(cfg) -> dict:
    return cfg["quantization_config"]["config_groups"]["group_0"]


def _plain_ct(cfg) -> dict:
    """Drop our namespaced extras (as in an llm-compressor checkpoint); the config group to edit."""
    cfg["quantization_config"].pop("fp8_linear")
    return _group(cfg)


def _remap(key):
    def damage(folder):
        index = _index(folder)
        files = sorted(set(index["weight_map"].values()))
        index["weight_map"][key] = next(f for f in files if f != index["weight_map"][key])
        _write_index(folder, index)
    return damage


def _marker(folder):
    from fp8_linear.checkpoint import INCOMPLETE_MARKER

    open(os.path.join(folder, INCOMPLETE_MARKER), "w").close()


def _unshard(folder):
    for f in os.listdir(folder):
        if f.endswith(".safetensors") or f == INDEX:
            os.remove(os.path.join(folder, f))


CASES = [
    # missing tensors
    Corrupt("missing-weight-scale", edit(f"{Q}.weight_scale", _pop), f"{Q}.weight_scale", "expected shape [1]", "missing"),
    Corrupt("missing-input-scale", edit(f"{Q}.input_scale", _pop), f"{Q}.input_scale", "expected shape [1]", "missing"),
    Corrupt("missing-fp8-weight", edit(f"{K}.weight", _pop), f"{K}.weight", "expected shape [128, 256]", "missing"),
    Corrupt("missing-embedding", edit("model.embed_tokens.weight", _pop), "model.embed_tokens.weight",
            "expected shape [256, 256]", "missing"),
    Corrupt("missing-norm", edit("model.norm.weight", _pop), "model.norm.weight", "expected shape [256]", "missing"),
    # extra tensors
    Corrupt("extra-tensor-on-fp8-module", edit(f"{Q}.weight", _set(f"{Q}.bogus", torch.ones(3))), f"{Q}.bogus",
            "weight, weight_scale, input_scale", "unexpected tensor"),
    Corrupt("extra-tensor-elsewhere", edit("model.norm.weight", _set("model.extra.weight", torch.ones(3))),
            "model.extra.weight", "no such parameter", "unexpected tensor"),
    # mis-shaped
    Corrupt("misshaped-fp8-weight", edit(f"{K}.weight", _set(f"{K}.weight", lambda t: t.t().contiguous())), f"{K}.weight",
            "expected shape [128, 256]", "got [256, 128]"),
    Corrupt("misshaped-weight-scale", edit(f"{Q}.weight_scale", _set(f"{Q}.weight_scale", torch.ones(2))),
            f"{Q}.weight_scale", "expected shape [1]", "got [2]"),
    Corrupt("misshaped-input-scale", edit(f"{Q}.input_scale", _set(f"{Q}.input_scale", torch.ones(256, 1))),
            f"{Q}.input_scale", "expected shape [1]", "got [256, 1]"),
    Corrupt("misshaped-embedding", edit("model.embed_tokens.weight", _set("model.embed_tokens.weight", lambda t: t[:-1].clone())),
            "model.embed_tokens.weight", "expected shape [256, 256]", "got [255, 256]"),
    # wrongly typed
    Corrupt("weight-bf16-not-fp8", edit(f"{Q}.weight", _set(f"{Q}.weight", lambda t: t.to(torch.bfloat16))), f"{Q}.weight",
            "expected F8_E4M3", "got BF16"),
    Corrupt("weight-e5m2-not-e4m3", edit(f"{Q}.weight", _set(f"{Q}.weight", lambda t: t.to(torch.float8_e5m2))), f"{Q}.weight",
            "expected F8_E4M3", "got F8_E5M2"),
    Corrupt("scale-int32", edit(f"{Q}.weight_scale", _set(f"{Q}.weight_scale", torch.ones(1, dtype=torch.int32))),
            f"{Q}.weight_scale", "expected a float scale", "got I32"),
    Corrupt("norm-fp8", edit("model.norm.weight", _set("model.norm.weight", lambda t: t.to(torch.float8_e4m3fn))),
            "model.norm.weight", "expected a non-FP8 tensor", "got F8_E4M3"),
    # bad values
    Corrupt("nan-weight-scale", edit(f"{Q}.weight_scale", _set(f"{Q}.weight_scale", torch.tensor([float("nan")]))), Q,
            "weight_scale: expected finite positive values", "got nan"),
    Corrupt("zero-input-scale", edit(f"{Q}.input_scale", _set(f"{Q}.input_scale", torch.zeros(1))), Q,
            "input_scale: expected finite positive values", "got 0.0"),
    # damaged files
    Corrupt("truncated-shard", _truncate(f"{Q}.weight"), "model-0000", "ends at byte", "(truncated)"),
    Corrupt("truncated-to-header", _truncate(f"{Q}.weight", keep=5), "model-0000", "expected a safetensors file",
            "5 bytes (truncated)"),
    Corrupt("garbled-header", _garble_header(f"{Q}.weight"), "model-0000", "expected a JSON safetensors header", "got"),
    Corrupt("shard-file-missing", lambda d: os.remove(_shard(d, f"{Q}.weight")), "model-0000", f"listed in {INDEX}",
            "missing from"),
    Corrupt("index-maps-wrong-shard", _remap(f"{Q}.weight"), f"{Q}.weight", "is stored here", f"{INDEX} maps it to"),
    Corrupt("no-weights-at-all", _unshard, "model.safetensors", f"expected model.safetensors or {INDEX}", "found neither"),
    # config disagreeing with the tensors, or unusable
    # (without our extras, as llm-compressor writes it: only the tensors can contradict the config)
    Corrupt("config-says-channel", edit_config(lambda c: _plain_ct(c)["weights"].update(strategy="channel")),
            f"{D}.weight_scale", "expected shape [256, 1]", "got [1]"),
    Corrupt("config-says-dynamic", edit_config(lambda c: _plain_ct(c)["input_activations"].update(dynamic=True, strategy="token")),
            f"{D}.input_scale", "weight, weight_scale)", "unexpected tensor"),
    Corrupt("config-ignores-quantized", edit_config(lambda c: c["quantization_config"]["ignore"].append(Q)),
            f"{Q}.input_scale", "leaves Linear", "unexpected tensor"),
    Corrupt("config-int4", edit_config(lambda c: _group(c)["weights"].update(num_bits=4, type="int")),
            "config_groups.group_0.weights.type/num_bits", "expected float / 8", "got 'int / 4'"),
    Corrupt("config-extras-disagree", edit_config(
        lambda c: c["quantization_config"]["fp8_linear"]["schemes"]["group_0"].update(weight_granularity="channel")),
            "fp8_linear.schemes.group_0", "expected the granularities", "weight_granularity='channel'"),
    Corrupt("unknown-quant-method", edit_config(lambda c: c["quantization_config"].update(quant_method="awq")),
            "quant_method", "expected one of", "got 'awq'"),
    Corrupt("no-quantization-config", edit_config(lambda c: c.pop("quantization_config")), "config.json",
            "expected a quantization_config", "got None"),
    Corrupt("config-not-json", lambda d: open(os.path.join(d, "config.json"), "w").write("{not json"), "config.json",
            "expected valid JSON", "got"),
    Corrupt("unfinished-save-marker", _marker, ".fp8_linear_incomplete", "the save into", "never finished"),
]


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory) -> str:
    from fp8_linear import save_quantized

    path = save_quantized(quantize_tiny(tiny_llama(seed=9), "fp8-tensor"), tmp_path_factory.mktemp("base") / "ckpt",
                          max_shard_size=SHARD_SIZE)
    if not os.path.exists(os.path.join(path, INDEX)):
        raise RuntimeError(f"expected a sharded checkpoint at {path}")
    return path


def test_base_checkpoint_loads(base_checkpoint):
    from fp8_linear import load_quantized

    assert load_quantized(base_checkpoint, dtype=torch.float32) is not None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_corrupt_checkpoint_refused(case, base_checkpoint, tmp_path):
    from fp8_linear import CheckpointError, load_quantized

    folder = str(tmp_path / "ckpt")
    shutil.copytree(base_checkpoint, folder)
    case.damage(folder)
    with pytest.raises(CheckpointError) as ei:
        load_quantized(folder, dtype=torch.float32)
    msg = str(ei.value)
    for part in ("argument", "expected", "actual"):
        assert getattr(case, part) in msg, f"{part} {getattr(case, part)!r} missing from: {msg}"


def test_not_a_directory(tmp_path):
    from fp8_linear import CheckpointError, load_quantized

    with pytest.raises(CheckpointError, match=r"path: expected a checkpoint folder, got .*nowhere' \(not a directory\)"):
        load_quantized(tmp_path / "nowhere")
