"""MoE tests: fresh random inputs each run; ``FP8_TEST_SEED`` replays one (the seed is printed on failure)."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_seed(request):
    seed = int(os.environ.get("FP8_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(seed)
    print(f"FP8_TEST_SEED={seed}")
    yield seed
