"""Session fixtures of the checkpoint tests: each real model quantized once per preset and saved once.

- ``smollm2_prompt``: 256 token ids of the eval split of the embedded corpus (calibration uses the
  disjoint calib split); the bitwise round trips run its first :data:`ROUNDTRIP_TOKENS` (the
  emulated FP8 forward of SmolLM2 costs about 0.1 s per token on 2 CPU cores).
- ``smollm2_ckpts`` / ``minilm_ckpts``: ``{preset: Saved}``, built lazily and shared by every test.
- ``fresh_outputs``: one fresh Python process loads all eight checkpoints and runs them.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_helpers import PRESET_NAMES, fast_scheme, outputs_of, run_fresh_loads

PROMPT_TOKENS = 256
ROUNDTRIP_TOKENS = 32
CALIB_SAMPLES, CALIB_LEN = 4, 64
MINILM_SENTENCES = 3


@dataclass
class Saved:
    """A quantized model, the checkpoint it was saved to, the inputs file and its outputs before saving."""

    model: torch.nn.Module
    path: str
    inputs: str
    outputs: torch.Tensor


def _calib_texts() -> list[str]:
    from fp8_linear.calibration.data import corpus_text

    text = corpus_text("calib")
    step = len(text) // CALIB_SAMPLES
    return [text[i * step: i * step + 600] for i in range(CALIB_SAMPLES)]


@pytest.fixture(scope="session")
def smollm2_prompt(smollm2) -> dict:
    from fp8_linear.calibration.data import corpus_text

    _, tok = smollm2
    ids = tok(corpus_text("eval")[:4000], return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
    if ids.shape[1] != PROMPT_TOKENS:
        raise RuntimeError(f"eval split gave {ids.shape[1]} tokens, expected {PROMPT_TOKENS}")
    return {"input_ids": ids}


def _quantize_and_save(model, tok, preset, batch, root) -> Saved:
    from fp8_linear import quantize_model, save_quantized

    q = quantize_model(copy.deepcopy(model), _calib_texts(), fast_scheme(preset), tokenizer=tok,
                       max_samples=CALIB_SAMPLES, seq_len=CALIB_LEN, progress=False, gptq=False)
    path = save_quantized(q, os.path.join(root, preset), tokenizer=tok)
    inputs = os.path.join(root, f"{preset}.inputs.safetensors")
    save_file({k: v.contiguous() for k, v in batch.items()}, inputs)
    return Saved(q, path, inputs, outputs_of(q, batch))


class _Lazy(dict):
    """``{preset: Saved}`` built on first access, so a test selecting one preset pays for one."""

    def __init__(self, build):
        super().__init__()
        self._build = build

    def __missing__(self, preset):
        self[preset] = value = self._build(preset)
        return value


@pytest.fixture(scope="session")
def smollm2_ckpts(smollm2, smollm2_prompt, tmp_path_factory):
    model, tok = smollm2
    root = str(tmp_path_factory.mktemp("smollm2_ckpts"))
    batch = {"input_ids": smollm2_prompt["input_ids"][:, :ROUNDTRIP_TOKENS]}
    return _Lazy(lambda p: _quantize_and_save(model, tok, p, batch, root))


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    return AutoModel.from_pretrained(minilm_dir, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def minilm_ckpts(minilm, tmp_path_factory):
    from fp8_linear.calibration.data import corpus_text

    model, tok = minilm
    text = corpus_text("eval")
    batch = dict(tok([text[i * 300: i * 300 + 200] for i in range(MINILM_SENTENCES)], padding=True,
                     truncation=True, max_length=64, return_tensors="pt"))
    root = str(tmp_path_factory.mktemp("minilm_ckpts"))
    return _Lazy(lambda p: _quantize_and_save(model, tok, p, batch, root))


@pytest.fixture(scope="session")
def fresh_outputs(smollm2_ckpts, minilm_ckpts, tmp_path_factory) -> dict:
    """``{(model_name, preset): output tensor}`` computed by a fresh process from the saved checkpoints."""
    root = str(tmp_path_factory.mktemp("fresh_outputs"))
    jobs, keys = [], []
    for name, ckpts in (("smollm2", smollm2_ckpts), ("minilm", minilm_ckpts)):
        for preset in PRESET_NAMES:
            s = ckpts[preset]
            jobs.append({"ckpt": s.path, "inputs": s.inputs, "out": os.path.join(root, f"{name}-{preset}.safetensors"),
                         "dtype": "float32"})
            keys.append((name, preset))
    run_fresh_loads(jobs)
    return {k: load_file(j["out"])["output"] for k, j in zip(keys, jobs)}
