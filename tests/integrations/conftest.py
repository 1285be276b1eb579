"""Fixtures of the transformers-integration tests: high-precision checkpoints to quantize on load.

- ``tiny_bf16_dir``: a tiny random Llama (:mod:`integ_helpers`) saved in bf16.
- ``smollm2_bf16_dir``: the bundled SmolLM2-135M-Instruct saved as a bf16 HF folder (with its
  tokenizer), i.e. what a user's ``from_pretrained`` source looks like.
"""

from __future__ import annotations

import pytest
import torch

from integ_helpers import save_tiny


@pytest.fixture(scope="session")
def tiny_bf16_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "bf16")


@pytest.fixture(scope="session")
def smollm2_bf16_dir(tmp_path_factory) -> str:
    from fp8_linear.models import load_model

    try:
        model, tok = load_model("smollm2", dtype=torch.bfloat16)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    path = tmp_path_factory.mktemp("smollm2") / "bf16"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
