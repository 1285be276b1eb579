"""Bad-input catalogue for ``save_quantized`` / ``load_quantized``: bad arguments, and the
corruptions of a real tiny-Llama checkpoint that tests/checkpoint/test_corrupt_checkpoints.py does
not cover; each is refused with a ``CheckpointError`` (or a ``TypeError`` for a bad argument)
naming the tensor or file, the expected and the actual value."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from catalogue import Bad, check_bad
from safetensors.torch import load_file, save_file
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized

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


#: (id, corruption, error, named, expected, actual). The checkpoint engineer's
#: tests/checkpoint/test_corrupt_checkpoints.py covers the common corruptions (missing, extra,
#: mis-shaped, wrongly typed tensors, NaN / zero scales, truncation, bad configs) on a sharded
#: checkpoint; these are the cases it does not have, on an unsharded one.
CORRUPTIONS = [
    ("negative-weight_scale", tensors(_poke(f"{Q}.weight_scale", (3, 0), -1.0)), CheckpointError, f"{Q}: weight_scale", "finite positive", "-1.0"),
    ("inf-input_scale", tensors(_set(f"{Q}.input_scale", torch.tensor([float("inf")]))), CheckpointError, f"{Q}: input_scale", "finite positive", "inf"),
    ("empty-file", truncate(keep=0), CheckpointError, SHARD, "safetensors", "0 bytes"),
    ("config-more-layers", config(lambda c: c.__setitem__("num_hidden_layers", 3)), CheckpointError,
     "model.layers.2.self_attn.q_proj.weight", "[64, 64]", "missing"),
    ("config-intermediate-size", config(lambda c: c.__setitem__("intermediate_size", 96)), CheckpointError,
     "model.layers.0.mlp.down_proj.weight", "[64, 96]", "[64, 128]"),
    ("config-int-format", config(lambda c: c["quantization_config"].__setitem__("format", "int-quantized")), CheckpointError,
     "format", "'float-quantized'", "int-quantized"),
    ("config-missing", lambda folder: os.remove(os.path.join(folder, CONFIG)), CheckpointError, CONFIG, "JSON file", "no such file"),
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


def _args_cases(saved_folder: str) -> list[Bad]:
    """Bad ``load_quantized`` arguments (bad ``save_quantized`` arguments: tests/checkpoint/test_atomic_save.py)."""
    return [
        Bad("load-int-dtype", lambda: load_quantized(saved_folder, dtype=torch.int8), TypeError, "dtype", "float dtype", "torch.int8"),
        Bad("load-fp8-dtype", lambda: load_quantized(saved_folder, dtype=E4), TypeError, "dtype", "float dtype", "float8_e4m3fn"),
        Bad("load-dtype-string", lambda: load_quantized(saved_folder, dtype="bf16"), TypeError, "dtype", "float dtype", "'bf16'"),
    ]


ARG_IDS = ["load-int-dtype", "load-fp8-dtype", "load-dtype-string"]


@pytest.mark.parametrize("cid", ARG_IDS)
def test_bad_load_arguments(saved, cid):
    cases = {c.id: c for c in _args_cases(saved[0])}
    assert set(cases) == set(ARG_IDS)
    check_bad(cases[cid])
