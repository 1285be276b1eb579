"""Checkpoints written by llm-compressor load with ``load_quantized`` and reproduce llm-compressor's
own model: tiny fixtures in CI (``tests/fixtures/make_llmcompressor_fixtures.py`` wrote them and
llm-compressor's logits), full-size SmolLM2 where llm-compressor is installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from safetensors.torch import load_file

from ckpt_helpers import FIXTURES, outputs_of
from helpers import calc_diff

#: llm-compressor scheme -> our preset with the same granularities.
TWINS = {"FP8": "fp8-tensor", "FP8_DYNAMIC": "fp8-dynamic", "FP8_BLOCK": "fp8-block"}
FULL_SIZE_SCHEMES = ("FP8", "FP8_DYNAMIC")
CALIB_SAMPLES, CALIB_LEN = 8, 128

# Matching llm-compressor's logits, derived from the numerics (docs/design.md section 7).
# Both sides dequantize the same FP8 weights and multiply in fp32, so a token's logits differ only by
# fp32 summation order (calc_diff ~1e-14 measured) -- unless some activation lies so close to an e4m3
# rounding midpoint that the summation-order change moves it across: one "flip" changes that element by
# one e4m3 step. Flips are rare (3 of the ~60 000 activation roundings of the FP8_DYNAMIC fixture under
# ATEN_CPU_CAPABILITY=default against the AVX-512 machine that wrote it; all in one token), but they
# are a property of the CPU, not of the code, so the test bounds them instead of forbidding them.
#: Per-token calc_diff of fp32 summation order alone (measured <= 3e-13 under default, avx2, avx512).
FP32_ORDER_BAR = 1e-10
#: Per-token calc_diff of a token whose activations flipped: a row of K >= 144 roundings carries the
#: quantization error of the token (calc_diff below 1e-3 against the unquantized model); one flip adds one
#: full step (12x the mean squared rounding error), so a few flips add about 4 * 12 / 144 = 1/3 of it.
#: Measured 1.5e-7 for the one flipped token.
FLIP_BAR = 1e-4
#: Largest share of tokens that may carry a flip (the census below finds candidates in most positions,
#: so this bound, not the census, is what keeps the test sharp: 1 of 48 tokens flipped when measured).
MAX_FLIPPED_SHARE = 0.125
#: fp32 unit roundoff: a dot product of length K summed in another order moves by at most K * 2**-24
#: of the sum of its terms' magnitudes (the farthest a CPU change can move an activation of width K).
FP32_UNIT_ROUNDOFF = 2.0**-24
E4M3_MAX = 448.0


def _e4m3_midpoints() -> torch.Tensor:
    """Rounding midpoints between consecutive finite e4m3 values (fp64, sorted), from all 256 bytes."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    grid = torch.unique(vals[torch.isfinite(vals)])
    return (grid[1:] + grid[:-1]) / 2


