"""Helpers of the checkpoint tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
FRESH_LOAD = os.path.join(HERE, "fresh_load.py")
#: Subprocess wall-clock limit (s): loading eight checkpoints on a busy 2-core CI box.
SUBPROCESS_TIMEOUT = 900
#: The four presets of docs/design.md section 3, in the order tests run them.
PRESET_NAMES = ("fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block")
#: Tiny Llama whose Linear shapes are multiples of 128 (compressed-tensors' 1x128 groups need that).
TINY_LLAMA = dict(vocab_size=256, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
#: Widen default init (std 0.02) so tiny random models have well-separated top-1 tokens.
WEIGHT_GAIN = 5.0


def fast_scheme(preset: str):
    """The preset with a min-max weight observer: same granularities and format, CI-fast calibration."""
    from fp8_linear import PRESETS

    return PRESETS[preset].with_(weight_observer="minmax")


def tiny_llama(seed: int = 0, **overrides) -> nn.Module:
    """A seeded random ``LlamaForCausalLM`` (fp32, eval) of :data:`TINY_LLAMA` plus ``overrides``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**dict(TINY_LLAMA, **overrides))).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(WEIGHT_GAIN)
    return model


def random_ids(shape: tuple[int, int], vocab: int, seed: int) -> torch.Tensor:
    """Seeded random token ids ``[B, T]`` int64."""
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def quantize_tiny(model: nn.Module, preset: str, seed: int = 1) -> nn.Module:
    """``quantize_model`` on seeded random token ids (4 x 32): min-max observers, no GPTQ, no progress bar
    (checkpoint tests need FP8 modules of every scheme, not the best rounding)."""
    from fp8_linear import quantize_model

    calib = list(random_ids((4, 32), model.config.vocab_size, seed))
    return quantize_model(model, calib, fast_scheme(preset), progress=False, gptq=False)


def outputs_of(model: nn.Module, batch: dict) -> torch.Tensor:
    """The model's main output on ``batch``: ``logits`` of a causal LM, else ``last_hidden_state``."""
    with torch.inference_mode():
        out = model(**batch)
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state).float()


def run_fresh_loads(jobs: list[dict]) -> list[dict]:
    """Run :data:`FRESH_LOAD` in a new Python process over ``jobs`` (see that script); its JSON report."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, FRESH_LOAD, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"fresh_load.py failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dequant64(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in fp64 for a 2-D FP8 weight ``[out, in]``; scale ``[1]``, ``[out, 1]`` or 128x128 blocks
    (restated here, independent of the package's ``expand_scale``)."""
    out, k = q.shape
    s = scale.double()
    if s.numel() == 1:
        full = s.reshape(1, 1).expand(out, k)
    elif s.shape == (out, 1):
        full = s.expand(out, k)
    else:
        full = s[torch.arange(out) // 128][:, torch.arange(k) // 128]
    return q.double() * full


def activation_dequant64(x: torch.Tensor, granularity: str, static_scale: float | None) -> torch.Tensor:
    """fp64 of FP8(e4m3)-quantized ``x`` ``[M, K]`` fp32 per the contract (``clamp(x / scale)`` cast, fp32):
    static per-tensor ``static_scale``, or dynamic ``amax / 448`` per ``tensor`` / ``token`` / 1x128 ``group``."""
    fmax = float(torch.finfo(torch.float8_e4m3fn).max)
    m, k = x.shape
    if static_scale is not None:
        full = torch.full((m, k), static_scale, dtype=torch.float32)
    elif granularity == "tensor":
        full = (x.abs().max() / fmax).expand(m, k)
    elif granularity == "token":
        full = (x.abs().amax(dim=1, keepdim=True) / fmax).expand(m, k)
    else:
        g = -(-k // 128)
        padded = torch.zeros(m, g * 128)
        padded[:, :k] = x.abs()
        full = (padded.reshape(m, g, 128).amax(dim=2) / fmax)[:, torch.arange(k) // 128]
    full = full.clamp(min=1e-12)
    q = torch.clamp(x / full, -fmax, fmax).to(torch.float8_e4m3fn)
    return q.double() * full.double()
