"""QuantScheme presets (docs/design.md section 3) and normalization of equivalent spellings."""

from __future__ import annotations

import pytest
import torch

from fp8_linear import PRESETS, QuantScheme, resolve_scheme


def test_presets_match_the_design_table():
    table = {
        "fp8-tensor": ("tensor", False, "tensor"),
        "fp8-channel": ("channel", False, "tensor"),
        "fp8-dynamic": ("channel", True, "token"),
        "fp8-block": ("block", True, "group"),
    }
    assert {n: (s.weight_granularity, s.activation_dynamic, s.activation_granularity) for n, s in PRESETS.items()} == table
    assert all(s.fmt == "e4m3" and s.name == n for n, s in PRESETS.items())
    assert resolve_scheme("fp8-block") is PRESETS["fp8-block"]


@pytest.mark.parametrize("spelling,canonical", [
    ("e4m3", "e4m3"), ("E4M3", "e4m3"), (torch.float8_e4m3fn, "e4m3"), ("E5M2", "e5m2"), (torch.float8_e5m2, "e5m2"),
])
def test_format_spellings_normalize(spelling, canonical):
    s = QuantScheme("s", "channel", False, "tensor", fmt=spelling)
    assert s.fmt == canonical
    assert s == QuantScheme("s", "channel", False, "tensor", fmt=canonical)
    assert hash(s) == hash(QuantScheme("s", "channel", False, "tensor", fmt=canonical))


def test_with_revalidates():
    s = PRESETS["fp8-dynamic"].with_(fmt=torch.float8_e5m2)
    assert s.fmt == "e5m2" and PRESETS["fp8-dynamic"].fmt == "e4m3"
    with pytest.raises(ValueError, match="activation_granularity"):
        PRESETS["fp8-dynamic"].with_(activation_dynamic=False)
