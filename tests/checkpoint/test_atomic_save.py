"""Saving is atomic: a save killed midway leaves no folder that ``load_quantized``
accepts; a non-empty target is refused unless ``overwrite=True``; a finished save leaves nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ckpt_helpers import HERE, quantize_tiny, tiny_llama

#: A model big enough that its save spans many 1 MB shards (about 30 MB of FP8), built without calibration.
KILL_SCRIPT = r"""
import sys, torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from fp8_linear import FP8Linear, save_quantized
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                                     num_attention_heads=8, num_key_value_heads=8)).eval()
for name, mod in list(model.named_modules()):
    if isinstance(mod, nn.Linear) and name != "lm_head":
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, FP8Linear.from_linear(mod, "fp8-dynamic"))
print("SAVING", flush=True)
save_quantized(model, sys.argv[1], max_shard_size="1MB")
print("SAVED", flush=True)
"""
POLL_S = 0.002
WAIT_S = 300


def _siblings(parent: str, name: str = "") -> list[str]:
    """The hidden work folders of saves into ``parent`` (``.fp8-XXXXXXXX``, see fp8_linear/checkpoint/swap.py)."""
    from fp8_linear.checkpoint.swap import WORK_PREFIX

    return [os.path.join(parent, f) for f in os.listdir(parent) if f.startswith(WORK_PREFIX)]


def test_killed_save_leaves_nothing_loadable(tmp_path):
    from fp8_linear import CheckpointError, load_quantized
    from fp8_linear.checkpoint import INCOMPLETE_MARKER

    target = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(target)], stdout=subprocess.PIPE, text=True,
                            cwd=HERE, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        assert proc.stdout.readline().strip() == "SAVING"
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # kill once the first shard is being written
            tmps = _siblings(str(tmp_path), "ckpt")
            if tmps and any(f.startswith("model-") for f in os.listdir(tmps[0])):
                break
            time.sleep(POLL_S)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "the save finished before it could be killed"
    assert not target.exists()
    leftovers = _siblings(str(tmp_path), "ckpt")
    assert leftovers, "expected the unfinished temporary folder"
    for folder in leftovers:
        assert os.path.exists(os.path.join(folder, INCOMPLETE_MARKER))
        with pytest.raises(CheckpointError, match="never finished"):
            load_quantized(folder)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_quantized(target)
    # the next save into the same target removes the dead save's leftover (and only that)
    from fp8_linear import save_quantized

    save_quantized(quantize_tiny(tiny_llama(seed=24, num_hidden_layers=1), "fp8-dynamic"), target)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


@pytest.fixture(scope="module")
def small_quantized():
    return quantize_tiny(tiny_llama(seed=21, num_hidden_layers=1), "fp8-dynamic")


def test_refuses_non_empty_folder(small_quantized, tmp_path):
    from fp8_linear import CheckpointError, save_quantized

    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=f"path: expected a new or empty folder, got '{target}' \\(not empty"):
        save_quantized(small_quantized, target)
    assert os.listdir(target) == ["notes.txt"] and _siblings(str(tmp_path), "ckpt") == []


def test_refuses_existing_file(small_quantized, tmp_path):
    from fp8_linear.checkpoint import CheckpointExistsError, save_quantized

    target = tmp_path / "ckpt"
    target.write_text("a file")
    with pytest.raises(CheckpointExistsError, match="path: expected a new or empty folder"):
        save_quantized(small_quantized, target)
    assert isinstance(CheckpointExistsError("x"), FileExistsError)


def test_empty_folder_and_overwrite(small_quantized, tmp_path):
    from fp8_linear import FP8Linear, load_quantized, save_quantized

    target = tmp_path / "ckpt"
    target.mkdir()
    save_quantized(small_quantized, target)  # an empty folder is fine
    other = quantize_tiny(tiny_llama(seed=22, num_hidden_layers=1), "fp8-channel")
    save_quantized(other, target, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary or old folder left behind
    loaded = load_quantized(target, dtype=torch.float32)
    assert {m.scheme.name for m in loaded.modules() if isinstance(m, FP8Linear)} == {"fp8-channel"}


def test_refuses_unquantized_model(tmp_path):
    from fp8_linear import CheckpointError, save_quantized

    with pytest.raises(CheckpointError, match="model: expected at least one FP8Linear module .*got none"):
        save_quantized(tiny_llama(seed=23, num_hidden_layers=1), tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


def test_refuses_non_model(tmp_path):
    from fp8_linear import save_quantized

    with pytest.raises(TypeError, match="model: expected a transformers PreTrainedModel, got Linear"):
        save_quantized(torch.nn.Linear(4, 4), tmp_path / "ckpt")
