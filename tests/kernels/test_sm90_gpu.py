"""GPU tests of the sm90 FP8 GEMM kernel against fp64 math on the dequantized inputs.

Bars (docs/design.md section 7): fp32 out calc_diff <= 1e-8 (+ rounding); bf16/fp16 out <= 1.05 x the error
of rounding the exact result to that dtype + 1e-8. Outputs are NaN-poisoned before every launch and
must come back finite everywhere.
"""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import zlib

import pytest
import torch

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a CUDA device of compute capability 9.0", allow_module_level=True)

import kernel_checks  # noqa: E402
from helpers import KERNEL_FLOOR, calc_diff, rounding_bar  # noqa: E402
from kernel_checks import check  # noqa: E402

from fp8_linear.backends.sm90 import Sm90Backend, kernels_module  # noqa: E402

pytestmark = pytest.mark.gpu

kern = kernels_module()
configs = importlib.import_module(kern.__name__ + ".configs")
jit = importlib.import_module(kern.__name__ + ".jit")

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FMTS = [(E4, E4), (E4, E5), (E5, E4), (E5, E5)]
OUTS = [torch.bfloat16, torch.float16, torch.float32]
SCALES = [("tensor", "tensor"), ("row", "tensor"), ("tensor", "row"), ("row", "row")]
DEV = "cuda"


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Inputs drawn from a seed of the test's own id, so that a failure reproduces alone and does not
    move when tests are added (the bars of small outputs, e.g. 72 elements, sit close to the tensor
    core's own accumulation error in unlucky draws: docs/kernel-log.md v12)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _fp8(rows, k, dtype, gen=None):
    x = torch.randn(rows, k, device=DEV, generator=gen) * 2.0
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax, fmax).to(dtype)


def make_inputs(m, n, k, fa=E4, fb=E4, ska="tensor", skb="tensor", bias_dtype=None):
    a, b = _fp8(m, k, fa), _fp8(n, k, fb)
    sa = torch.rand(1 if ska == "tensor" else m, device=DEV) + 0.5
    sb = torch.rand(1 if skb == "tensor" else n, device=DEV) + 0.5
    if ska == "row":
        sa = sa.reshape(m, 1)
    if skb == "row":
        sb = sb.reshape(n, 1)
    bias = None if bias_dtype is None else (torch.randn(n, device=DEV) * 4).to(bias_dtype)
    return a, b, sa, sb, bias


def reference(a, b, sa, sb, bias):
    a64 = a.double() * sa.double().reshape(-1, 1)
    b64 = b.double() * sb.double().reshape(-1, 1)
    ref = a64 @ b64.T
    if bias is not None:
        ref = ref + bias.double()
    return ref


def run_poisoned(a, b, sa, sb, bias, out_dtype, config=-1, direct_store=False, splits=None):
    return kernel_checks.run_poisoned(kern, a, b, sa, sb, bias, out_dtype, config, direct_store, splits)


def _case(m, n, k, fa, fb, ska, skb, bias_dtype, out_dtype, config=-1, direct_store=False, splits=None):
    a, b, sa, sb, bias = make_inputs(m, n, k, fa, fb, ska, skb, bias_dtype)
    out = run_poisoned(a, b, sa, sb, bias, out_dtype, config, direct_store, splits)
    return check(out, reference(a, b, sa, sb, bias), out_dtype,
                 f"M={m} N={n} K={k} {fa}/{fb} {ska}/{skb} bias={bias_dtype} out={out_dtype} cfg={config}"
                 f" direct={direct_store} splits={splits}")


