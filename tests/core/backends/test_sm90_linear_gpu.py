"""The sm90 backend's linear op (``fp8_linear.backends.sm90.sm90_linear``: the extension's
``linear_fwd`` / ``act_quant`` in one host call) on an sm_90 GPU.

The layer's output is bitwise what the public GEMM gives on the same quantized activation
(``quantize_fp8``-equivalent torch ops / Triton, then ``fp8_gemm`` on the sm90 backend) over presets,
input dtypes, M, (N, K) and bias; batched, strided and empty inputs; ``act_quant`` alone gives the
CPU path's FP8 bits and scales and the Triton path's bytes; CUDA graph capture replays bitwise.
"""

from __future__ import annotations

import pytest
import torch

from helpers import calc_diff

from fp8_linear import FP8Linear, fp8_gemm, settings
from fp8_linear.formats import MIN_SCALE, fmt_max
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs a CUDA device of compute capability 9.0")]

PRESETS = ["fp8-tensor", "fp8-channel", "fp8-dynamic"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 7, 64, 129, 2048]
NKS = [(4096, 4096), (200, 1040), (8, 16)]
#: Calibrated input amax of the static presets: x ~ N(0, 1) saturates a few values.
INPUT_AMAX = 3.5
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.dtype])


_modules: dict = {}


def _module(preset: str, n: int, k: int, bias: bool, dtype: torch.dtype) -> FP8Linear:
    """One FP8Linear per (preset, N, K, bias, dtype), built once (bias in the model's dtype, as a
    Linear converted from a bf16/fp16 model has it)."""
    key = (preset, n, k, bias, dtype)
    if key not in _modules:
        lin = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=dtype)
        _modules[key] = FP8Linear.from_linear(lin, preset, input_amax=INPUT_AMAX)
    return _modules[key]


