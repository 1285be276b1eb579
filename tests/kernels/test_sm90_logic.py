"""CPU tests of the sm90 backend's pure-Python logic: config choice, cache keys, can_run reasons,
lazy and thread-safe build. No CUDA needed; nothing is compiled."""

from __future__ import annotations

import importlib
import pathlib
import sys
import threading
import time

import pytest
import torch

from fp8_linear.backends.base import GemmProblem
from fp8_linear.backends.sm90 import Sm90Backend, kernels_module

kern = kernels_module()
configs = importlib.import_module(kern.__name__ + ".configs")
jit = importlib.import_module(kern.__name__ + ".jit")


def _problem(m=64, n=72, k=128, a_dtype=torch.float8_e4m3fn, b_dtype=torch.float8_e4m3fn, ska="tensor",
             skb="tensor", bias=None, out=torch.bfloat16, a=None, b=None):
    a = a if a is not None else torch.randn(m, k).to(a_dtype)
    b = b if b is not None else torch.randn(n, k).to(b_dtype)
    sa = torch.ones(1) if ska == "tensor" else torch.ones(m, 1)
    sb = torch.ones(1) if skb == "tensor" else torch.ones(n, 1)
    return GemmProblem(a, b, sa, sb, bias, out, ska, skb)


# ---------------------------------------------------------------- import / supports
def test_import_builds_nothing():
    """A fresh process importing the backend and the kernels package loads no extension."""
    import subprocess

    code = (
        "import importlib, torch\n"
        "from fp8_linear.backends.sm90 import Sm90Backend, kernels_module\n"
        "k = kernels_module(); jit = importlib.import_module(k.__name__ + '.jit')\n"
        "assert hasattr(torch.ops.fp8_linear, 'sm90_gemm')\n"
        "print('LOADED', jit.is_loaded())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=str(pathlib.Path(__file__).resolve().parents[2]))
    assert r.returncode == 0, r.stderr
    assert "LOADED False" in r.stdout
    assert jit.BUILD_MESSAGE not in r.stderr
    assert kern.OP_NAME == "fp8_linear::sm90_gemm"


def test_supports_cpu_device():
    ok, why = Sm90Backend().supports(torch.device("cpu"))
    assert not ok and "CUDA" in why


def test_supports_wrong_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 9))
    ok, why = Sm90Backend().supports(torch.device("cuda:0"))
    assert not ok
    assert why == "needs compute capability 9.0, device has 8.9"


def test_supports_missing_toolchain(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(jit, "find_nvcc", lambda: None)
    monkeypatch.setattr(jit, "_ext", None)
    ok, why = Sm90Backend().supports(torch.device("cuda:0"))
    assert not ok and "nvcc" in why
    assert not jit.is_loaded()


# ---------------------------------------------------------------- can_run reasons
@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(k=40), "K=40 is not a multiple of 16 (TMA needs 16-byte row strides)"),
        (dict(k=8), "K=8 is not a multiple of 16"),
        (dict(m=0), "empty problem M=0"),
        (dict(n=0), "empty problem"),
        (dict(k=0), "empty problem"),
        (dict(ska="group"), "1x128 groups pair only with 128x128 weight blocks"),
        (dict(out=torch.float64), "out_dtype"),
    ],
)
def test_can_run_reasons(kw, needle):
    ok, why = Sm90Backend().can_run(_problem(**kw))
    assert not ok
    assert needle in why


def test_can_run_non_contiguous():
    a = torch.randn(128, 64).to(torch.float8_e4m3fn).t()  # [64, 128], not contiguous
    ok, why = Sm90Backend().can_run(_problem(a=a))
    assert not ok and "contiguous" in why


def test_can_run_valid_cpu_problem_needs_cuda():
    ok, why = Sm90Backend().can_run(_problem())
    assert not ok and "CUDA" in why