# --------------------------------------------------------------- first build: two threads at once
def test_first_build_two_threads(tmp_path):
    """In a fresh process, two threads call the op first: one build (the message once), both right.

    The process uses the session's FP8_LINEAR_CACHE: when this test runs first on a cold cache it
    covers the concurrent build, otherwise the concurrent warm load. A second process then times
    the warm load (< 1 s)."""
    code = textwrap.dedent(
        """
        import sys, threading, time, torch
        from fp8_linear.backends.sm90 import kernels_module
        kern = kernels_module()
        a = torch.randn(129, 256, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(200, 256, device="cuda").to(torch.float8_e4m3fn)
        s = torch.ones(1, device="cuda")
        ref = (a.double() @ b.double().T)
        res, errs = [None, None], []
        def go(i):
            try:
                res[i] = kern.sm90_gemm(a, b, s, s, None, torch.float32)
            except Exception as e:
                errs.append(repr(e))
        ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        [t.start() for t in ts]; [t.join() for t in ts]
        torch.cuda.synchronize()
        assert not errs, errs
        for r in res:
            d = 1 - 2 * (r.double() * ref).sum() / (r.double() ** 2 + ref ** 2).sum()
            assert d < 1e-8, float(d)
        print("OK")
        """
    )
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "OK" in r.stdout, r.stdout[-2000:]
    assert r.stderr.count(jit.BUILD_MESSAGE) <= 1, r.stderr[-2000:]
    print("first-build process stderr:", r.stderr.strip()[-300:])
    warm = textwrap.dedent(
        """
        import time, torch
        from fp8_linear.backends.sm90 import kernels_module
        import importlib
        jit = importlib.import_module(kernels_module().__name__ + ".jit")
        t0 = time.perf_counter(); jit.load(); print(f"WARM {time.perf_counter() - t0:.3f}")
        """
    )
    r2 = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True, env=env, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert jit.BUILD_MESSAGE not in r2.stderr, r2.stderr[-2000:]
    t = float(r2.stdout.split("WARM")[1])
    print(f"warm load {t:.3f} s")
    assert t < 1.0


# --------------------------------------------------------------- every combination on one awkward shape
@pytest.mark.parametrize("fa, fb", FMTS, ids=lambda d: str(d).split("_")[1] if "float8" in str(d) else str(d))
@pytest.mark.parametrize("ska, skb", SCALES)
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", OUTS)
def test_all_combinations(fa, fb, ska, skb, bias_dtype, out_dtype):
    _case(129, 200, 1040, fa, fb, ska, skb, bias_dtype, out_dtype)


# --------------------------------------------------------------- awkward shapes (combos rotated)
AWK = list(itertools.product([1, 7, 64, 127, 129, 4096], [8, 72, 200, 4104], [16, 48, 1040, 16400]))


