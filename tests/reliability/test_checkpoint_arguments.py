"""Bad arguments of ``save_quantized`` / ``load_quantized`` (paths, flags, ``device_map``): each a typed
error naming the argument, the expected and the actual value, raised before anything is read or
written; and the ``device_map`` strategies accelerate knows load on a CPU-only machine."""

from __future__ import annotations

import os

import pytest
import torch
from catalogue import Bad, check_bad, params
from tiny_models import tiny_llama, token_batch

from fp8_linear import CheckpointError, load_quantized, quantize_model, save_quantized
from fp8_linear.errors import DeviceError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = quantize_model(tiny_llama(num_hidden_layers=1), [token_batch()], "fp8-dynamic", progress=False)
    root = tmp_path_factory.mktemp("args")
    return model, save_quantized(model, root / "ckpt"), root


def _cuda_beyond() -> str:
    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


def _cases(model, folder, root) -> list[Bad]:
    (root / "afile").write_text("x")
    return [
        Bad("load-device-cuda-unavailable-or-past-count", lambda: load_quantized(folder, device_map=_cuda_beyond()), DeviceError,
            "device_map", "expected", _cuda_beyond()),
        Bad("load-device-unknown-string", lambda: load_quantized(folder, device_map="gpu"), DeviceError, "device_map",
            "'balanced'", "'gpu'"),
        Bad("load-device-meta", lambda: load_quantized(folder, device_map="meta"), DeviceError, "device_map",
            "a device with memory", "'meta'"),
        Bad("load-device-float", lambda: load_quantized(folder, device_map=1.5), DeviceError, "device_map", "a device", "1.5"),
        Bad("load-device-map-incomplete", lambda: load_quantized(folder, device_map={"model.layers.0": "cpu"}), DeviceError,
            "device_map", "cannot place", "model.embed_tokens.weight"),
        Bad("load-device-map-bad-value", lambda: load_quantized(folder, device_map={"": "tpu9"}), DeviceError,
            "device_map['']", "a device", "'tpu9'"),
        Bad("load-path-int", lambda: load_quantized(5), TypeError, "path", "folder path", "int"),
        Bad("load-path-empty", lambda: load_quantized(""), CheckpointError, "path", "a folder path", "''"),
        Bad("load-path-nul", lambda: load_quantized("a\x00b"), CheckpointError, "path", "a folder path", "'a\\x00b'"),
        Bad("load-path-file", lambda: load_quantized(root / "afile"), CheckpointError, "path", "a checkpoint folder",
            "(not a directory)"),
        Bad("save-overwrite-string", lambda: save_quantized(model, root / "new", overwrite="yes"), TypeError, "overwrite",
            "True or False", "'yes'"),
        Bad("save-tokenizer-int", lambda: save_quantized(model, root / "new", tokenizer=5), TypeError, "tokenizer",
            "save_pretrained", "int"),
        Bad("save-parent-is-a-file", lambda: save_quantized(model, root / "afile" / "sub" / "ckpt"), CheckpointError, "path",
            "cannot create a folder", "Not a directory"),
        Bad("save-path-empty", lambda: save_quantized(model, ""), CheckpointError, "path", "a folder path", "''"),
    ]


IDS = ["load-device-cuda-unavailable-or-past-count", "load-device-unknown-string", "load-device-meta", "load-device-float",
       "load-device-map-incomplete", "load-device-map-bad-value", "load-path-int", "load-path-empty", "load-path-nul",
       "load-path-file", "save-overwrite-string", "save-tokenizer-int", "save-parent-is-a-file", "save-path-empty"]


@pytest.mark.parametrize("cid", IDS)
def test_bad_checkpoint_argument(saved, cid):
    cases = {c.id: c for c in _cases(*saved)}
    assert set(cases) == set(IDS)
    check_bad(cases[cid])
    assert not os.path.exists(saved[2] / "new")


@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_device_map_strategies_load(saved, strategy):
    model = load_quantized(saved[1], device_map=strategy, dtype=torch.float32)
    x = token_batch(1, 8, seed=2)
    with torch.no_grad():
        assert torch.equal(model(x).logits, saved[0](x).logits)


def test_cuda_device_map_without_cuda_says_so(saved):
    """``device_map="cuda"`` on a machine without CUDA: a DeviceError saying CUDA is not available,
    raised before any file is read (not a pinned-memory error from the safetensors reader)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the CPU-only message is checked on CPU machines")
    with pytest.raises(DeviceError, match=r"device_map: expected an available device, got 'cuda' but CUDA is not available"):
        load_quantized(saved[1], device_map="cuda")