# ---------------------------------------------------------------- config selection
def test_select_config_small_m_small_problem(monkeypatch):
    """32 < M <= 64 with few row blocks and short K (Qwen2.5-0.5B's 1152 x 896): among the 128-row tiles
    config 7 (measured ahead of the 64-wide swapped tiles there: SWAP64_DBL_MIN_N_BLOCKS), and over all
    of them the 64-row tile 16 wide (18 x 4 = 72 tiles; measured 3.4 us against config 7's 5.0)."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    assert configs._select_rows128(64, 1152, 896, 132, False, False).id == 7
    assert configs.select_config(64, 1152, 896).id == 17
    base = configs.CONFIG_BY_ID[configs.SWAP64_DBL_CONFIG]
    # long K / 16 row blocks: config 16 among the 128-row tiles; a 64-row tile unless 16 splits K
    for n, k in ((896, 4864), (2048, 896)):
        assert configs._select_rows128(64, n, k, 132, False, False) == base
        c = configs.select_config(64, n, k)
        assert c == base if configs.select_splits(base, 64, n, k) > 1 else c.block_m == 64


@pytest.mark.parametrize("m, n, cid, bm, bn, swap", [
    (1, 4096, 17, 64, 16, True), (16, 4096, 17, 64, 16, True),      # 64 tiles of 64 rows
    (1, 8448, 17, 64, 16, True), (1, 8449, 1, 128, 16, True),       # 132 tiles of 64 rows fit, 133 do not
    (1, 16896, 1, 128, 16, True), (1, 16897, 17, 64, 16, True),     # 132 tiles of 128 fit; 133 do not: 64-row twin
    (1, 28672, 17, 64, 16, True), (16, 28672, 17, 64, 16, True),    # 224 tiles of 128 (ROWS64_MULTI_WAVE_MAX_M)
    (17, 28672, 2, 128, 32, True), (32, 28672, 2, 128, 32, True),   # above it config 2 stays
    (32, 17920, 10, 128, 144, False), (64, 17920, 10, 128, 144, False),  # 140 swapped tiles; 125 of 128 x 144
    (17, 16896, 2, 128, 32, True), (17, 16897, 10, 128, 144, False),  # 132 swapped tiles fit, 133 do not
    (17, 4096, 17, 64, 16, True), (32, 4096, 17, 64, 16, True),     # 64 x 2 = 128 tiles 16 wide fit
    (32, 4224, 17, 64, 16, True), (32, 4225, 18, 64, 32, True),     # 66 x 2 = 132 fit, 67 x 2 do not
    (32, 10240, 2, 128, 32, True),                                  # 160 x 64-row tiles: too many
    (33, 4096, 18, 64, 32, True), (64, 6144, 19, 64, 64, True), (33, 6272, 19, 64, 64, True),
    (64, 10240, 16, 128, 64, True), (65, 4096, 19, 64, 64, True), (128, 4096, 19, 64, 64, True),
    (128, 896, 17, 64, 16, True), (129, 4096, 20, 64, 128, True), (129, 8192, 7, 128, 128, False),
    (512, 4096, 7, 128, 128, False), (512, 2048, 20, 64, 128, True), (4096, 4096, 7, 128, 128, False),
    (8192, 4096, 7, 128, 128, False)])
def test_select_config(m, n, cid, bm, bn, swap, monkeypatch):
    """The tile for M and N, split K off: up to ROWS64_MAX_M the 64-row tile with the most tiles in one
    wave (with split K, where it has more work items than the 128-row choice: test_rows64_twins); above
    it up to ROWS64_WIDE_MAX_M the 64-row tile 128 tokens wide where its grid fits one wave."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.setenv(configs.ENV_SPLITS, "1")
    c = configs.select_config(m, n, 4096)
    assert (c.id, c.block_m, c.block_n, c.swap_ab) == (cid, bm, bn, swap)
    # a swapped 128-row tile covers M in one column block
    if c.swap_ab and c.block_m == 128:
        assert m <= c.block_n