@pytest.mark.parametrize("idx", range(len(AWK)))
def test_awkward_shapes(idx):
    m, n, k = AWK[idx]
    fa, fb = FMTS[idx % 4]
    ska, skb = SCALES[(idx // 4) % 4]
    out_dtype = OUTS[idx % 3]
    bias_dtype = [None, torch.float32, torch.bfloat16, torch.float16][(idx // 3) % 4]
    _case(m, n, k, fa, fb, ska, skb, bias_dtype, out_dtype)


# --------------------------------------------------------------- every kernel config, forced
#: The M > 64 family (TMA-store epilogue): the non-swapped configs and the 128-wide swapped one (config 14,
#: transposed TMA store for 16-bit outputs, direct stores for fp32).
LARGE_CFGS = [c.id for c in configs.CONFIGS if not c.swap_ab or c.swap_tma_store]
SWAP_TMA_CFGS = [c.id for c in configs.CONFIGS if c.swap_tma_store]

@pytest.mark.parametrize("cfg", [c.id for c in configs.CONFIGS])
@pytest.mark.parametrize("m, n, k", [(1, 72, 48), (7, 200, 1040), (64, 4104, 16), (127, 8, 16400), (129, 200, 1040),
                                     (300, 136, 4096), (65, 101, 64), (130, 36, 272)])
@pytest.mark.parametrize("out_dtype", OUTS)
def test_every_config(cfg, m, n, k, out_dtype):
    fa, fb = FMTS[(cfg + m) % 4]
    _case(m, n, k, fa, fb, "row", "row", torch.float32, out_dtype, config=cfg)


# --------------------------------------------------------------- epilogue modes give the same bits
#: The 16-bit TMA-store epilogue has three modes (sm90_epilogue.cuh, EpiMode): with a bias (scales and biases
#: from shared memory), per-channel scale_b without bias, per-tensor scale_b without bias (one factor per
#: row). The formula is the same, so a zero bias (general mode) and no bias must give the same bits,
#: negative zeros included (x * s + 0 in every mode). The second shape gives every CTA several tiles
#: and a column tail: each tile's prefetched scales and published column vectors must be that tile's.
@pytest.mark.parametrize("cfg", LARGE_CFGS)
@pytest.mark.parametrize("ska, skb", SCALES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(300, 424, 512), (2100, 1832, 640)])
def test_epilogue_modes_bitwise(cfg, ska, skb, out_dtype, m, n, k):
    a, b, sa, sb, _ = make_inputs(m, n, k, E4, E4, ska, skb)
    a = a.float()
    a[:7] = 0  # rows of exact zeros
    a = a.to(E4)
    zero = torch.zeros(n, device=DEV, dtype=torch.float32)
    with_bias = run_poisoned(a, b, sa, sb, zero, out_dtype, cfg)
    without = run_poisoned(a, b, sa, sb, None, out_dtype, cfg)
    assert torch.equal(with_bias.view(torch.int16), without.view(torch.int16))
    check(without, reference(a, b, sa, sb, None), out_dtype, f"cfg={cfg} {ska}/{skb}")


# --------------------------------------------------------------- tiles wider than the staged columns
#: Configs whose tile width is not a multiple of 64 (configs 10, 11: 128 x 144) stage the last BN % 64
#: columns of each tile (the strip) unswizzled and store them through a second tensor map: N values
#: whose last tile ends inside, exactly at, or before the strip; M tails; every output dtype.
WIDE_CFGS = [c.id for c in configs.CONFIGS if not c.swap_ab and c.block_n % 64]


@pytest.mark.parametrize("cfg", WIDE_CFGS)
@pytest.mark.parametrize("m, n, k", [(130, 280, 1040), (256, 288, 256), (200, 4096, 512), (2100, 6144, 384),
                                     (64, 136, 128), (129, 8, 16), (333, 1304, 4096)])
@pytest.mark.parametrize("out_dtype", OUTS)
@pytest.mark.parametrize("ska, skb, bias_dtype", [("row", "row", torch.bfloat16), ("tensor", "row", None),
                                                    ("tensor", "tensor", None)])
def test_wide_tile_strip(cfg, m, n, k, out_dtype, ska, skb, bias_dtype):
    # with a bias, and the two no-bias epilogue modes of the fp8-channel / fp8-tensor presets
    _case(m, n, k, E4, E4, ska, skb, bias_dtype, out_dtype, config=cfg)


# --------------------------------------------------------------- direct-store epilogue (fallback path)
@pytest.mark.parametrize("m, n, k", [(1, 72, 48), (129, 200, 1040), (300, 136, 4096), (4096, 4104, 1040),
                                     (65, 101, 64), (200, 36, 272)])
@pytest.mark.parametrize("out_dtype", OUTS)
@pytest.mark.parametrize("cfg", LARGE_CFGS)
def test_direct_store_epilogue(m, n, k, out_dtype, cfg):
    _case(m, n, k, E4, E5, "row", "row", torch.bfloat16, out_dtype, config=cfg, direct_store=True)


# --------------------------------------------------------------- transposed TMA store (swapped, 16-bit)
#: Config 14 stages its swapped tile through stmatrix .trans and stores 64-row TMA boxes; the direct
#: path (force_direct_store) computes the same formula per element, so both give the same bits: M and N
#: tails inside a 64-row box and at its edge, several tiles per CTA, per-tensor and per-token scale_a
#: (the column vector), bias on and off.
@pytest.mark.parametrize("cfg", SWAP_TMA_CFGS)
@pytest.mark.parametrize("m, n, k", [(65, 72, 48), (129, 200, 1040), (192, 136, 256), (300, 4104, 512),
                                     (2100, 1800, 1280), (4096, 8, 16)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ska, skb, bias_dtype", [("tensor", "row", None), ("row", "row", torch.bfloat16),
                                                    ("tensor", "tensor", torch.float32), ("row", "tensor", None)])
def test_swap_tma_store_bitwise_equals_direct(cfg, m, n, k, out_dtype, ska, skb, bias_dtype):
    a, b, sa, sb, bias = make_inputs(m, n, k, E4, E4, ska, skb, bias_dtype)
    direct = run_poisoned(a, b, sa, sb, bias, out_dtype, cfg, direct_store=True)
    staged = run_poisoned(a, b, sa, sb, bias, out_dtype, cfg)
    assert torch.equal(staged.view(torch.int16), direct.view(torch.int16)), f"cfg={cfg} {m}x{n}x{k} {ska}/{skb}"
    check(staged, reference(a, b, sa, sb, bias), out_dtype, f"cfg={cfg} {ska}/{skb}")


# --------------------------------------------------------------- K = 16400 needs the FP32 promotion
@pytest.mark.parametrize("cfg", [1, 16, 17, 19, *LARGE_CFGS])
def test_long_k_promotion_fp32(cfg):
    d = _case(512, 512, 16400, E4, E4, "tensor", "tensor", None, torch.float32, config=cfg)
    assert d <= 1e-8


# --------------------------------------------------------------- several tiles per CTA
#: More 128-wide tiles than an H100/H200 has SMs (132), so the persistent CTAs walk 2-3 tiles each and
#: cross tile boundaries inside one launch (the reuse of the epilogue's staging and the stage ring);
#: 1, 2, an odd and an even number of k-blocks per tile, with M / N / K tails.
MULTI_TILE = [(2048, 2056, 128), (2048, 2056, 256), (2100, 1800, 1040), (1700, 2300, 1280)]


@pytest.mark.parametrize("m, n, k", MULTI_TILE)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cfg", LARGE_CFGS)
def test_many_tiles_per_cta(m, n, k, out_dtype, cfg):
    _case(m, n, k, E4, E4, "row", "row", torch.bfloat16, out_dtype, config=cfg)


#: FP8_LINEAR_SM90_EVEN_WAVES=1 launches the fewest CTAs that finish in the same number of waves: a
#: different split of the tiles among the CTAs, the same bits.
@pytest.mark.parametrize("cfg", [7, 10, 14])
def test_even_waves_is_bitwise_neutral(cfg, monkeypatch):
    m, n, k = 2100, 2000, 512  # 17 x 16 tiles of 128 x 128 (272: 3 waves on 132 SMs, 91 CTAs when even)
    a, b, sa, sb, bias = make_inputs(m, n, k, E4, E4, "row", "row", torch.bfloat16)
    monkeypatch.delenv("FP8_LINEAR_SM90_EVEN_WAVES", raising=False)
    ref = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)
    monkeypatch.setenv("FP8_LINEAR_SM90_EVEN_WAVES", "1")
    out = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)
    assert torch.equal(out, ref)


#: The tile raster (row-blocks per group, FP8_LINEAR_SM90_GROUP_M) only reorders the tiles among the
#: persistent CTAs: every group height gives the same bits.
@pytest.mark.parametrize("cfg", [7, 10, 15])
def test_raster_group_is_bitwise_neutral(cfg, monkeypatch):
    a, b, sa, sb, bias = make_inputs(2100, 1800, 1280, E4, E4, "row", "row", torch.bfloat16)
    ref = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)
    for g in (1, 3, 64, 4096):
        monkeypatch.setenv("FP8_LINEAR_SM90_GROUP_M", str(g))
        out = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)
        assert torch.equal(out, ref), f"config {cfg}, group_m {g}"


