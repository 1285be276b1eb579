"""Bad-input catalogue for ``save_quantized`` / ``load_quantized``: a real checkpoint of a tiny
Llama, corrupted one way per case; every one is refused with a ``CheckpointError`` (or a
``TypeError`` for a bad argument) naming the tensor or file, the expected and the actual value."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from catalogue import Bad, check_bad, params
from safetensors.torch import load_file, save_file
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized
from fp8_linear.checkpoint import INCOMPLETE_MARKER, CheckpointExistsError

SHARD = "model.safetensors"
CONFIG = "config.json"
Q = "model.layers.0.self_attn.q_proj"
E4 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(folder, model)``: a tiny Llama quantized with fp8-channel and saved once."""
    model = quantize_model(tiny_llama(), [token_batch()], "fp8-channel", progress=False)
    folder = str(tmp_path_factory.mktemp("ckpt") / "good")
    save_quantized(model, folder)
    return folder, model


def tensors(edit):
    """A corruption that edits the tensor dict of the single shard."""
    def apply(folder):
        t = load_file(os.path.join(folder, SHARD))
        edit(t)
        save_file(t, os.path.join(folder, SHARD), metadata={"format": "pt"})
    return apply


def config(edit):
    """A corruption that edits config.json."""
    def apply(folder):
        path = os.path.join(folder, CONFIG)
        with open(path) as f:
            c = json.load(f)
        edit(c)
        with open(path, "w") as f:
            json.dump(c, f)
    return apply


def truncate(keep: int | None = None, drop: int = 0):
    """Keep the first ``keep`` bytes of the shard, or drop its last ``drop`` bytes."""
    def apply(folder):
        path = os.path.join(folder, SHARD)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:keep] if keep is not None else data[: len(data) - drop])
    return apply


def _set(key, value):
    return lambda t: t.__setitem__(key, value(t) if callable(value) else value)


def _poke(key, index, value):
    return lambda t: t[key].__setitem__(index, value)


def _weights(path):
    return lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].__setitem__(*path)


def _touch(name, text=""):
    def apply(folder):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return apply


#: (id, corruption, error, named, expected, actual)
CORRUPTIONS = [
    ("missing-weight_scale", tensors(lambda t: t.pop(f"{Q}.weight_scale")), CheckpointError, f"{Q}.weight_scale", "[64, 1]", "missing"),
    ("missing-weight", tensors(lambda t: t.pop(f"{Q}.weight")), CheckpointError, f"{Q}.weight", "[64, 64]", "missing"),
    ("missing-norm", tensors(lambda t: t.pop("model.norm.weight")), CheckpointError, "model.norm.weight", "[64]", "missing"),
    ("extra-in-fp8-module", tensors(_set(f"{Q}.smooth_factor", torch.ones(64))), CheckpointError, f"{Q}.smooth_factor",
     "weight, weight_scale, input_scale", "unexpected tensor"),
    ("extra-plain", tensors(_set("model.layers.0.rotary.inv_freq2", torch.ones(4))), CheckpointError,
     "model.layers.0.rotary.inv_freq2", "no such parameter", "unexpected tensor"),
    ("shape-weight_scale", tensors(_set(f"{Q}.weight_scale", torch.ones(32, 1))), CheckpointError, f"{Q}.weight_scale", "[64, 1]", "[32, 1]"),
    ("shape-weight", tensors(_set(f"{Q}.weight", torch.zeros(64, 32).to(E4))), CheckpointError, f"{Q}.weight", "[64, 64]", "[64, 32]"),
    ("shape-input_scale", tensors(_set(f"{Q}.input_scale", torch.ones(2))), CheckpointError, f"{Q}.input_scale", "[1]", "[2]"),
    ("shape-norm", tensors(_set("model.norm.weight", torch.ones(63))), CheckpointError, "model.norm.weight", "[64]", "[63]"),
    ("dtype-weight-f16", tensors(_set(f"{Q}.weight", lambda t: t[f"{Q}.weight"].half())), CheckpointError, f"{Q}.weight", "F8_E4M3", "F16"),
    ("dtype-weight-e5m2", tensors(_set(f"{Q}.weight", lambda t: t[f"{Q}.weight"].float().to(torch.float8_e5m2))),
     CheckpointError, f"{Q}.weight", "F8_E4M3", "F8_E5M2"),
    ("dtype-input_scale-int", tensors(_set(f"{Q}.input_scale", torch.ones(1, dtype=torch.int32))), CheckpointError,
     f"{Q}.input_scale", "float scale", "I32"),
    ("dtype-norm-fp8", tensors(_set("model.norm.weight", lambda t: t["model.norm.weight"].to(E4))), CheckpointError,
     "model.norm.weight", "non-FP8", "F8_E4M3"),
    ("nan-weight_scale", tensors(_poke(f"{Q}.weight_scale", (3, 0), float("nan"))), CheckpointError, f"{Q}: weight_scale", "finite positive", "nan"),
    ("negative-weight_scale", tensors(_poke(f"{Q}.weight_scale", (3, 0), -1.0)), CheckpointError, f"{Q}: weight_scale", "finite positive", "-1.0"),
    ("zero-input_scale", tensors(_set(f"{Q}.input_scale", torch.zeros(1))), CheckpointError, f"{Q}: input_scale", "finite positive", "0.0"),
    ("inf-input_scale", tensors(_set(f"{Q}.input_scale", torch.tensor([float("inf")]))), CheckpointError, f"{Q}: input_scale", "finite positive", "inf"),
    ("truncated-data", truncate(drop=100), CheckpointError, SHARD, "ends at byte", "truncated"),
    ("truncated-header", truncate(keep=4), CheckpointError, SHARD, "safetensors file", "4 bytes"),
    ("empty-file", truncate(keep=0), CheckpointError, SHARD, "safetensors", "0 bytes"),
    ("config-more-layers", config(lambda c: c.__setitem__("num_hidden_layers", 3)), CheckpointError,
     "model.layers.2.self_attn.q_proj.weight", "[64, 64]", "missing"),
    ("config-intermediate-size", config(lambda c: c.__setitem__("intermediate_size", 96)), CheckpointError,
     "model.layers.0.mlp.down_proj.weight", "[64, 96]", "[64, 128]"),
    ("config-strategy-disagrees", config(_weights(("strategy", "tensor"))), CheckpointError, "quantization_config", "tensor", "channel"),
    ("config-num-bits", config(_weights(("num_bits", 4))), CheckpointError, "num_bits", "8", "4"),
    ("config-unknown-quant_method", config(lambda c: c["quantization_config"].__setitem__("quant_method", "awq")), CheckpointError,
     "quant_method", "'compressed-tensors'", "'awq'"),
    ("config-int-format", config(lambda c: c["quantization_config"].__setitem__("format", "int-quantized")), CheckpointError,
     "format", "'float-quantized'", "int-quantized"),
    ("config-no-quantization", config(lambda c: c.pop("quantization_config")), CheckpointError, CONFIG, "quantization_config", "None"),
    ("config-missing", lambda folder: os.remove(os.path.join(folder, CONFIG)), CheckpointError, CONFIG, "JSON file", "no such file"),
    ("config-not-json", _touch(CONFIG, "{not json"), CheckpointError, CONFIG, "valid JSON", "Expecting property name"),
    ("shard-missing", lambda folder: os.remove(os.path.join(folder, SHARD)), CheckpointError, "shard-missing", SHARD, "neither"),
    ("interrupted-save-marker", _touch(INCOMPLETE_MARKER), CheckpointError, INCOMPLETE_MARKER, "interrupted-save-marker", "never finished"),
]


