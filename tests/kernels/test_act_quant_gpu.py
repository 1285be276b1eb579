"""GPU tests of the extension's row activation quantization (``act_quant`` modes 0 = static per-tensor and
1 = per-token; ``fp8_linear/kernels/csrc/act_quant.cu`` ``quant_rows_kernel``) against the CPU path
(``fp8_linear.quantize``: torch ops, fp32 IEEE division, RNE cast) and the Triton path, bit for bit.

The shapes cover every launch plan of the row kernels (``fp8_linear/kernels/include/act_quant_plan.h``): K below one
warp's 8-element slots, K not a multiple of 8 (the scalar path) or of 16, rows spread over several CTAs
(static, K > 2048), per-token rows split over a thread-block cluster of 2, 4 or 8 CTAs (K > 4096 at
M <= 512; one and two slots a thread, up to 1024 threads a CTA), per-token rows in one CTA held in
registers (M > 512, or K <= 4096) and longer rows (two passes), at M = 1, 7, 16, 129, 257, 513 and 2048;
the inputs put inf / NaN / saturating values and each row's amax at span boundaries, in every CTA of a
cluster and in the last span; every bf16 and fp16 value goes through the division (``scaled``: fp32
quotients through one fp64 reciprocal) at static scales from 1e-45 to 3.4e38 and at 64 per-token scales. Run as a script (``python tests/kernels/test_act_quant_gpu.py``), it launches
a few cluster shapes once each, for ``compute-sanitizer --tool racecheck / synccheck``.
"""

from __future__ import annotations

import pytest
import torch

from fp8_linear import settings
from fp8_linear.formats import MIN_SCALE, fmt_max
from fp8_linear.quantize import dynamic_quantize, quantize_unchecked

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs a CUDA device of compute capability 9.0")]

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
MODE_STATIC, MODE_TOKEN = 0, 1  # fp8_linear/kernels/include/act_quant.h
#: Elements of one CTA span at one slot a thread (256 threads x 8): the static row kernel's unit.
SPAN = 2048
#: K of the two-pass per-token path for 16-bit inputs (16 slots x 2048 elements).
RESIDENT_MAX_K = 16 * SPAN
#: K past the cluster path's reach (8 CTAs x 1024 threads x 2 slots x 8): one CTA a row, two passes.
CLUSTER_MAX_K = 8 * 1024 * 2 * 8
KS = [1, 7, 8, 24, 100, 200, 1000, 2056, 3584, 4095, 8192, 8200, 16400, 18944, 28672, RESIDENT_MAX_K + 8, 40000,
      65544, CLUSTER_MAX_K, CLUSTER_MAX_K + 8]
MS = [1, 7, 16, 129]
STATIC_SCALE = 0.0123


@pytest.fixture(autouse=True)
def _fused_quant_on(monkeypatch):
    """The Triton reference path on (FP8_LINEAR_FUSED_QUANT unset), whatever the environment says."""
    monkeypatch.delenv("FP8_LINEAR_FUSED_QUANT", raising=False)
    settings.reload()
    yield
    settings.reload()


def _ext():
    from fp8_linear.backends.sm90 import extension

    return extension()