def _reference(mod: FP8Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer through the public pieces: Triton quantization of x, then fp8_gemm (sm90 backend)."""
    x2 = x.reshape(-1, mod.in_features)
    if mod.input_scale is not None:
        q, sa = quantize_unchecked(x2, mod.weight.dtype, mod.input_scale), mod.input_scale
    else:
        q, sa = dynamic_quantize(x2, mod.weight.dtype, mod.scheme.activation_granularity)
    out = fp8_gemm(q, mod.weight, sa, mod.weight_scale, mod.bias, x.dtype)
    return out.reshape(*x.shape[:-1], mod.out_features)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", NKS)
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preset", PRESETS)
def test_linear_op_bitwise_equals_quantize_then_gemm(preset, dtype, m, n, k, bias):
    mod = _module(preset, n, k, bias, dtype)
    assert mod.backend == "sm90", mod._plan.reason
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    out, ref = mod(x), _reference(mod, x)
    assert out.dtype == dtype and out.shape == (m, n)
    assert torch.isfinite(out).all()
    assert torch.equal(_bits(out), _bits(ref)), f"{preset} {dtype} M={m} N={n} K={k}: calc_diff {calc_diff(out, ref):.3g}"


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", [(4096, 4096), (200, 1040), (4104, 16400)])
@pytest.mark.parametrize("m", MS)
def test_block_layer_bitwise_equals_quantize_then_gemm(m, n, k, bias):
    from fp8_linear.backends.sm90 import block_scales_available

    if not block_scales_available()[0]:
        pytest.skip(block_scales_available()[1])
    mod = _module("fp8-block", n, k, bias, torch.bfloat16)
    assert mod.backend == "sm90", mod._plan.reason
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out, ref = mod(x), _reference(mod, x)
    assert torch.isfinite(out).all() and out.shape == (m, n)
    assert torch.equal(_bits(out), _bits(ref)), f"M={m} N={n} K={k}: calc_diff {calc_diff(out, ref):.3g}"


@pytest.mark.parametrize("preset", PRESETS + ["fp8-block"])
def test_batched_strided_and_empty_inputs(preset):
    mod = _module(preset, 200, 1040, True, torch.bfloat16)
    x3 = torch.randn(3, 5, 1040, device="cuda", dtype=torch.bfloat16)  # [batch, seq, K]
    out = mod(x3)
    assert out.shape == (3, 5, 200) and torch.equal(_bits(out), _bits(_reference(mod, x3)))
    for x in (x3[0, 0], x3[:, 1:4], x3.transpose(0, 1)):  # 1-D; viewable and copying reshapes
        out = mod(x)
        assert out.shape == (*x.shape[:-1], 200) and torch.equal(_bits(out), _bits(_reference(mod, x)))
    empty = torch.empty(0, 1040, device="cuda", dtype=torch.bfloat16)
    assert mod(empty).shape == (0, 200)
    wide = torch.randn(9, 2 * 1040 + 8, device="cuda", dtype=torch.bfloat16)
    for x in (wide[:, :1040], wide[:, 8:1048]):  # row stride 2088; aligned and 16-byte-misaligned starts
        assert torch.equal(_bits(mod(x)), _bits(_reference(mod, x)))
    xt = torch.randn(1040, 4, device="cuda", dtype=torch.bfloat16).t()  # last dim not contiguous
    assert torch.equal(_bits(mod(xt)), _bits(_reference(mod, xt)))


def test_forced_backends_and_block_layers_choose_as_documented(fp8_env):
    mod = _module("fp8-dynamic", 256, 1040, False, torch.bfloat16)  # N, K multiples of 16: cuBLASLt can run it
    x = torch.randn(4, 1040, device="cuda", dtype=torch.bfloat16)
    fp8_env(FP8_LINEAR_BACKEND="cublaslt")
    mod(x)
    assert mod.backend == "cublaslt"
    fp8_env(FP8_LINEAR_BACKEND="sm90")
    assert mod.backend == "sm90"
    fp8_env(FP8_LINEAR_BACKEND=None)
    block = FP8Linear.from_linear(torch.nn.Linear(1024, 256, device="cuda"), "fp8-block")
    block(x[:, :1024])
    from fp8_linear.backends.sm90 import block_scales_available

    ok, why = block_scales_available()
    assert (block.backend == "sm90") is ok, block._plan.reason
    if not ok:
        assert why in block._plan.reason


# --------------------------------------------------------------- act_quant alone
def _ext():
    from fp8_linear.kernels import jit

    return jit.load()


def _hard_inputs(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(rows, k, device="cuda", dtype=torch.float32) * 3
    x[0, 0] = float("inf")
    x[0, -1] = float("-inf")
    x[-1, -1] = float("nan")
    if rows > 2:
        x[1] = 0  # all-zero row: MIN_SCALE
        x[2, : min(k, 5)] *= 1e4  # saturates under the static scale
    if rows > 3:
        x[3] = float("nan")  # all-NaN row
    return x.to(dtype)


def _same_fp8(q1: torch.Tensor, q2: torch.Tensor) -> bool:
    """Same FP8 bits, NaN positions compared as NaN-ness (the CPU keeps NaN's sign bit)."""
    a, b = q1.float(), q2.float()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(q1.view(torch.uint8)[~nan], q2.view(torch.uint8)[~nan])


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k", [(1, 16), (7, 48), (5, 100), (64, 1040), (129, 4096), (3, 16400)])
def test_act_quant_matches_cpu_and_triton(monkeypatch, fp8, dtype, rows, k):
    monkeypatch.delenv("FP8_LINEAR_FUSED_QUANT", raising=False)
    settings.reload()
    ext, code, m = _ext(), 0 if fp8 == torch.float8_e4m3fn else 1, fmt_max(fp8)
    x = _hard_inputs(rows, k, dtype)
    static = torch.tensor([0.0123], device="cuda")
    ours = {
        "static": ext.act_quant(x, code, 0, static, m, MIN_SCALE),
        "token": ext.act_quant(x, code, 1, None, m, MIN_SCALE),
        "group": ext.act_quant(x, code, 2, None, m, MIN_SCALE),
    }
    xc, sc = x.cpu(), static.cpu()
    cpu = {
        "static": (quantize_unchecked(xc, fp8, sc), sc),
        "token": dynamic_quantize(xc, fp8, "token"),
        "group": dynamic_quantize(xc, fp8, "group"),
    }
    triton = {  # today's CUDA path (fp8_linear/kernels/quant_triton.py)
        "static": (quantize_unchecked(x, fp8, static), static),
        "token": dynamic_quantize(x, fp8, "token"),
        "group": dynamic_quantize(x, fp8, "group"),
    }
    for mode in ours:
        q, s = ours[mode]
        assert q.dtype == fp8 and q.shape == x.shape, mode
        assert _same_fp8(q.cpu(), cpu[mode][0]), f"{mode}: FP8 bits differ from the CPU path"
        assert torch.equal(s.cpu(), cpu[mode][1]), f"{mode}: scales differ from the CPU path"
        assert torch.equal(q.view(torch.uint8), triton[mode][0].view(torch.uint8)), f"{mode}: bytes differ from Triton"
        assert torch.equal(s, triton[mode][1]), mode


def test_act_quant_row_strided_and_errors():
    ext, m = _ext(), fmt_max(torch.float8_e4m3fn)
    wide = torch.randn(33, 1024 + 24, device="cuda", dtype=torch.float16)
    for x in (wide[:, :1024], wide[:, 3:1027]):  # vector path and the unaligned scalar path
        q1, s1 = ext.act_quant(x, 0, 1, None, m, MIN_SCALE)
        q2, s2 = ext.act_quant(x.contiguous(), 0, 1, None, m, MIN_SCALE)
        assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s1, s2)
    with pytest.raises(RuntimeError, match="contiguous last dim"):
        ext.act_quant(wide.t(), 0, 1, None, m, MIN_SCALE)
    with pytest.raises(RuntimeError, match="static"):
        ext.act_quant(wide, 0, 0, None, m, MIN_SCALE)
    with pytest.raises(RuntimeError, match="act_mode"):
        ext.linear_fwd(wide, torch.zeros(8, 1048, device="cuda", dtype=torch.float8_e4m3fn), None,
                       torch.ones(1, device="cuda"), None, 7, 1, m, MIN_SCALE)


# --------------------------------------------------------------- graphs and compile
class _Block(torch.nn.Module):
    """Two FP8Linears (per-token dynamic, then static per-tensor) with an activation between."""

    def __init__(self, k: int, hidden: int):
        super().__init__()
        self.up = FP8Linear.from_linear(torch.nn.Linear(k, hidden, device="cuda", dtype=torch.bfloat16), "fp8-dynamic")
        self.down = FP8Linear.from_linear(torch.nn.Linear(hidden, k, device="cuda", dtype=torch.bfloat16),
                                          "fp8-tensor", input_amax=INPUT_AMAX)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def test_cuda_graph_capture_replays_bitwise():
    model = _Block(1024, 2048)
    static_x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up: decisions, build, config choice
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    assert model.up.backend == "sm90" and model.down.backend == "sm90"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = model(static_x)
    for _ in range(2):
        x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
        static_x.copy_(x)
        static_out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = model(x)
        assert torch.equal(_bits(static_out), _bits(ref))


def test_torch_compile_runs_the_op_bitwise():
    mod = _module("fp8-channel", 200, 1040, True, torch.bfloat16)
    x = torch.randn(5, 1040, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(mod)
    out = compiled(x)
    eager = mod(x)
    torch.cuda.synchronize()
    assert out.shape == eager.shape and torch.equal(_bits(out), _bits(eager))
