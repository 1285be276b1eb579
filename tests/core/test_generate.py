"""transformers' fast decode paths with ``FP8Linear`` models agree with eager (docs/serving.md).

The bundled SmolLM2-135M-Instruct with its decoder Linears replaced by ``FP8Linear.from_linear``
(static presets calibrated on the prompt), for every preset: the first 32 greedy tokens of
``generate`` with ``cache_implementation="static"`` (transformers compiles the decode step itself,
here with ``fullgraph=True``) and of ``generate`` on ``torch.compile(model.forward,
mode="reduce-overhead", fullgraph=True)`` equal those of eager ``generate``. Compiling is the cost:
the model keeps its first :data:`LAYERS` decoder layers (the same truncated model on every path),
and the tests are marked slow. CPU: the emulated backend; GPU (marked): the default backend.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from fp8_linear.backends import emulated
from fp8_models import swap_in_fp8

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
NEW_TOKENS = 32
#: Decoder layers kept (of 30): each compiled path compiles the whole forward.
LAYERS = 2
PROMPT = "The three primary colors are"
#: Static presets: the calibrated input amax times this margin (the generated tokens go past the prompt's range).
AMAX_MARGIN = 1.5


def _fp8_model(base, tok, preset: str, device: str, dtype: torch.dtype):
    model = copy.deepcopy(base)
    model.model.layers = model.model.layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    model = model.to(device=device, dtype=dtype)
    ids = tok(PROMPT, return_tensors="pt").input_ids.to(device)
    return swap_in_fp8(model, ids, preset, AMAX_MARGIN), ids


def _greedy(model, ids, **kw) -> torch.Tensor:
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **kw)
    return out[0, ids.shape[1]:]


def _compile_config(all_devices: bool):
    from transformers.generation.configuration_utils import CompileConfig

    cc = CompileConfig(fullgraph=True)
    if all_devices:
        cc._compile_all_devices = True  # transformers compiles on CUDA by default; the CPU asks for it
    return cc


def _check_paths(base, tok, preset: str, device: str, dtype: torch.dtype):
    torch._dynamo.reset()
    model, ids = _fp8_model(base, tok, preset, device, dtype)
    cache = emulated.weight_cache() if device == "cpu" else contextlib.nullcontext()
    # Inductor's FX graph cache key lacks the vector ISA that ATEN_CPU_CAPABILITY selects: a graph cached
    # under another capability comes back with the wrong vector width (tests/repro/inductor_cpu_isa_cache.py).
    no_fx_cache = (torch._inductor.config.patch(fx_graph_cache=False),
                   torch._functorch.config.patch(enable_autograd_cache=False))
    with torch.inference_mode(), cache, no_fx_cache[0], no_fx_cache[1]:
        eager = _greedy(model, ids)
        static = _greedy(model, ids, cache_implementation="static", compile_config=_compile_config(device == "cpu"))
        assert torch.equal(static, eager), f"{preset}: static-cache compiled {tok.decode(static)!r} vs eager {tok.decode(eager)!r}"
        twin = copy.deepcopy(model)
        twin.forward = torch.compile(twin.forward, mode="reduce-overhead", fullgraph=True)
        reduced = _greedy(twin, ids, cache_implementation="static", disable_compile=True)
        assert torch.equal(reduced, eager), f"{preset}: reduce-overhead {tok.decode(reduced)!r} vs eager {tok.decode(eager)!r}"
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_generate_matches_eager_on_cpu(smollm2, preset):
    base, tok = smollm2
    _check_paths(base, tok, preset, "cpu", torch.float32)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a CUDA GPU with FP8 (compute capability >= 8.9)")
@pytest.mark.parametrize("preset", PRESETS)
def test_compiled_generate_matches_eager_on_gpu(smollm2, preset):
    base, tok = smollm2
    _check_paths(base, tok, preset, "cuda", torch.bfloat16)