def _hard_rows(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[rows, k] of N(0, 3^2) with the cases the row kernel must get right: +-inf and NaN (not counted in
    the amax), an all-zero row (MIN_SCALE), an all-NaN row, values that saturate under the static scale,
    and row maxima placed at span boundaries and in the last span (a per-token amax over all spans)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 3
    for r in range(rows):  # the row's largest finite |x| in its last span, or just before a span boundary
        x[r, (k - 1 - r) % k if r % 2 else min(k - 1, SPAN * (r % 5 + 1) - 1)] = -40.0 - r if r % 3 else 40.0 + r
    x[0, 0] = float("inf")
    x[0, -1] = float("-inf")
    x[-1, -1] = float("nan")
    if rows > 2:
        x[1] = 0
        x[2, : min(k, 5)] *= 1e4
    if rows > 3:
        x[3] = float("nan")
    return x.to(dtype)


def _same_fp8(q1: torch.Tensor, q2: torch.Tensor) -> bool:
    """Same FP8 bits, NaN positions compared as NaN-ness (the CPU cast keeps NaN's sign bit)."""
    a, b = q1.float(), q2.float()
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(q1.view(torch.uint8)[~nan], q2.view(torch.uint8)[~nan])


def _check_rows(x: torch.Tensor, fp8: torch.dtype) -> None:
    """act_quant static and per-token on CUDA `x` against the CPU path (bits, scales) and Triton (bytes)."""
    ext, code, m = _ext(), 0 if fp8 == E4 else 1, fmt_max(fp8)
    static = torch.tensor([STATIC_SCALE], device="cuda")
    ours = {
        "static": ext.act_quant(x, code, MODE_STATIC, static, m, MIN_SCALE),
        "token": ext.act_quant(x, code, MODE_TOKEN, None, m, MIN_SCALE),
    }
    xc, sc = x.cpu(), static.cpu()
    cpu = {"static": (quantize_unchecked(xc, fp8, sc), sc), "token": dynamic_quantize(xc, fp8, "token")}
    triton = {"static": quantize_unchecked(x, fp8, static), "token": dynamic_quantize(x, fp8, "token")[0]}
    shape = f"M={x.shape[0]} K={x.shape[1]} {x.dtype} {fp8}"
    for mode, (q, s) in ours.items():
        assert q.dtype == fp8 and q.shape == x.shape, f"{mode} {shape}"
        assert _same_fp8(q.cpu(), cpu[mode][0]), f"{mode} {shape}: FP8 bits differ from the CPU path"
        same_scales = torch.equal(s.cpu().reshape(-1), cpu[mode][1].reshape(-1))
        assert same_scales, f"{mode} {shape}: scales differ from the CPU path"
        same_bytes = torch.equal(q.view(torch.uint8), triton[mode].view(torch.uint8))
        assert same_bytes, f"{mode} {shape}: bytes differ from Triton"


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", MS)
def test_rows_bitwise_over_awkward_shapes(m, k):
    _check_rows(_hard_rows(m, k, torch.bfloat16, seed=m * 100003 + k).cuda(), E4)


@pytest.mark.parametrize("fp8", [E4, E5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(1, 18944), (16, 8200), (7, 100), (129, 4104), (3, 12000), (2, RESIDENT_MAX_K + 8)])
def test_rows_bitwise_over_dtypes_and_formats(fp8, dtype, m, k):
    """fp16 / fp32 inputs and e5m2 (fp32 rows of K > 8192 take the two-pass per-token path)."""
    _check_rows(_hard_rows(m, k, dtype, seed=k).cuda(), fp8)


@pytest.mark.parametrize("k", [18944, 4096, 1000])
@pytest.mark.parametrize("m", [1, 16])
def test_unaligned_and_strided_rows_match_contiguous(m, k):
    """Rows that start off 16-byte alignment or sit `k + 24` apart (the scalar path, or the vector path
    with a row stride) give the bytes and scales of the same values contiguous."""
    ext, mx = _ext(), fmt_max(E4)
    wide = _hard_rows(m, k + 24, torch.bfloat16, seed=k).cuda()
    static = torch.tensor([STATIC_SCALE], device="cuda")
    for x in (wide[:, :k], wide[:, 3 : k + 3]):
        for mode, scale in ((MODE_STATIC, static), (MODE_TOKEN, None)):
            q1, s1 = ext.act_quant(x, 0, mode, scale, mx, MIN_SCALE)
            q2, s2 = ext.act_quant(x.contiguous(), 0, mode, scale, mx, MIN_SCALE)
            assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)), f"mode {mode} M={m} K={k}"
            assert torch.equal(s1, s2), f"mode {mode} M={m} K={k}"
    _check_rows(wide[:, 3 : k + 3], E4)


def test_repeats_are_bitwise_equal():
    """Two launches on the same input give the same bytes and scales (no order-dependent reduction)."""
    ext, mx = _ext(), fmt_max(E4)
    x = _hard_rows(16, 28672, torch.bfloat16, seed=7).cuda()
    a = ext.act_quant(x, 0, MODE_TOKEN, None, mx, MIN_SCALE)
    b = ext.act_quant(x, 0, MODE_TOKEN, None, mx, MIN_SCALE)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("k", [1, 8, 24, 2056, 8200, 18944, 40000])
@pytest.mark.parametrize("m", [257, 513, 2048])
def test_rows_bitwise_at_large_m(m, k):
    """M where the cluster halves (257: 2 CTAs at K = 18944, two slots a thread) or is not taken (M > 512:
    one CTA a row fills the GPU)."""
    _check_rows(_hard_rows(m, k, torch.bfloat16, seed=m + k).cuda(), E4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [4096, 8192, 18944, 40000, 65544, CLUSTER_MAX_K])