# --------------------------------------------------------------- 64-row decode tiles (configs 17-19)
#: One consumer warpgroup over 64 weight rows, a ring of up to 16 stages: N tails at the 64-row box's
#: edges (63, 64, 65, 127, 129, 4104), grids past one wave (N = 9000: 141 tiles on 132 SMs; 20000: 313, so
#: several tiles per CTA), K from one k-block to 129 (the 16-stage ring wraps its phases 8 times), M below,
#: at and past the tile width (several column tiles), every scale kind, bias and output dtype in turn.
ROWS64_CFGS = [c.id for c in configs.CONFIGS if c.block_m == 64]
ROWS64_SHAPES = [(1, 63, 48), (1, 64, 1040), (1, 65, 16400), (7, 127, 4096), (16, 129, 128), (16, 4104, 4864),
                 (3, 9000, 896), (1, 20000, 256), (33, 200, 2048), (64, 4096, 4096), (100, 1000, 1040)]


@pytest.mark.parametrize("cfg", ROWS64_CFGS)
@pytest.mark.parametrize("m, n, k", ROWS64_SHAPES)
def test_rows64_tiles(cfg, m, n, k):
    i = ROWS64_SHAPES.index((m, n, k)) + cfg
    ska, skb = SCALES[i % 4]
    bias_dtype = [None, torch.bfloat16, torch.float32, torch.float16][(i // 2) % 4]
    _case(m, n, k, *FMTS[(i // 3) % 4], ska, skb, bias_dtype, OUTS[i % 3], config=cfg)


@pytest.mark.parametrize("m, n, k, splits", [(64, 4104, 4096, 1), (40, 1000, 16400, 1), (1, 8200, 1040, 1),
                                             (64, 1000, 16400, 4), (9, 300, 8192, 3)])
def test_rows64_twin_bitwise_equals_128_rows(m, n, k, splits):
    """Config 19 is config 16 (the 64-wide swapped tile, two accumulators) with 64 weight rows a tile
    instead of 128: every output row comes from the same 64-row wgmmas (config 16's second warpgroup reads
    the other half of a 128-row stage) promoted in the same order, so the bits are config 16's, split K
    included."""
    a, b, sa, sb, bias = make_inputs(m, n, k, E4, E4, "row", "row", torch.bfloat16)
    rows128 = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, configs.SWAP64_DBL_CONFIG, splits=splits)
    rows64 = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, configs.ROWS64_TWIN[configs.SWAP64_DBL_CONFIG],
                          splits=splits)
    assert torch.equal(rows64.view(torch.int16), rows128.view(torch.int16)), f"{m}x{n}x{k} splits={splits}"
    check(rows64, reference(a, b, sa, sb, bias), torch.bfloat16, f"64-row {m}x{n}x{k}")


@pytest.mark.parametrize("cfg", ROWS64_CFGS)
def test_rows64_bitwise_repeatable(cfg):
    a, b, sa, sb, bias = make_inputs(7, 4104, 16400, E4, E5, "row", "row", torch.bfloat16)
    first = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)
    same = sum(torch.equal(first, run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg)) for _ in range(49))
    assert same == 49, f"config {cfg}: {same + 1} of 50 launches bitwise equal"
    check(first, reference(a, b, sa, sb, bias), torch.bfloat16, f"config {cfg}")


# --------------------------------------------------------------- split K (few tiles, long K)
#: Split K in one launch: each split writes its raw fp32 partial to the workspace, the last split of a
#: tile sums them in split order and runs the epilogue (sm90_epilogue.cuh split_fixup): every config that
#: can split, forced factors (an upper bound: a factor with empty K ranges runs fewer splits), K ragged
#: (K % 128 != 0: the last range is short), M 1 / 7 / 64 / 129, N tails, every output dtype, with and
#: without a bias. The block-scaled split instances (the same fix-up and epilogue) are in
#: test_sm90_block_gpu.py.
SPLIT_CFGS = [c.id for c in configs.CONFIGS if c.split_k]


@pytest.mark.parametrize("cfg", SPLIT_CFGS)
@pytest.mark.parametrize("splits", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("m, n, k", [(64, 4104, 16400), (129, 200, 1040), (1, 72, 4096), (7, 8, 48),
                                     (7, 1000, 3088)])
@pytest.mark.parametrize("out_dtype", OUTS)
def test_split_k(cfg, splits, m, n, k, out_dtype):
    """Within the bars, or (where the unsplit kernel itself is at the bar: the 128-wide configs' single
    accumulator on a 72-element output, calc_diff up to 1.45e-8 over 20 seeds without any split, measured
    on an H200) no worse than the unsplit launch: the partials' fp32 scaling and sum add no visible error."""
    fa, fb = FMTS[(cfg + splits) % 4]
    bias_dtype = [None, torch.bfloat16, torch.float32][(cfg + m) % 3]
    a, b, sa, sb, bias = make_inputs(m, n, k, fa, fb, "row", "row", bias_dtype)
    ref = reference(a, b, sa, sb, bias)
    out = run_poisoned(a, b, sa, sb, bias, out_dtype, cfg, splits=splits)
    whole = run_poisoned(a, b, sa, sb, bias, out_dtype, cfg, splits=1)
    assert torch.isfinite(out).all(), f"splits={splits}: non-finite (unwritten) outputs"
    d, d_whole = calc_diff(out, ref), calc_diff(whole, ref)
    bar = max(rounding_bar(ref, out_dtype, KERNEL_FLOOR), 1.05 * d_whole + 1e-10)
    assert d <= bar, f"cfg={cfg} splits={splits} M={m} N={n} K={k} out={out_dtype}: calc_diff {d:.3e} > {bar:.3e} (unsplit {d_whole:.3e})"


@pytest.mark.parametrize("cfg", [16, 7, 19])
def test_split_k_zero_bias_and_repeatable(cfg):
    """A zero bias and no bias give the same bits (the epilogue adds + 0 either way), and repeated
    launches agree bit for bit (the last split sums the partials in split order, whichever arrives last)."""
    a, b, sa, sb, _ = make_inputs(64, 4104, 8192, E4, E4, "row", "tensor")
    zero = torch.zeros(4104, device=DEV)
    first = run_poisoned(a, b, sa, sb, zero, torch.bfloat16, cfg, splits=8)
    again = run_poisoned(a, b, sa, sb, None, torch.bfloat16, cfg, splits=8)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))
    for _ in range(10):
        assert torch.equal(first, run_poisoned(a, b, sa, sb, None, torch.bfloat16, cfg, splits=8))
    check(first, reference(a, b, sa, sb, None), torch.bfloat16, f"cfg={cfg} splits=8")


