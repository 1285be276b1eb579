"""GPU tests of programmatic dependent launch (fp8_linear/kernels/include/pdl.h) on the sm90 kernels.

With PDL a kernel of ours starts while the previous one still runs; every kernel waits
(griddepcontrol.wait) before touching global memory. A missing or misplaced wait shows as a race: a
kernel reading a predecessor's output before it is complete, or writing a buffer (the caching
allocator reuses the previous layer's activation, scale and split-K workspace blocks) that the
predecessor still reads. So: chains of FP8Linear calls (activation quantization -> GEMM (split K
summed inside it) -> the next layer's quantization ...), captured in CUDA graphs with PDL on and off, replayed
with new inputs written between replays by plain torch kernels, must give bitwise the outputs of the
same chain run eagerly with PDL off; and the first layer matches fp64 math on its dequantized inputs
(docs/design.md section 7).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import zlib

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a CUDA device of compute capability 9.0", allow_module_level=True)

from helpers import KERNEL_FLOOR, calc_diff, gemm_ref64, rounding_bar  # noqa: E402

from fp8_linear.backends.sm90 import kernels_module  # noqa: E402
from fp8_linear.formats import MIN_SCALE, fmt_max  # noqa: E402

pytestmark = pytest.mark.gpu

kern = kernels_module()
jit = importlib.import_module(kern.__name__ + ".jit")
ext = jit.load()

E4 = torch.float8_e4m3fn
FMAX = fmt_max(E4)
DEV = "cuda"
BLOCK = 128
#: Activation modes of the extension (fp8_linear/kernels/include/act_quant.h).
STATIC, TOKEN, GROUP = 0, 1, 2
#: Static activation scale: inputs are about unit-normal, a few clip.
STATIC_AMAX = 4.0
#: Typical |value| of the random FP8 weights (randn x 64), for output scales near 1.
WEIGHT_SPREAD = 64.0
#: Replays per graph, each with a new input.
REPLAYS = 12

#: (name, activation mode, weight scale kind, forced split-K factor or None = the shape's choice)
SCHEMES = [
    ("tensor", STATIC, "tensor", None),
    ("token-channel", TOKEN, "channel", None),
    ("token-channel-split4", TOKEN, "channel", 4),
    ("tensor-split3", STATIC, "tensor", 3),
    ("block", GROUP, "block", None),
    ("block-split2", GROUP, "block", 2),
]


@pytest.fixture(autouse=True)
def _seed_and_restore(request):
    """A seed from the test's id; the process's PDL state is restored after each test."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    state = ext.pdl_state()
    yield
    ext.set_pdl(*state)


@contextlib.contextmanager
def pdl(enabled: bool, prefetch: int | None = None):
    """Launches inside the block with PDL on / off (and the GEMM's L2 prefetch depth)."""
    old = ext.set_pdl(enabled, prefetch)
    try:
        yield
    finally:
        ext.set_pdl(*old)


