"""FP8 checkpoints of other tools (vLLM/AutoFP8 ``fp8``, DeepSeek / FineGrainedFP8 blocks, ``fbgemm_fp8``,
ModelOpt), written from their contracts by ``tests/fixtures/make_foreign_fixtures.py``, load as
FP8Linear modules of the equivalent scheme whose dequantized weights are exactly the written ones."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from ckpt_helpers import FIXTURES, activation_dequant64, dequant64, outputs_of
from helpers import calc_diff, rounding_bar

FIXTURE_SCRIPT = os.path.join(FIXTURES, "make_foreign_fixtures.py")
# Loaded by path: putting tests/fixtures on sys.path would make its llmcompressor/ folder importable.
_spec = importlib.util.spec_from_file_location("make_foreign_fixtures", FIXTURE_SCRIPT)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
KINDS, TINY_LLAMA, write_fixture = _fixtures.KINDS, _fixtures.TINY_LLAMA, _fixtures.write_fixture

#: kind -> (weight granularity, dynamic activations, activation granularity) of the FP8Linear it must become.
EXPECTED = {
    "autofp8": ("tensor", False, "tensor"),
    "autofp8-dynamic": ("tensor", True, "tensor"),
    "deepseek-block": ("block", True, "group"),
    "finegrained": ("block", True, "group"),
    "finegrained-static": ("block", False, "tensor"),
    "fbgemm": ("channel", True, "token"),
    "modelopt": ("tensor", False, "tensor"),
    "modelopt-config": ("tensor", False, "tensor"),
}
#: FP8 activations vs fp32 activations over a random 2-layer model (gain 5): measured 0.007-0.0085
#: for every kind; the bar catches a wrong mapping (a misread scale or layout gives ~1).
MODEL_BAR = 0.02


@pytest.mark.parametrize("kind", KINDS)
def test_foreign_checkpoint_loads_as_equivalent_scheme(kind, tmp_path):
    from fp8_linear import FP8Linear, load_quantized

    ref = write_fixture(kind, str(tmp_path / kind))
    model = load_quantized(tmp_path / kind, dtype=torch.float32)
    fp8 = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    assert set(fp8) == set(ref["weights"])  # lm_head stays a plain Linear
    assert isinstance(model.lm_head, torch.nn.Linear)
    for name, m in fp8.items():
        s = m.scheme
        assert (s.weight_granularity, s.activation_dynamic, s.activation_granularity) == EXPECTED[kind], name
        assert m.weight.dtype == torch.float8_e4m3fn and m.weight_scale.dtype == torch.float32
        assert torch.equal(dequant64(m.weight, m.weight_scale), ref["weights"][name]), name
        if ref["input_scales"]:
            assert m.input_scale.item() == ref["input_scales"][name]
        else:
            assert m.input_scale is None
    # One ragged layer (K = 320 = 2.5 groups) against fp64 math on independently quantized inputs:
    # the only error left is the final rounding to fp32.
    name = "model.layers.1.mlp.down_proj"
    x = torch.randn(7, fp8[name].in_features, generator=torch.Generator().manual_seed(11)) * 3
    static = ref["input_scales"].get(name)
    want = activation_dequant64(x, EXPECTED[kind][2], static) @ ref["weights"][name].t()
    with torch.inference_mode():
        got = fp8[name](x)
    assert calc_diff(got, want) <= rounding_bar(want, torch.float32)
    # The whole model runs and agrees with the float model holding the same dequantized weights.
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(12))
    assert calc_diff(outputs_of(model, {"input_ids": ids}), outputs_of(ref["float_model"], {"input_ids": ids})) < MODEL_BAR


def test_fbgemm_scale_upper_bound_is_reported(tmp_path, caplog):
    """fbgemm's ``activation_scale_ub`` has no FP8Linear equivalent: loading says so instead of hiding it."""
    from fp8_linear import load_quantized

    write_fixture("fbgemm", str(tmp_path / "fb"))
    with caplog.at_level("WARNING", logger="fp8_linear.checkpoint.load"):
        load_quantized(tmp_path / "fb", dtype=torch.float32)
    assert "activation_scale_ub=1200.0" in caplog.text


def test_fixture_script_entry_point(tmp_path):
    """The script's documented command line writes a loadable folder."""
    from fp8_linear import load_quantized

    subprocess.run([sys.executable, FIXTURE_SCRIPT, "--out", str(tmp_path), "fbgemm"], check=True, timeout=300,
                   capture_output=True)
    assert load_quantized(tmp_path / "fbgemm", dtype=torch.float32) is not None


def test_legacy_non_persistent_buffers_are_ignored(tmp_path):
    """Older writers stored non-persistent buffers (``rotary_emb.inv_freq``); transformers ignores them, so do we."""
    from safetensors.torch import load_file, save_file

    from fp8_linear import load_quantized

    write_fixture("autofp8", str(tmp_path / "old"))
    path = tmp_path / "old" / "model.safetensors"
    tensors = load_file(path)
    tensors["model.rotary_emb.inv_freq"] = torch.ones(24)
    save_file(tensors, path)
    model = load_quantized(tmp_path / "old", dtype=torch.float32)
    assert not torch.equal(model.model.rotary_emb.inv_freq, torch.ones(24))  # the model's own, not the stored one