def test_token_amax_in_every_cluster_cta(k, dtype):
    """16 rows whose largest |x| sits at 16 places spread over the row (so in every CTA of the cluster that
    splits it, at its first and last elements too), signs alternating, with inf and NaN in other CTAs:
    the scales and bits of the CPU path."""
    m = 16
    g = torch.Generator().manual_seed(k)
    x = torch.randn(m, k, generator=g)
    for r in range(m):
        pos = min(k - 1, (r * k) // m + (0 if r % 3 == 0 else -1 if r % 3 == 1 else 7))
        x[r, max(pos, 0)] = (-1) ** r * (50.0 + r)
        x[r, (pos + k // 2) % k] = float("inf") if r % 2 else float("nan")
    x[5] = 0  # all-zero row: MIN_SCALE
    x[6] = float("nan")  # all-NaN row: MIN_SCALE, NaN bytes
    x[7, :] = float("-inf")
    _check_rows(x.to(dtype).cuda(), E4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16bit_value_through_the_division(dtype):
    """Rows holding every bit pattern of the input type: static scales from a subnormal to near the fp32
    maximum (1/3, 0.0123, powers of two, MIN_SCALE), and 64 per-token rows whose amax (patterns above it
    zeroed) runs over the type's finite range (K = 65536: 8 CTAs of 1024 threads): the CPU path's bits."""
    ext, mx = _ext(), fmt_max(E4)
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    row = bits.view(dtype).float()
    for scale in (1e-45, 1.5e-38, MIN_SCALE, 2.0**-20, 0.0123, 1 / 3, 1.0, 3.0, 2.0**20, 3.4e38):
        st = torch.tensor([scale], dtype=torch.float32)
        x = row.to(dtype).reshape(1, -1)
        q, _ = ext.act_quant(x.cuda(), 0, MODE_STATIC, st.cuda(), mx, MIN_SCALE)
        assert _same_fp8(q.cpu(), quantize_unchecked(x, E4, st)), f"{dtype} static scale {scale}"
    finite = row[torch.isfinite(row)].abs()
    tops = torch.quantile(finite.unique().double(), torch.linspace(0, 1, 64, dtype=torch.float64)).float()
    x = torch.stack([torch.where(row.abs() <= t, row, torch.zeros_like(row)) for t in tops]).to(dtype)
    q, s = ext.act_quant(x.cuda(), 0, MODE_TOKEN, None, mx, MIN_SCALE)
    rq, rs = dynamic_quantize(x, E4, "token")
    assert _same_fp8(q.cpu(), rq) and torch.equal(s.cpu().reshape(-1), rs.reshape(-1)), f"{dtype} per-token"


def test_cluster_repeats_are_bitwise_equal():
    """The cluster's amax exchange is a max: repeated launches give the same bytes and scales."""
    ext, mx = _ext(), fmt_max(E4)
    for m, k in ((1, 18944), (16, 8192), (129, 18944), (257, 18944)):
        x = _hard_rows(m, k, torch.bfloat16, seed=k).cuda()
        runs = [ext.act_quant(x, 0, MODE_TOKEN, None, mx, MIN_SCALE) for _ in range(3)]
        for q, s in runs[1:]:
            assert torch.equal(q.view(torch.uint8), runs[0][0].view(torch.uint8)) and torch.equal(s, runs[0][1]), f"M={m} K={k}"


def _pdl_chain(ext, x, layers):
    """x through per-token FP8 layers back to back (linear_fwd: the activation quantization, then the GEMM;
    each layer's input the previous one's output)."""
    from fp8_linear.backends.sm90 import kernels_module

    kern, mx = kernels_module(), fmt_max(E4)
    y = x
    for w, ws in layers:
        cfg = kern.select_config(y.shape[0], w.shape[0], w.shape[1], swap_ok=False, block=False)
        y = ext.linear_fwd(y, w, None, ws, None, MODE_TOKEN, cfg.id, mx, MIN_SCALE,
                           kern.select_splits(cfg, y.shape[0], w.shape[0], w.shape[1]))
    return y


@pytest.mark.parametrize("m", [1, 16])
def test_cluster_quant_in_pdl_graph_chain(m):
    """Per-token layers of K = 8192 and 18944 (clusters of 4 and 8 CTAs, launched with the PDL attribute
    right after our GEMM) in a CUDA graph with PDL on: every replay, new input written in between, gives
    bitwise the eager chain with PDL off."""
    ext = _ext()
    torch.manual_seed(m)
    dims = [(8192, 1024), (1024, 8192), (18944, 1024), (1024, 18944)]  # (N, K): the cluster layers are 2 and 4
    layers = []
    for n, k in dims:
        w = (torch.randn(n, k, device="cuda") * 64).clamp(-fmt_max(E4), fmt_max(E4)).to(E4)
        layers.append((w, (torch.rand(n, 1, device="cuda") + 0.5) / (64 * k**0.5)))
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    old = ext.set_pdl(True, None)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _pdl_chain(ext, x, layers)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _pdl_chain(ext, x, layers)
        gen = torch.Generator(device="cuda").manual_seed(7)
        for rep in range(4):
            x.copy_(torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16, generator=gen))
            out.fill_(float("nan"))
            graph.replay()
            ext.set_pdl(False, None)
            ref = _pdl_chain(ext, x, layers)
            ext.set_pdl(True, None)
            torch.cuda.synchronize()
            assert torch.isfinite(ref).all() and torch.equal(out, ref), f"replay {rep}: PDL graph differs from eager"
    finally:
        ext.set_pdl(*old)


@pytest.mark.parametrize("mode", ["0", "2"])
def test_cluster_switch_by_environment(mode):
    """FP8_LINEAR_ACT_CLUSTER = 0 (one CTA a row) and 2 (the cluster-barrier exchange) give the CPU path's
    bits on the script's cluster shapes (a fresh process: the variable is read once)."""
    import os
    import subprocess
    import sys

    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # the checkout, importable without an installed package
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "FP8_LINEAR_ACT_CLUSTER": mode, "PYTHONPATH": path}
    run = subprocess.run([sys.executable, __file__], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


#: Shapes of the sanitizer script: clusters of 2 / 4 / 8 CTAs, one and two slots, 16- and 32-bit inputs.
SANITIZE_SHAPES = [(1, 18944, torch.bfloat16), (16, 8192, torch.bfloat16), (3, 40000, torch.float16),
                   (129, 18944, torch.bfloat16), (257, 18944, torch.bfloat16), (2, 131072, torch.bfloat16),
                   (7, 8200, torch.float32), (1, 5120, torch.bfloat16)]


def sanitize_run() -> int:
    """Each of SANITIZE_SHAPES once through the per-token kernel, checked against the CPU path; returns the
    number of shapes that differ (the exit status of the script)."""
    ext, mx, bad = _ext(), fmt_max(E4), 0
    for m, k, dtype in SANITIZE_SHAPES:
        x = _hard_rows(m, k, dtype, seed=k)
        q, s = ext.act_quant(x.cuda(), 0, MODE_TOKEN, None, mx, MIN_SCALE)
        rq, rs = dynamic_quantize(x, E4, "token")
        ok = _same_fp8(q.cpu(), rq) and torch.equal(s.cpu().reshape(-1), rs.reshape(-1))
        bad += not ok
        print(f"M={m} K={k} {dtype}: {'ok' if ok else 'DIFFERS'}")
    torch.cuda.synchronize()
    return bad


def bench(calls: int = 200) -> None:
    """Microseconds a call of the static and the per-token row kernel at M = 1 / 16, K = 2048 ... 18944
    (bf16 -> e4m3): CUDA graphs of `calls` launches back to back (with PDL when it is on), the input
    L2-resident as the previous kernel's output is in FP8Linear. FP8_LINEAR_ACT_CLUSTER = 0 / 1 / 2 (one CTA a
    row / cluster / cluster with the barrier exchange) and FP8_LINEAR_ACT_CLUSTER_MIN_K pick the per-token path
    for the process."""
    import os

    ext, mx = _ext(), fmt_max(E4)
    static = torch.tensor([STATIC_SCALE], device="cuda")
    print(f"FP8_LINEAR_ACT_CLUSTER={os.environ.get('FP8_LINEAR_ACT_CLUSTER', '(unset)')} "
          f"FP8_LINEAR_ACT_CLUSTER_MIN_K={os.environ.get('FP8_LINEAR_ACT_CLUSTER_MIN_K', '(unset)')}")
    for m in (1, 16):
        for k in (2048, 3584, 4096, 5120, 8192, 18944):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            us = {}
            for mode, scale in ((MODE_STATIC, static), (MODE_TOKEN, None)):
                def run():
                    for _ in range(calls):
                        ext.act_quant(x, 0, mode, scale, mx, MIN_SCALE)
                run()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run()
                graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                best = float("inf")
                for _ in range(5):
                    start.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    best = min(best, start.elapsed_time(end) * 1e3 / calls)
                us[mode] = best
            print(f"act_quant M={m:3d} K={k:6d}: static {us[MODE_STATIC]:.2f} us, per-token {us[MODE_TOKEN]:.2f} us, "
                  f"difference {us[MODE_TOKEN] - us[MODE_STATIC]:.2f} us")


if __name__ == "__main__":
    import sys

    if "--bench" in sys.argv[1:]:
        bench()
        raise SystemExit(0)
    raise SystemExit(sanitize_run())