class Layer:
    """One FP8 linear layer [n, k]: e4m3 weight, its scale (`kind`), the static input scale."""

    def __init__(self, n: int, k: int, kind: str, mode: int):
        self.n, self.k, self.mode = n, k, mode
        self.w = (torch.randn(n, k, device=DEV) * WEIGHT_SPREAD).clamp(-FMAX, FMAX).to(E4)
        base = 1.0 / (WEIGHT_SPREAD * k ** 0.5)  # output ~ unit variance for unit inputs
        shape = {"tensor": (1,), "channel": (n, 1), "block": (-(-n // BLOCK), -(-k // BLOCK))}[kind]
        self.ws = (torch.rand(shape, device=DEV) + 0.5) * base
        self.input_scale = torch.tensor([STATIC_AMAX / FMAX], device=DEV) if mode == STATIC else None

    def config(self, m: int, splits: int | None) -> tuple[int, int]:
        """(config id, split-K factor) as the sm90 backend picks them; `splits` forces the factor."""
        block = self.mode == GROUP
        cfg = kern.select_config(m, self.n, self.k, swap_ok=self.mode == STATIC, block=block)
        if splits is not None and cfg.split_k:
            return cfg.id, splits
        return cfg.id, kern.select_splits(cfg, m, self.n, self.k)

    def __call__(self, x: torch.Tensor, splits: int | None) -> torch.Tensor:
        cfg, s = self.config(x.shape[0], splits)
        return ext.linear_fwd(x, self.w, self.input_scale, self.ws, None, self.mode, cfg, FMAX, MIN_SCALE, s)


def decoder_layers(hidden: int, inner: int, kind: str, mode: int, blocks: int) -> list[list[Layer]]:
    """`blocks` decoder-shaped blocks: [qkv-like h->h, o h->h, up h->inner, down inner->h]."""
    return [[Layer(hidden, hidden, kind, mode), Layer(hidden, hidden, kind, mode), Layer(inner, hidden, kind, mode),
             Layer(hidden, inner, kind, mode)] for _ in range(blocks)]


def run_chain(blocks: list[list[Layer]], x: torch.Tensor, splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain on x [m, hidden] bf16: inside a block our kernels back to back (each layer's input
    is the previous layer's output), between blocks a residual add and an RMS norm in torch kernels
    (launched without PDL). Returns (the first layer's output, the last hidden state)."""
    h = x
    first = None
    for block in blocks:
        y = h
        for layer in block:
            y = layer(y, splits)
            if first is None:
                first = y
        h = h + y
        h = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
    return first, h


def capture(fn):
    """A CUDA graph of fn() (after a warm-up call on the capture stream) and its outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    return graph, outs


def first_layer_ref(layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """fp64 dequant(q) @ dequant(w).T of the first layer, q and its scale from the extension's act_quant."""
    q, sa = ext.act_quant(x, 0, layer.mode, layer.input_scale, FMAX, MIN_SCALE)
    return gemm_ref64(q, layer.w, sa, layer.ws)


@pytest.mark.parametrize("m", [1, 16, 200])
@pytest.mark.parametrize("scheme", SCHEMES, ids=[s[0] for s in SCHEMES])
def test_graph_chain_pdl_on_off_bitwise(scheme, m):
    """Two decoder blocks (8 layers) in CUDA graphs with PDL on and off, replayed with a new input each
    time (written by a torch kernel between replays): bitwise the eager PDL-off chain, every replay."""
    _, mode, kind, splits = scheme
    blocks = decoder_layers(1024, 2048, kind, mode, 2)
    x_in = torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16)
    graphs = {}
    for on in (True, False):
        with pdl(on):
            graphs[on] = capture(lambda: run_chain(blocks, x_in, splits))
    gen = torch.Generator(device=DEV)
    gen.manual_seed(m)
    for rep in range(REPLAYS):
        x_in.copy_(torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16, generator=gen))
        for on in (True, False):
            for out in graphs[on][1]:
                out.fill_(float("nan"))  # poison: every element must be rewritten by the replay
            graphs[on][0].replay()
        with pdl(False):
            first_ref, last_ref = run_chain(blocks, x_in, splits)
        torch.cuda.synchronize()
        for on in (True, False):
            first, last = graphs[on][1]
            what = f"replay {rep}, pdl {'on' if on else 'off'}"
            assert torch.equal(first, first_ref), f"{what}: first layer differs from eager PDL-off"
            assert torch.equal(last, last_ref), f"{what}: chain output differs from eager PDL-off"
        assert torch.isfinite(last_ref).all()
        if rep == 0:
            ref = first_layer_ref(blocks[0][0], x_in)
            assert calc_diff(first_ref, ref) <= rounding_bar(ref, torch.bfloat16, KERNEL_FLOOR)


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("mode,kind", [(TOKEN, "channel"), (STATIC, "tensor"), (GROUP, "block")])
def test_long_dependent_chain(mode, kind, m):
    """64 layers, each one's output the next one's input through its activation quantization, nothing
    between them: the PDL-on graph replays bitwise the PDL-off graph, input changed between replays."""
    layers = [Layer(1024, 1024, kind, mode) for _ in range(64)]
    x_in = torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16)

    def chain():
        y = x_in
        for layer in layers:
            y = layer(y, None)
        return (y,)

    graphs = {}
    for on in (True, False):
        with pdl(on):
            graphs[on] = capture(chain)
    for _ in range(REPLAYS):
        x_in.normal_()
        for on in (True, False):
            graphs[on][1][0].fill_(float("nan"))
            graphs[on][0].replay()
        torch.cuda.synchronize()
        on_out, off_out = graphs[True][1][0], graphs[False][1][0]
        assert torch.isfinite(off_out).all() and off_out.abs().max() > 0
        assert torch.equal(on_out, off_out)


@pytest.mark.parametrize("prefetch", [0, 1, 2, 64])
def test_prefetch_depth_same_bits(prefetch):
    """The GEMM's L2 prefetch before its wait (any depth, 0 = none) changes no bit of the outputs."""
    blocks = decoder_layers(1024, 3072, "channel", TOKEN, 1)
    x = torch.randn(16, 1024, device=DEV, dtype=torch.bfloat16)
    with pdl(False):
        ref = run_chain(blocks, x, None)
    with pdl(True, prefetch):
        assert ext.pdl_state() == (True, prefetch)
        graph, outs = capture(lambda: run_chain(blocks, x, None))
        graph.replay()
        eager = run_chain(blocks, x, None)
    torch.cuda.synchronize()
    for got in (outs, eager):
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_eager_streams_pdl():
    """Eager launches with PDL on two streams (each its own chain, joined by events) match PDL off."""
    blocks = decoder_layers(1024, 2048, "tensor", STATIC, 2)
    xs = [torch.randn(m, 1024, device=DEV, dtype=torch.bfloat16) for m in (1, 64)]
    with pdl(False):
        refs = [run_chain(blocks, x, None)[1] for x in xs]
    streams = [torch.cuda.Stream() for _ in xs]
    outs = [None, None]
    with pdl(True):
        for _ in range(3):
            for i, (s, x) in enumerate(zip(streams, xs)):
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    outs[i] = run_chain(blocks, x, None)[1]
            for s in streams:
                torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            for out, ref in zip(outs, refs):
                assert torch.equal(out, ref)


def test_set_pdl_state_and_clamp():
    """set_pdl returns the previous state; the prefetch depth is clamped to [-1, 64]."""
    ext.set_pdl(True, -1)
    assert ext.set_pdl(False) == (True, -1)
    assert ext.pdl_state() == (False, -1)
    ext.set_pdl(True, 1000)
    assert ext.pdl_state() == (True, 64)
    ext.set_pdl(True, -5)
    assert ext.pdl_state() == (True, -1)


@pytest.mark.parametrize("env,want", [({"FP8_LINEAR_PDL": "0"}, (False, 0)),
                                      ({"FP8_LINEAR_PDL": "1", "FP8_LINEAR_PDL_PREFETCH": "3"}, (True, 3)),
                                      ({"FP8_LINEAR_PDL_PREFETCH": "-1"}, (True, -1)),
                                      ({"FP8_LINEAR_PDL_PREFETCH": "x"}, (True, 0))])
def test_environment_switch(env, want):
    """FP8_LINEAR_PDL=0 turns PDL off for the process, FP8_LINEAR_PDL_PREFETCH sets the depth (read once; unset or unreadable: 0, no prefetch)."""
    code = (f"import importlib; j = importlib.import_module('{jit.__name__}'); e = j.load(); "
            "print(e.pdl_state())")
    full = {k: v for k, v in os.environ.items() if not k.startswith("FP8_LINEAR_PDL")}
    full.update(env)
    res = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == repr(want)