@pytest.mark.parametrize("cid,corrupt,error,named,expected,actual", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupted_checkpoint_refused(saved, tmp_path, cid, corrupt, error, named, expected, actual):
    folder = str(tmp_path / cid)
    shutil.copytree(saved[0], folder)
    corrupt(folder)
    check_bad(Bad(cid, lambda: load_quantized(folder), error, named, expected, actual))


def test_good_checkpoint_loads_bitwise(saved):
    """The uncorrupted copy loads, so every refusal above is due to its corruption."""
    folder, model = saved
    loaded = load_quantized(folder, dtype=torch.float32)
    x = token_batch(1, 12, seed=3)
    assert torch.equal(loaded(x).logits, model(x).logits)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # tied weights stay tied


def _args_cases(saved_folder: str, model, tmp: str) -> list[Bad]:
    return [
        Bad("save-non-empty-folder", lambda: save_quantized(model, saved_folder), CheckpointExistsError, "path", "new or empty folder", saved_folder),
        Bad("save-unquantized", lambda: save_quantized(tiny_llama(), os.path.join(tmp, "u")), CheckpointError, "model", "FP8Linear", "none"),
        Bad("save-not-a-model", lambda: save_quantized(torch.nn.Linear(2, 2), os.path.join(tmp, "l")), TypeError, "model", "PreTrainedModel", "Linear"),
        Bad("load-not-a-folder", lambda: load_quantized(os.path.join(tmp, "nope")), CheckpointError, "path", "checkpoint folder", "nope"),
        Bad("load-int-dtype", lambda: load_quantized(saved_folder, dtype=torch.int8), TypeError, "dtype", "float dtype", "torch.int8"),
        Bad("load-fp8-dtype", lambda: load_quantized(saved_folder, dtype=E4), TypeError, "dtype", "float dtype", "float8_e4m3fn"),
    ]


ARG_IDS = ["save-non-empty-folder", "save-unquantized", "save-not-a-model", "load-not-a-folder", "load-int-dtype", "load-fp8-dtype"]


@pytest.mark.parametrize("cid", ARG_IDS)
def test_bad_checkpoint_arguments(saved, tmp_path, cid):
    cases = {c.id: c for c in _args_cases(saved[0], saved[1], str(tmp_path))}
    assert set(cases) == set(ARG_IDS)
    case = cases[cid]
    check_bad(case)
    assert os.listdir(saved[0])  # a refused save never touches the existing folder