def _split_graph(fn):
    """``fn`` captured in a CUDA graph (after one eager warm-up call on the capture stream); returns the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


@pytest.mark.parametrize("cfg, m, n, k, splits", [(1, 1, 1000, 16400, 8), (17, 7, 2056, 8208, 5),
                                                  (19, 64, 520, 4112, 3), (7, 129, 200, 9232, 6),
                                                  (10, 100, 300, 4160, 4), (16, 40, 1000, 16400, 2)])
def test_split_k_bitwise_across_launches_and_graph_replays(cfg, m, n, k, splits):
    """Three eager launches and three replays of a CUDA graph of the launch give the same bits: the
    arrival counters are zero again after every launch (the graph replays reuse them) and the sum's
    order does not depend on which split arrives last."""
    a, b, sa, sb, bias = make_inputs(m, n, k, E4, E4, "row", "row", torch.bfloat16)
    sa1, sb1 = sa.reshape(-1), sb.reshape(-1)
    eager = [run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg, splits=splits) for _ in range(3)]
    for e in eager[1:]:
        assert torch.equal(e.view(torch.int16), eager[0].view(torch.int16)), f"cfg={cfg}: eager launches differ"
    check(eager[0], reference(a, b, sa, sb, bias), torch.bfloat16, f"cfg={cfg} splits={splits}")
    out = torch.empty(m, n, device=DEV, dtype=torch.bfloat16)
    g = _split_graph(lambda: kern.sm90_gemm_out(a, b, sa1, sb1, bias, out, cfg, False, splits))
    for i in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager[0].view(torch.int16)), f"cfg={cfg}: replay {i} differs"
    # the eager launch after the replays: the counters are still zero
    again = run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg, splits=splits)
    assert torch.equal(again.view(torch.int16), eager[0].view(torch.int16))


def test_split_k_counters_reused_by_a_sequence_of_shapes():
    """Split launches of different shapes, tile counts and split factors back to back on one stream (no
    synchronization between them, PDL on) share the arrival counters: each result is within the bars and
    the same bits as the same launch run alone."""
    # configs by name (an id that leaves CONFIGS fails here by name, not deep in the launch)
    cases = [(configs.config(name).id, m, n, k, s) for name, m, n, k, s in (
        ("swap128x16_4acc", 1, 4104, 16400, 8), ("tile128x128_2acc", 7, 200, 1040, 3),
        ("swap64x16_2acc", 129, 2056, 8208, 4), ("swap64x64_2acc", 33, 1000, 4160, 2),
        ("swap128x16_4acc", 1, 4104, 16400, 8), ("swap128x64_2acc", 64, 6000, 9008, 5))]
    inputs = [make_inputs(m, n, k, E4, E5, "tensor", "row", torch.float16 if i % 2 else None)
              for i, (_, m, n, k, _) in enumerate(cases)]
    alone = [run_poisoned(a, b, sa, sb, bias, torch.bfloat16, cfg, splits=s)
             for (cfg, _, _, _, s), (a, b, sa, sb, bias) in zip(cases, inputs)]
    outs = [torch.full_like(x, float("nan")) for x in alone]
    for _ in range(2):
        for (cfg, _, _, _, s), (a, b, sa, sb, bias), out in zip(cases, inputs, outs):
            kern.sm90_gemm_out(a, b, sa.reshape(-1), sb.reshape(-1), bias, out, cfg, False, s)
    torch.cuda.synchronize()
    for (cfg, m, n, k, s), (a, b, sa, sb, bias), out, ref in zip(cases, inputs, outs, alone):
        what = f"cfg={cfg} M={m} N={n} K={k} splits={s}"
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), what
        check(out, reference(a, b, sa, sb, bias), torch.bfloat16, what)


def test_split_k_auto_choice_runs():
    """The shipped choice splits a decode-like shape and stays within the bars."""
    m, n, k = 64, 4096, 14336
    assert configs.select_splits(configs.select_config(m, n, k), m, n, k) > 1
    _case(m, n, k, E4, E4, "tensor", "row", torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("cfg", [c.id for c in configs.CONFIGS if c.id not in SPLIT_CFGS])
def test_split_k_refused_by_other_configs(cfg):
    a, b, sa, sb, _ = make_inputs(64, 256, 2048)
    with pytest.raises(RuntimeError, match="split K is not supported"):
        run_poisoned(a, b, sa, sb, None, torch.bfloat16, cfg, splits=4)


# --------------------------------------------------------------- DESIGN (Llama) shapes
LLAMA_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
            (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
DESIGN = [(m, n, k) for (n, k) in LLAMA_NK for m in (1, 16, 64, 128, 512, 2048)]
DESIGN += [(8192, 8192, 4096), (1024, 4096, 2048), (6144, 6144, 1280)]


@pytest.mark.parametrize("m, n, k", DESIGN)
def test_design_shapes(m, n, k):
    i = DESIGN.index((m, n, k))
    ska, skb = SCALES[i % 4]
    _case(m, n, k, E4, E4, ska, skb, torch.bfloat16 if i % 2 else None, OUTS[i % 3])


# --------------------------------------------------------------- determinism, streams, graphs, compile
#: Launches compared bitwise (100 of 100 must agree).
REPEATS = 100


@pytest.mark.parametrize("m, n, k", [(4096, 4104, 1040), (7, 4104, 16400)])
def test_bitwise_repeatable(m, n, k):
    a, b, sa, sb, bias = make_inputs(m, n, k, E4, E5, "row", "row", torch.bfloat16)
    first = run_poisoned(a, b, sa, sb, bias, torch.bfloat16)
    same = sum(torch.equal(first, run_poisoned(a, b, sa, sb, bias, torch.bfloat16)) for _ in range(REPEATS - 1))
    assert same == REPEATS - 1, f"{same + 1} of {REPEATS} launches bitwise equal"


def test_non_default_stream():
    a, b, sa, sb, bias = make_inputs(1000, 2000, 4096, E4, E4, "row", "tensor", None)
    ref = reference(a, b, sa, sb, bias)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = torch.full((1000, 2000), float("nan"), device=DEV, dtype=torch.float32)
        kern.sm90_gemm_out(a, b, sa.reshape(-1), sb.reshape(-1), None, out)
    s.synchronize()
    check(out, ref, torch.float32, "stream")


def test_cuda_graph_capture():
    a, b, sa, sb, bias = make_inputs(256, 1024, 2048, E4, E4, "tensor", "row", torch.float16)
    sa1, sb1 = sa.reshape(-1), sb.reshape(-1)
    kern.sm90_gemm(a, b, sa1, sb1, bias, torch.bfloat16)  # warm up (build, attributes)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = kern.sm90_gemm(a, b, sa1, sb1, bias, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, reference(a, b, sa, sb, bias), torch.bfloat16, "graph")
    # replay with new data in the same buffers
    a.copy_(_fp8(256, 2048, E4))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, reference(a, b, sa, sb, bias), torch.bfloat16, "graph replay 2")


def test_torch_compile():
    a, b, sa, sb, bias = make_inputs(300, 520, 1024, E5, E4, "row", "row", torch.bfloat16)
    sa1, sb1 = sa.reshape(-1), sb.reshape(-1)

    @torch.compile(fullgraph=True)
    def f(a, b, sa, sb, bias):
        return torch.ops.fp8_linear.sm90_gemm(a, b, sa, sb, bias, torch.float32, -1) * 2.0

    out = f(a, b, sa1, sb1, bias)
    torch.cuda.synchronize()
    check(out, 2.0 * reference(a, b, sa, sb, bias), torch.float32, "compile")


def test_opcheck():
    a, b, sa, sb, bias = make_inputs(64, 72, 128, E4, E4, "tensor", "tensor", torch.float32)
    torch.library.opcheck(torch.ops.fp8_linear.sm90_gemm.default,
                          (a, b, sa.reshape(-1), sb.reshape(-1), bias, torch.bfloat16, -1),
                          test_utils=("test_faketensor",))  # test_schema needs allclose on fp8: not in torch


# --------------------------------------------------------------- backend object
def test_backend_supports_and_run():
    from fp8_linear.backends.base import GemmProblem

    be = Sm90Backend()
    ok, why = be.supports(torch.device(DEV))
    assert ok, why
    a, b, sa, sb, bias = make_inputs(129, 72, 48, E4, E5, "row", "row", torch.float16)
    p = GemmProblem(a, b, sa, sb, bias, torch.float32, "row", "row")
    ok, why = be.can_run(p)
    assert ok, why
    out = be.run(p)
    check(out, reference(a, b, sa, sb, bias), torch.float32, "backend")
    # misaligned view (offset 8 bytes) is refused with a reason
    raw = _fp8(129 * 48 + 8, 1, E4).reshape(-1)
    a_off = raw[8:].reshape(129, 48)
    ok, why = be.can_run(GemmProblem(a_off, b, sa, sb, None, torch.float32, "row", "row"))
    assert not ok and "16-byte" in why