def flip_candidates(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: positions where some FP8Linear input ``[B, T, K]`` lies within ``K`` x
    :data:`FP32_UNIT_ROUNDOFF` (relative to its row's largest value, in e4m3 units) of a rounding midpoint, i.e. where another summation order
    could flip its rounding. The scale is restated here (static ``input_scale``, or ``amax / 448`` per
    token / 1x128 group), independent of the package's quantizer."""
    from fp8_linear import FP8Linear

    mids = _e4m3_midpoints()
    risky = torch.zeros(input_ids.shape, dtype=torch.bool)

    def hook(mod, args, _out):
        x = args[0].double()
        b, t, k = x.shape
        if mod.input_scale is not None:
            s = mod.input_scale.double().reshape(1, 1, 1)
        elif mod.scheme.activation_granularity == "token":
            s = x.abs().amax(-1, keepdim=True) / E4M3_MAX
        else:
            g = x.abs().reshape(b, t, k // 128, 128).amax(-1, keepdim=True) / E4M3_MAX
            s = g.expand(b, t, k // 128, 128).reshape(b, t, k)
        v = (x / s).clamp(-E4M3_MAX, E4M3_MAX)
        i = torch.searchsorted(mids, v.contiguous()).clamp(1, len(mids) - 1)
        dist = torch.minimum((v - mids[i]).abs(), (v - mids[i - 1]).abs())
        reach = k * FP32_UNIT_ROUNDOFF * v.abs().amax(-1, keepdim=True)
        risky.logical_or_((dist < reach).any(-1))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, FP8Linear)]
    try:
        outputs_of(model, {"input_ids": input_ids})
    finally:
        for h in handles:
            h.remove()
    return risky


def assert_matches_up_to_flips(ours: torch.Tensor, theirs: torch.Tensor, candidates: torch.Tensor) -> None:
    """``ours`` / ``theirs``: ``[B, T, V]`` logits. Every token within :data:`FP32_ORDER_BAR`, except flipped
    ones: at most :data:`MAX_FLIPPED_SHARE` of them, each within :data:`FLIP_BAR`, each at or after a flip
    candidate of its sequence (a flip changes its own and later positions only); top-1 equal wherever
    llm-compressor's top-1 margin exceeds twice the token's largest logit difference."""
    b, t, _ = ours.shape
    cd = torch.tensor([[calc_diff(ours[i, j], theirs[i, j]) for j in range(t)] for i in range(b)])
    flipped = cd > FP32_ORDER_BAR
    assert flipped.float().mean() <= MAX_FLIPPED_SHARE, f"{int(flipped.sum())} of {b * t} tokens differ beyond fp32 order"
    assert cd.max() <= FLIP_BAR, f"worst token calc_diff {float(cd.max()):.3g} > {FLIP_BAR}"
    reachable = candidates.cummax(dim=1).values  # a flip at position p reaches positions >= p
    assert not (flipped & ~reachable).any(), f"tokens {(flipped & ~reachable).nonzero().tolist()} differ without a flip candidate"
    assert_top1_agrees(ours, theirs)


def assert_top1_agrees(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Top-1 equal at every position ``[..., V]`` where ``theirs``' top-1 margin exceeds twice the largest
    logit difference there (below that, a flip may swap two near-equal tokens)."""
    top2 = theirs.topk(2, dim=-1).values
    decided = (top2[..., 0] - top2[..., 1]) > 2 * (ours - theirs).abs().amax(-1)
    agree = ours.argmax(-1) == theirs.argmax(-1)
    assert agree[decided].all(), f"top-1 differs at {(~agree & decided).nonzero().tolist()}"
    assert decided.float().mean() > 0.9, "too few positions decide top-1"


def _installed(name: str) -> bool:
    """A real installed package (a namespace folder such as tests/fixtures/llmcompressor does not count)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None


needs_llmcompressor = pytest.mark.skipif(not (_installed("llmcompressor") and _installed("datasets")),
                                         reason="llm-compressor (with datasets) is not installed (the tiny fixtures cover CI)")


@pytest.mark.parametrize("scheme", sorted(TWINS))
def test_llmcompressor_fixture_matches_their_model(scheme):
    from fp8_linear import FP8Linear, PRESETS, load_quantized

    folder = os.path.join(FIXTURES, "llmcompressor", scheme)
    expected = load_file(os.path.join(folder, "expected.safetensors"))
    model = load_quantized(folder, dtype=torch.float32)
    fp8 = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert fp8 and all(m.scheme == PRESETS[TWINS[scheme]] for m in fp8)
    assert not isinstance(model.lm_head, FP8Linear)
    ours = outputs_of(model, {"input_ids": expected["input_ids"]})
    assert_matches_up_to_flips(ours, expected["logits"], flip_candidates(model, expected["input_ids"]))


@pytest.fixture(scope="session")
def smollm2_hf_dir(smollm2, tmp_path_factory) -> str:
    """SmolLM2 as a float32 Hugging Face folder (llm-compressor's oneshot reads the model from disk)."""
    from safetensors.torch import save_model

    model, tok = smollm2
    folder = str(tmp_path_factory.mktemp("smollm2_hf"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the GGUF "quantization" is already dequantized
    config["architectures"] = [type(model).__name__]
    type(model.config).from_dict(config).save_pretrained(folder)
    save_model(model, os.path.join(folder, "model.safetensors"))
    tok.save_pretrained(folder)
    return folder


@needs_llmcompressor
@pytest.mark.parametrize("scheme", FULL_SIZE_SCHEMES)
def test_llmcompressor_smollm2_full_size(scheme, smollm2_hf_dir, smollm2_prompt, tmp_path):
    """oneshot on the real SmolLM2 (calibration split of the embedded corpus), then the same top-1 tokens
    on the 256-token eval prompt from their in-memory model and from ``load_quantized`` of what they saved."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fp8_linear import load_quantized
    from fp8_linear.calibration.data import corpus_text

    tok = AutoTokenizer.from_pretrained(smollm2_hf_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_hf_dir, dtype=torch.float32).eval()
    kw = {}
    if scheme == "FP8":
        ids = tok(corpus_text("calib")[:60000], return_tensors="pt").input_ids[0]
        rows = [ids[i * CALIB_LEN:(i + 1) * CALIB_LEN].tolist() for i in range(CALIB_SAMPLES)]
        kw = dict(dataset=Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * CALIB_LEN] * CALIB_SAMPLES}),
                  num_calibration_samples=CALIB_SAMPLES, max_seq_length=CALIB_LEN, processor=tok)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]), **kw)
    theirs = outputs_of(model, smollm2_prompt)
    model.save_pretrained(tmp_path / "ckpt")
    ours = outputs_of(load_quantized(tmp_path / "ckpt", dtype=torch.float32), smollm2_prompt)
    assert_top1_agrees(ours, theirs)