def test_select_config_wave_model(monkeypatch):
    """A wider tile wins only where its coarser waves and costlier epilogue cost less than its per-FLOP
    gain (docs/kernel-log.md v7 and v10)."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    c7, c6, c10 = configs.CONFIG_BY_ID[7], configs.CONFIG_BY_ID[6], configs.CONFIG_BY_ID[10]
    # 8192^3: 4096 tiles = 31.03 waves of 132 (32 launched) vs 64 x 43 = 2752 tiles = 20.85 (21)
    # vs 64 x 57 = 3648 tiles = 27.6 (28)
    assert configs.tiles(c7, 8192, 8192) == 4096 and configs.tiles(c6, 8192, 8192) == 64 * 43
    assert configs.tiles(c10, 8192, 8192) == 64 * 57
    assert configs.estimated_cost(c7, 8192, 8192, 1.0) == 32 * 128 * 128
    assert configs.estimated_cost(c6, 8192, 8192, 1.0) == 21 * 128 * 192
    assert configs.estimated_cost(c7, 8192, 8192, 1.0, k=8192, tile_overhead_kb=2.0) == 32 * 128 * 128 * 66
    assert configs.select_config(8192, 8192, 8192).id == 10
    # same 4 waves for 128- and 144-wide tiles: the narrower one finishes first
    assert configs.select_config(2048, 4096, 4096).id == 7
    # long K: the 144-wide tile's per-FLOP gain outweighs its costlier epilogue
    assert configs.select_config(4096, 8192, 28672).id == 10
    # M = 512, N = 6144: 192 tiles of 128 x 128 need 2 waves, 128 tiles of 128 x 192 one
    assert configs.select_config(512, 6144, 4096).id == 6
    # one wave either way (few tiles): the narrower tile finishes first (among the 128-row tiles; over
    # all of them the 64-row tile 64 wide, 128 tiles: test_select_config)
    assert configs._select_rows128(128, 4096, 4096, 132, False, False).id == 7
    # short K: 18 waves of 128 x 128 against 16 of 128 x 144, and config 10's wider epilogue (2.25
    # k-blocks a tile) weighs more over 10 k-blocks (measured: config 7 1-4% faster, kernel-log v18-v20)
    assert configs.select_config(6144, 6144, 1280).id == 7


def test_select_config_swapped_twins(monkeypatch):
    """With ``swap_ok`` (per-tensor scale_a, 16-bit output) and N <= M the swapped twins of configs 7 / 10
    (14 / 15: the kernel's rows over the smaller dimension, scale_b a row scale) are taken; N > M,
    decode shapes, split-K shapes and launches without ``swap_ok`` keep their choice."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    for cid, twin in ((7, 14), (10, 15)):
        a, b = configs.CONFIG_BY_ID[cid], configs.CONFIG_BY_ID[twin]
        assert (b.block_n, b.swap_ab, b.n_acc, b.double_acc) == (a.block_n, True, 1, True)
        # the twin's tile grid is the transposed one
        assert configs.tiles(b, 6144, 4096) == configs.tiles(a, 4096, 6144)
    # N = M: the twin of the non-swapped choice (same grid, same estimate)
    assert configs.select_config(6144, 6144, 1280).id == 7
    assert configs.select_config(6144, 6144, 1280, swap_ok=True).id == 14
    assert configs.select_config(8192, 8192, 8192, swap_ok=True).id == 15
    # N < M: the model over the twins (8192 x 4096: config 15's 57 x 32 tiles, 14 waves of 144-wide,
    # against config 7's 32 x 64 = 2048 tiles, 16 waves of 128-wide)
    assert configs.select_config(8192, 4096, 4096).id == 7
    assert configs.select_config(8192, 4096, 4096, swap_ok=True).id == 15
    # N > M: unchanged
    for m, n, k in ((4096, 8192, 28672), (2048, 57344, 8192), (512, 10240, 8192), (2048, 6144, 4096)):
        assert configs.select_config(m, n, k, swap_ok=True) == configs.select_config(m, n, k)
    # decode shapes: already swapped narrow tiles (M <= 32; M <= 64 with a long N)
    for m, n in ((1, 24), (16, 16), (32, 8), (64, 10240)):
        assert configs.select_config(m, n, 4096, swap_ok=True) == configs.select_config(m, n, 4096)
        assert configs.select_config(m, n, 4096).swap_ab
    # split K (few tiles, long K): the non-swapped config with its split-K instance stays
    base = configs.select_config(128, 96, 14336)
    assert configs.select_splits(base, 128, 96, 14336) > 1
    assert configs.select_config(128, 96, 14336, swap_ok=True) == base
    # the override still wins
    monkeypatch.setenv(configs.ENV_CONFIG, "7")
    assert configs.select_config(6144, 6144, 1280, swap_ok=True).id == 7


@pytest.mark.parametrize("sa, dtype, want", [(1, torch.bfloat16, True), (1, torch.float16, True),
                                             (1, torch.float32, False), (300, torch.bfloat16, False),
                                             (300, torch.float32, False)])
def test_swap_ok(sa, dtype, want):
    from fp8_linear import kernels as kern

    assert kern.swap_ok(torch.ones(sa), dtype) is want


def test_config10_overhead_moves_only_the_short_k_shape(monkeypatch):
    """Kernel-log v18-v20 raised config 10's tile overhead from 2.0 to 2.25 k-blocks for 6144^2 x 1280; on the
    68 design shapes of the GEMM benchmark that is the only choice it changes."""
    from benchmarks.common.shapes import design_set

    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    shapes = [(s.m, s.n, s.k) for s in design_set()]
    assert len(shapes) == 68
    now = {s: configs.select_config(*s).id for s in shapes}
    old = tuple((cid, rel, 2.0 if cid == 10 else ov) for cid, rel, ov in configs.LARGE_M_CANDIDATES)
    assert old != configs.LARGE_M_CANDIDATES
    monkeypatch.setattr(configs, "LARGE_M_CANDIDATES", old)
    before = {s: configs.select_config(*s).id for s in shapes}
    assert {s for s in shapes if now[s] != before[s]} == {(6144, 6144, 1280)}


def test_generated_config_header_is_current():
    """include/sm90_configs.cuh is what fp8_linear/kernels/jit/_gen_configs.py makes of configs.CONFIGS."""
    from fp8_linear.kernels.jit import _gen_configs

    assert _gen_configs.HEADER.read_text() == _gen_configs.render()


def test_generated_config_header_instances():
    """Per config, its instances in launch_config: the plain one, split K exactly where ``split_k``, the
    BLK ones exactly where ``block_scales``; config_info carries the same flags."""
    src = (jit.INCLUDE_DIR / "sm90_configs.cuh").read_text()
    launch = src[src.index("const char* launch_config("):]
    ids = [c.id for c in configs.CONFIGS]
    for i, c in enumerate(configs.CONFIGS):
        start = launch.index(f"    case {c.id}:  // {c.name}")
        end = launch.index(f"    case {ids[i + 1]}:", start) if i + 1 < len(ids) else launch.index("default:", start)
        case = launch[start:end]
        head = f"launch_one<{c.block_n}, {str(c.swap_ab).lower()}, {c.n_acc}, FA, FB, {str(c.double_acc).lower()}"
        # SPLIT, BLK, BM: the trailing defaults (false, false, 128) left out
        tail = {(False, False): "", (True, False): ", true", (False, True): ", false, true",
                (True, True): ", true, true"}
        if c.block_m != 128:
            tail = {(split, blk): f", {str(split).lower()}, {str(blk).lower()}, {c.block_m}"
                    for split in (False, True) for blk in (False, True)}
        assert f"{head}{tail[False, False]}>(la" in case, case
        assert (f"{head}{tail[True, False]}>(la" in case) == c.split_k, case
        assert (f"{head}{tail.get((False, True), '?')}>(la" in case) == c.block_scales, case
        assert (f"{head}{tail.get((True, True), '?')}>(la" in case) == (c.split_k and c.block_scales), case
        b = lambda v: str(v).lower()  # noqa: E731
        assert (f"case {c.id}: info = {{{c.block_n}, {c.block_m}, {b(c.swap_ab)}, {b(c.split_k)}, "
                f"{b(c.block_scales)}, \"{c.name}\"}}") in src


def test_configs_named_and_unique():
    """Every config has a unique id and a name saying what it is (tile, operand order, accumulators);
    ``config`` finds it by either, and the ids are what the selection gives."""
    assert len({c.id for c in configs.CONFIGS}) == len({c.name for c in configs.CONFIGS}) == len(configs.CONFIGS)
    for c in configs.CONFIGS:
        assert configs.config(c.id) is configs.config(str(c.id)) is configs.config(c.name) is c
        assert c.name.startswith(("swap" if c.swap_ab else "tile") + f"{c.block_m}x{c.block_n}")
        assert f"x{c.block_n}" in c.name and c.name.endswith(f"_{c.n_acc}acc" if c.n_acc > 1 else
                                                            "_2acc" if c.double_acc else f"x{c.block_n}")
    with pytest.raises(ValueError, match="unknown sm90 kernel config"):
        configs.config(0)


def test_every_config_is_selected(monkeypatch):
    """No config the shape-based choice never gives (those measured slower live in docs/kernel-log.md)."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    picked = {configs.select_config(m, n, k, swap_ok=sw and not blk, block=blk).id
              for m in (1, 16, 32, 64, 65, 128, 512, 2048, 4096, 8192)
              for n, k in ((4096, 4096), (6144, 4096), (10240, 8192), (28672, 4096), (57344, 8192), (8192, 28672),
                           (6144, 1280))
              for sw in (False, True) for blk in (False, True)}
    assert picked == {c.id for c in configs.CONFIGS}


def test_select_config_env_override(monkeypatch):
    monkeypatch.setenv(configs.ENV_CONFIG, "6")
    assert configs.select_config(8, 8, 16).id == 6
    monkeypatch.setenv(configs.ENV_CONFIG, "tile128x144_2acc")
    assert configs.select_config(8, 8, 16).id == 10
    for bad in ("0", "99", "x"):
        monkeypatch.setenv(configs.ENV_CONFIG, bad)
        with pytest.raises(ValueError, match="FP8_LINEAR_SM90_CONFIG"):
            configs.select_config(8, 8, 16)


def test_select_config_rejects_empty():
    with pytest.raises(ValueError):
        configs.select_config(0, 8, 16)


def test_tiles():
    c7, c1 = configs.CONFIG_BY_ID[7], configs.CONFIG_BY_ID[1]
    assert configs.tiles(c7, 8192, 8192) == 64 * 64
    assert configs.tiles(c7, 129, 200) == 2 * 2
    assert configs.tiles(c1, 1, 4096) == 32  # swapped: N on the 128-row side
    c17, c19 = configs.CONFIG_BY_ID[17], configs.CONFIG_BY_ID[19]
    assert configs.tiles(c17, 1, 4096) == 64  # 64-row tiles: twice the CTAs
    assert configs.tiles(c17, 16, 4097) == 65 and configs.tiles(c17, 17, 4096) == 128
    assert configs.tiles(c19, 64, 896) == 14


def test_rows64_twins(monkeypatch):
    """The 64-row twins (configs 17-19) are the 128-row decode configs with half the rows per tile and
    otherwise the same tile width and operand order (two accumulators); the choice takes a twin only where
    its grid fits one wave, the launch has no block scales (unless ROWS64_BLOCK: their block instances are
    not yet measured) and the 128-row choice does not split K, or (above ROWS64_OVER_SPLIT_MIN_M) it splits
    into fewer work items (tiles x splits) than the 64-row grid has."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    assert set(configs.ROWS64_TWIN.values()) | {configs.ROWS64_WIDE_CONFIG} == {c.id for c in configs.CONFIGS if c.block_m == 64}
    for base_id, twin_id in configs.ROWS64_TWIN.items():
        base, twin = configs.CONFIG_BY_ID[base_id], configs.CONFIG_BY_ID[twin_id]
        assert (twin.block_m, base.block_m) == (64, 128)
        assert (twin.block_n, twin.swap_ab, twin.split_k) == (base.block_n, True, True)
        assert twin.double_acc and twin.n_acc == 1 and twin.block_scales
    for m in (1, 7, 16, 17, 32, 33, 64):
        for n in (72, 896, 1152, 3072, 4096, 6144, 8192, 8448, 8449, 10240, 28672):
            for k in (896, 4096, 4864, 14336, 28672):
                c = configs.select_config(m, n, k)
                blk = configs.select_config(m, n, k, block=True)
                assert blk.block_scales and (blk.block_m == 128 or configs.ROWS64_BLOCK), (m, n, k, blk.id)
                if c.block_m != 64:
                    continue
                twin_base = configs.CONFIG_BY_ID[{v: b for b, v in configs.ROWS64_TWIN.items()}[c.id]]
                rows128 = configs._select_rows128(m, n, k, 132, False, False)
                if configs.tiles(c, m, n) > 132:  # both grids take more than a wave: config 1's twin
                    assert m <= configs.ROWS64_MULTI_WAVE_MAX_M and c.id == configs.ROWS64_TWIN[1], (m, n, k)
                    assert configs.tiles(configs.CONFIG_BY_ID[1], m, n) > 132, (m, n, k)
                assert configs.tiles(c, m, n) <= 132 or m <= configs.ROWS64_MULTI_WAVE_MAX_M, (m, n, k)
                if configs.select_splits(rows128, m, n, k) > 1:  # M <= ROWS64_OVER_SPLIT_MIN_M: only config 16's
                    # split twin, config 19 split in turn, where it has more work items (_split_twin)
                    assert rows128.id == configs.SWAP64_DBL_CONFIG and c.id == 19, (m, n, k)
                    assert configs.work_items(c, m, n, k) > configs.work_items(rows128, m, n, k), (m, n, k)
                    continue
                assert configs.tiles(c, m, n) == 2 * configs.tiles(twin_base, m, n) - (-(-n // 64) % 2)
    # up to M = 64, where the 128-row config splits K, it stays (4096 x 14336: 32 tiles, 4 splits of 28 k-blocks),
    # except for config 16's twin where that one's own split has more work items (2048 x 8192 at M = 64: config 19,
    # 32 tiles x 4 splits against config 16's 16 x 4; 4096 x 14336: 64 x 1 against 32 x 4, config 16 stays)
    assert configs.select_config(1, 4096, 14336).id == 1
    assert configs.select_config(64, 4096, 14336).id == configs.SWAP64_DBL_CONFIG
    assert configs.select_config(64, 3072, 8192).id == configs.SWAP64_DBL_CONFIG  # 48 = 48: a tie keeps 16
    for m in (33, 64):
        assert configs.select_config(m, 2048, 8192).id == 19
        assert configs.work_items(configs.CONFIG_BY_ID[19], m, 2048, 8192) == 128
        assert configs.work_items(configs.CONFIG_BY_ID[16], m, 2048, 8192) == 64
    assert configs.select_config(64, 1536, 8960).id == configs.select_config(64, 2048, 11008).id == 19
    assert configs.select_config(32, 2048, 8192).id != 19  # config 2's range: no split twin rule
    # above it, the 64-row grid where it has more work items: Llama-3.2-1B down (2048 x 8192) at M = 128,
    # 32 x 4 tiles 32 wide against config 7's 16 tiles x 2 splits; a tie keeps config 7 (4096 x 14336: 64 x 2
    # tiles 64 wide against 32 x 4)
    assert configs.work_items(configs.CONFIG_BY_ID[7], 128, 2048, 8192) == 16 * 2
    assert configs.select_config(128, 2048, 8192).id == 18
    assert configs.work_items(configs.CONFIG_BY_ID[19], 128, 4096, 14336) == 128
    assert configs.select_config(128, 4096, 14336).id == configs.LARGE_M_CONFIG
    # split K forced off: the twin
    monkeypatch.setenv(configs.ENV_SPLITS, "1")
    assert configs.select_config(1, 4096, 14336).id == 17
    # fewer SMs: 64 tiles of 64 rows no longer fit one wave of 48 (32 of 128 rows do)
    monkeypatch.delenv(configs.ENV_SPLITS)
    assert configs.select_config(1, 4096, 4096, num_sms=48).id == 1
    # and where config 1's 32 tiles take more than a wave of 24 too, its twin
    assert configs.select_config(1, 4096, 4096, num_sms=24).id == 17
    assert configs.select_config(1, 3072, 4096, num_sms=48).id == 17


# ---------------------------------------------------------------- cache key / folder
# ---------------------------------------------------------------- split K
def test_split_count_leaves_no_empty_range():
    """The host's rule (sm90_host.cu): ceil(num_kb / splits) k-blocks per split, and only the splits
    that leaves non-empty; every k-block is covered exactly once."""
    for num_kb in range(1, 140):
        for want in range(1, 65):
            s = configs.split_count(num_kb, want)
            per = -(-num_kb // want) if want > 1 else num_kb
            assert 1 <= s <= max(1, min(want, num_kb))
            if s > 1:
                assert (s - 1) * per < num_kb <= s * per  # the last range is non-empty and reaches the end


@pytest.mark.parametrize("m, n, k, want", [
    (64, 4096, 14336, 4),    # 32 tiles, 112 k-blocks -> 4 splits of 28
    (1, 4096, 14336, 4),
    (128, 4096, 14336, 4),   # config 7 / 10: 29-32 tiles
    (1, 4096, 4096, 1),      # 32 k-blocks: a split would keep fewer than MIN_KB_PER_SPLIT
    (64, 8192, 28672, 1),    # 64 tiles: more than a quarter of the SMs busy already
    (64, 28672, 4096, 1),
    (2048, 4096, 4096, 1),
    (16, 256, 16384, 8),     # config 1, 2 tiles, 128 k-blocks: 8 splits of 16 (MIN_KB_PER_SPLIT_SWAP128)
    (1, 2048, 8192, 4),      # config 1, 16 tiles, 64 k-blocks: 4 splits of 16, 64 work items
    (1, 1536, 8960, 4),      # config 1, 12 tiles, 70 k-blocks: 4 splits of 18
    (1, 3072, 8192, 2),      # config 1, 24 tiles: 4 splits would pass half the SMs (SPLIT_SWAP128_BUSY_FRACTION)
    (64, 2048, 11008, 4),    # config 16, 16 tiles, 86 k-blocks: 4 splits, one round of the fix-up's loads
    (128, 5120, 27648, 3),   # config 7, 40 tiles (under half the SMs), 216 k-blocks: 3 splits of >= 48
    (256, 4096, 14336, 2),   # config 7, 64 tiles, 112 k-blocks: 2 splits of 56
    (256, 4096, 4096, 1),    # 64 tiles, 32 k-blocks: ranges shorter than MIN_KB_PER_SPLIT_LONG_K_LARGE_M
    (256, 3072, 8192, 2),    # config 7, 48 tiles, 64 k-blocks: 2 ranges of 32 (MIN_KB_PER_SPLIT_LONG_K_LARGE_M)
    (512, 1536, 8960, 2),    # config 7, 48 tiles, 70 k-blocks
    (512, 2048, 11008, 2),   # config 7, 64 tiles, 86 k-blocks
    (128, 5120, 13824, 2),   # M = 128 keeps MIN_KB_PER_SPLIT_LONG_K: 40 tiles, 108 k-blocks, 2 ranges of 54
    (64, 5120, 27648, 1),    # the swapped config 16 keeps the quarter: 40 tiles do not split
    (256, 8448, 28672, 1),   # 132 tiles: every SM busy
    (256, 896, 4864, 3),     # config 7, 14 tiles, 38 k-blocks: 3 splits of >= 12 (MIN_KB_PER_SPLIT_TILE_LARGE_M)
    (256, 2048, 8192, 4),    # config 7, 32 tiles, 64 k-blocks: 4 splits, one wave
    (256, 1536, 8960, 5),    # config 7, 24 tiles, 70 k-blocks: 5 splits of 14
    (512, 896, 4864, 3),     # config 7, 28 tiles
    (256, 2048, 2048, 1),    # 16 k-blocks: two ranges of 8 would be shorter than 12
    (128, 896, 4864, 1),     # M = 128: the 64-row tile (17, 14 x 8 tiles) takes it unsplit
    (1, 28672, 4096, 1),     # config 17 over 448 tiles (ROWS64_MULTI_WAVE_MAX_M): no split
])
def test_select_splits(m, n, k, want, monkeypatch):
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    cfg = configs.select_config(m, n, k)
    assert configs.select_splits(cfg, m, n, k) == want


def test_select_splits_only_for_configs_with_split_instances(monkeypatch):
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    assert [c.id for c in configs.CONFIGS if c.split_k] == [1, 2, 7, 10, 16, 17, 18, 19]
    for c in configs.CONFIGS:
        if not c.split_k:
            assert configs.select_splits(c, 64, 256, 16384) == 1
            monkeypatch.setenv(configs.ENV_SPLITS, "8")
            assert configs.select_splits(c, 64, 256, 16384) == 1
            monkeypatch.delenv(configs.ENV_SPLITS)


def test_select_splits_env_override(monkeypatch):
    cfg = configs.CONFIG_BY_ID[16]
    monkeypatch.setenv(configs.ENV_SPLITS, "1")
    assert configs.select_splits(cfg, 64, 4096, 14336) == 1
    monkeypatch.setenv(configs.ENV_SPLITS, "5")
    assert configs.select_splits(cfg, 64, 4096, 14336) == 5  # 112 k-blocks: 5 ranges of 23
    monkeypatch.setenv(configs.ENV_SPLITS, "8")
    assert configs.select_splits(cfg, 2048, 4096, 4096) == 8  # forced even where auto would not split
    for bad in ("0", "65", "two"):
        monkeypatch.setenv(configs.ENV_SPLITS, bad)
        with pytest.raises(ValueError, match=configs.ENV_SPLITS):
            configs.select_splits(cfg, 64, 4096, 14336)


def test_cache_key_depends_on_sources_flags_nvcc(tmp_path):
    f1 = tmp_path / "a.cu"
    f1.write_text("x")
    k0 = jit.cache_key([f1], ("-O3",), "nvcc 13.0", "t")
    assert k0 == jit.cache_key([f1], ("-O3",), "nvcc 13.0", "t")
    assert k0 != jit.cache_key([f1], ("-O2",), "nvcc 13.0", "t")
    assert k0 != jit.cache_key([f1], ("-O3",), "nvcc 12.8", "t")
    assert k0 != jit.cache_key([f1], ("-O3",), "nvcc 13.0", "u")
    f1.write_text("y")
    assert k0 != jit.cache_key([f1], ("-O3",), "nvcc 13.0", "t")


def test_cache_key_covers_every_source():
    files = [*jit.source_files(), *jit.header_files()]
    names = {p.name for p in files}
    assert "binding.cpp" in names and "sm90_ptx.cuh" in names
    assert {"sm90_tile.cuh", "sm90_mainloop.cuh", "sm90_epilogue.cuh", "sm90_gemm.cuh", "sm90_launch.cuh"} <= names
    assert any(n.endswith(".cu") for n in names)
    assert all(p.is_file() for p in files)
    # binding.cpp must stay apart from the kernel units (no torch headers in .cu / .cuh)
    for p in files:
        if p.suffix in (".cu", ".cuh", ".h"):
            assert "torch/" not in p.read_text(), p


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FP8_LINEAR_CACHE", str(tmp_path))
    assert jit.cache_root() == tmp_path
    assert jit.build_dir("abc") == tmp_path / "sm90-abc"
    monkeypatch.delenv("FP8_LINEAR_CACHE")
    assert jit.cache_root() == pathlib.Path.home() / ".cache" / "fp8_linear"


def test_load_builds_once_under_concurrency(monkeypatch, tmp_path, capsys):
    """Two threads asking first: one build, both get the same module, the message printed once."""
    import torch.utils.cpp_extension as cpp

    calls = []

    class FakeExt:
        pass

    def fake_load(**kw):
        calls.append(kw)
        time.sleep(0.3)
        return FakeExt()

    monkeypatch.setenv("FP8_LINEAR_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(jit, "toolchain_status", lambda: (True, "ok"))
    monkeypatch.setattr(jit, "_ext", None)
    got = []
    ths = [threading.Thread(target=lambda: got.append(jit.load())) for _ in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert len(calls) == 1
    assert got[0] is got[1]
    kw = calls[0]
    assert any("-gencode=arch=compute_90a,code=sm_90a" in f for f in kw["extra_cuda_cflags"])
    assert pathlib.Path(kw["build_directory"]).parent == tmp_path
    assert capsys.readouterr().err.count(jit.BUILD_MESSAGE) == 1
    monkeypatch.setattr(jit, "_ext", None)


def test_rows64_wide_rule(monkeypatch):
    """Config 20 (64 weight rows x 128 tokens) replaces an unsplit non-swapped tile choice above
    ROWS64_WIDE_MIN_M up to ROWS64_WIDE_MAX_M where its grid fits one wave; never for block scales, a
    split choice, a second wave or M beyond the measured range."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    wide = configs.ROWS64_WIDE_CONFIG
    # Qwen2.5-14B o (5120 x 5120) at M = 128: 80 tiles of config 20 in one wave
    assert configs.select_config(128, 5120, 5120).id == wide
    assert configs.select_config(256, 4096, 4096).id == wide  # Llama-3.1-8B o: 128 tiles
    assert configs.select_config(512, 896, 896).id == wide
    assert configs.select_config(256, 4096, 4096, block=True).id != wide
    assert configs.select_config(128, 10240, 8192).id != wide  # 160 tiles: a second wave
    assert configs.select_config(1024, 896, 896).id != wide  # beyond ROWS64_WIDE_MAX_M
    assert configs.select_config(64, 5120, 5120).id != wide  # the decode configs' range
    # a split choice stays split (Qwen2.5-0.5B down at M = 256)
    c = configs.select_config(256, 896, 4864)
    assert c.id != wide and configs.select_splits(c, 256, 896, 4864) > 1
    for m in (65, 100, 128, 129, 200, 256, 300, 512):
        for n in (896, 2048, 3072, 4096, 5120, 8192, 8448, 9000):
            c = configs.select_config(m, n, 4096)
            if c.id == wide:
                assert configs.tiles(c, m, n) <= 132 and configs.ROWS64_WIDE_MIN_M < m <= configs.ROWS64_WIDE_MAX_M


def test_multi_wave_tile_rule(monkeypatch):
    """Above ROWS64_MULTI_WAVE_MAX_M up to MULTI_WAVE_TILE_MAX_M, a swapped 128-row choice over more than one
    wave gives way to the large-M choice where that fits one wave unsplit (its time at M = 128 bounds it:
    the same grid); never for block scales, never where the large-M grid takes a second wave too."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    # Qwen2.5-1.5B / 3B gate_up, measured: the M = 128 choice of each at M = 17-64
    for m in (17, 32, 33, 64):
        assert configs.select_config(m, 17920, 1536) == configs.select_config(128, 17920, 1536) == configs.config(10)
        assert configs.select_config(m, 22016, 2048) == configs.select_config(128, 22016, 2048) == configs.config(6)
        assert configs.select_config(m, 17920, 1536, block=True).swap_ab  # block scales: unchanged
        assert configs.select_config(m, 28672, 4096).swap_ab  # Llama-3.1-8B gate_up: 150 tiles of 128 x 192
    assert configs.select_config(16, 17920, 1536).id == configs.ROWS64_TWIN[1]  # M <= 16: config 17
    for m in range(17, configs.MULTI_WAVE_TILE_MAX_M + 1, 7):
        for n in (8192, 16384, 16896, 16897, 17920, 19008, 19009, 22016, 25344, 25345, 28672):
            for k in (896, 1536, 4096, 14336):
                c = configs.select_config(m, n, k)
                if not c.swap_ab:
                    assert configs.tiles(c, m, n) <= 132 and configs.select_splits(c, m, n, k) == 1, (m, n, k)
                    assert -(-n // configs.BLOCK_M) > 132, (m, n, k)  # the swapped grid took a second wave


def test_wide_over_rows64_short_k(monkeypatch):
    """Above ROWS64_WIDE_MIN_M, config 20 replaces rule 3's config 19 where K <= ROWS64_WIDE_SHORT_K and its grid
    fits one wave (measured 0.78-0.98 of config 19 at K <= 3072, level at 4096, 1.10 at 8192); never config 17 /
    18, block scales, M <= 64, a longer K or a second wave."""
    monkeypatch.delenv(configs.ENV_CONFIG, raising=False)
    monkeypatch.delenv(configs.ENV_SPLITS, raising=False)
    wide, rows64 = configs.ROWS64_WIDE_CONFIG, configs.ROWS64_TWIN[configs.SWAP64_DBL_CONFIG]
    for m, n, k in ((128, 3072, 2048), (128, 2560, 2048), (128, 3072, 3072), (128, 4096, 1024), (96, 4096, 2304)):
        assert configs.select_config(m, n, k).id == wide, (m, n, k)
        assert configs.select_config(m, n, k, block=True).id == rows64, (m, n, k)
    for m, n, k in ((128, 4096, 4096), (128, 3072, 8192), (64, 6144, 2048)):
        assert configs.select_config(m, n, k).id == rows64, (m, n, k)
    assert configs.select_config(128, 2048, 2048).id == configs.ROWS64_TWIN[2]  # config 18 stays
    for m in (65, 80, 100, 128):
        for n in (1024, 2048, 3072, 4096, 6144, 8192, 8448, 9000):
            for k in (896, 2048, 3072, 3200, 4096):
                c = configs.select_config(m, n, k)
                if c.id == wide and m <= configs.ROWS64_MAX_M:
                    assert configs.tiles(c, m, n) <= 132 and configs.select_splits(c, m, n, k) == 1, (m, n, k)
                if c.id == rows64:
                    assert k > configs.ROWS64_WIDE_SHORT_K or configs.tiles(configs.config(wide), m, n) > 132, (m, n, k)
