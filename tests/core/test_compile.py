"""``FP8Linear`` under ``torch.compile`` (docs/design.md section 4): zero graph breaks for every preset
and backend, and compiled outputs bitwise equal to eager.

CPU: the emulated backend (``torch._dynamo.explain`` per preset, ``fullgraph=True`` compiled output
bitwise the eager one under ``aot_eager`` and inductor, a small model of several layers). Inductor's FX
graph cache is off in these tests: its key leaves out the vector ISA that ``ATEN_CPU_CAPABILITY``
selects, so a graph cached by a run under another capability comes back with the wrong vector width
(wrong outputs under avx2, a C++ compile error under default; tests/repro/inductor_cpu_isa_cache.py). GPU (marked): every preset on each backend
that can run it (sm90, cuBLASLt, emulated, forced through ``FP8_LINEAR_BACKEND``), ``explain`` at zero
breaks and ``mode="reduce-overhead"`` (CUDA graphs) bitwise equal to eager over fresh inputs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8_linear import FP8Linear
from fp8_linear.backends import BACKEND_NAMES, get_backend

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic", "fp8-block"]
#: Calibrated input amax of the static presets (inputs are N(0, 1) * 2).
INPUT_AMAX = 7.0
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.dtype])


def _layer(preset: str, k: int, n: int, device="cpu", dtype=torch.float32) -> FP8Linear:
    lin = nn.Linear(k, n, bias=True, device=device, dtype=dtype)
    return FP8Linear.from_linear(lin, preset, input_amax=INPUT_AMAX)


class _Mlp(nn.Module):
    """gate/up -> SiLU * up -> down, as in a Llama MLP, all FP8Linear."""

    def __init__(self, preset: str, hidden: int, inter: int, device="cpu", dtype=torch.float32):
        super().__init__()
        self.gate = _layer(preset, hidden, inter, device, dtype)
        self.up = _layer(preset, hidden, inter, device, dtype)
        self.down = _layer(preset, inter, hidden, device, dtype)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """A fresh dynamo, and inductor compiling for this process's vector ISA: no FX graph (or AOTAutograd)
    cache entry made under another ``ATEN_CPU_CAPABILITY`` is loaded (the cache key lacks the ISA)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("preset", PRESETS)
def test_no_graph_breaks_on_cpu(preset):
    mod = _layer(preset, 200, 136)  # K not a multiple of 128: a partial last group / block
    x = torch.randn(3, 5, 200) * 2
    assert mod.backend == "emulated"
    ex = torch._dynamo.explain(mod)(x)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("preset", PRESETS)
def test_fullgraph_compile_is_bitwise_eager_on_cpu(preset, backend):
    # aot_eager: our ops traced through their fake impls and functionalized, run as ATen ops. inductor:
    # the same, with SiLU * up generated as one C++ kernel for this CPU's vector ISA.
    model = _Mlp(preset, 192, 320)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    for m in (1, 7):
        x = torch.randn(m, 192) * 2
        assert torch.equal(compiled(x), model(x)), f"{preset} M={m}"


def test_model_of_several_layers_has_no_graph_breaks():
    model = nn.Sequential(*[_Mlp(p, 128, 256) for p in PRESETS])
    ex = torch._dynamo.explain(model)(torch.randn(4, 128))
    assert ex.graph_break_count == 0, ex.break_reasons


def test_a_replaced_weight_is_planned_again_and_traced_without_breaks():
    mod = _layer("fp8-dynamic", 64, 48)
    first = mod._plan
    mod._parameters["weight"] = nn.Parameter(mod.weight.detach().clone(), requires_grad=False)
    mod.check()  # what a loader does after materializing tensors: validates and plans
    assert mod._plan is not first and mod._plan.weight is mod.weight
    ex = torch._dynamo.explain(mod)(torch.randn(2, 64))
    assert ex.graph_break_count == 0, ex.break_reasons


# --------------------------------------------------------------------------- GPU
GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _gpu_layer_or_skip(fp8_env, backend: str, preset: str, k: int = 1024, n: int = 768) -> FP8Linear:
    """An ``FP8Linear`` on the GPU forced onto ``backend`` (made under the forced setting, so that no other
    backend is asked, or built); skipped with the backend's reason where it cannot run the preset."""
    fp8_env(FP8_LINEAR_BACKEND=backend)
    mod = _layer(preset, k, n, "cuda", torch.bfloat16)
    ok, why = get_backend(backend).can_implement(mod)
    if not ok:
        pytest.skip(f"{backend} cannot run {preset}: {why}")
    assert mod.backend == backend
    return mod


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU with FP8 (compute capability >= 8.9)")
def test_no_graph_breaks_on_gpu(fp8_env, preset, backend):
    mod = _gpu_layer_or_skip(fp8_env, backend, preset)
    ex = torch._dynamo.explain(mod)(torch.randn(2, 3, 1024, device="cuda", dtype=torch.bfloat16))
    assert ex.graph_break_count == 0, ex.break_reasons


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU with FP8 (compute capability >= 8.9)")
def test_reduce_overhead_is_bitwise_eager_on_gpu(fp8_env, preset, backend):
    mod = _gpu_layer_or_skip(fp8_env, backend, preset)
    compiled = torch.compile(mod, mode="reduce-overhead", fullgraph=True)
    for m in (1, 16):
        for _ in range(3):  # warm-up, capture, replays
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16) * 2
            out = compiled(x).clone()
            ref = mod(x)
            assert torch.equal(_bits(out), _bits(ref)), f"{preset} on {backend}, M={m}"


def test_dynamic_per_tensor_activations_trace_and_match_eager():
    """AutoFP8 ``dynamic`` checkpoints: a per-tensor activation scale computed per call."""
    from fp8_linear import QuantScheme
    from fp8_linear.backends.base import MODE_DYNAMIC_TENSOR

    mod = FP8Linear.from_linear(nn.Linear(200, 72), QuantScheme("dyn-tensor", "tensor", True, "tensor"))
    assert mod.input_scale is None and mod._plan.spec.mode == MODE_DYNAMIC_TENSOR
    x = torch.randn(3, 200) * 2
    ex = torch._dynamo.explain(mod)(x)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert torch.equal(torch.compile(mod, fullgraph=True)(x), mod(x))
