"""Kernel configurations of the sm90 FP8 GEMM and the shape-based choice among them.

Pure Python (no CUDA, no build). The one source of the config table: the C++ dispatch
(``include/sm90_configs.cuh``: the kernel instances of each config, its tile width and operand order)
is generated from :data:`CONFIGS` by ``python fp8_linear/kernels/jit/_gen_configs.py`` (a test checks that the
committed header is current).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BLOCK_M = 128
BLOCK_K = 128


@dataclass(frozen=True)
class KernelConfig:
    """One kernel configuration: the tile, the operand order, the accumulation schedule and which kernel
    instances it has. The C++ dispatch (``include/sm90_configs.cuh``) is generated from :data:`CONFIGS`
    by ``fp8_linear/kernels/jit/_gen_configs.py``."""

    id: int  # stable number (the op's ``config`` argument, FP8_LINEAR_SM90_CONFIG, benchmark commands)
    name: str  # what it is: the tile (rows x columns on the kernel's A x B side), swap, accumulators
    block_n: int  # tile width on the kernel's B side
    swap_ab: bool  # True: kernel A = weight [N, K], kernel B = activation [M, K] (decode shapes)
    n_acc: int  # accumulators per 128-wide k-block: FP32 promotion every 128 / n_acc of K
    double_acc: bool = False  # two accumulators: issue k-block i+1 before promoting k-block i
    split_k: bool = False  # has split-K kernel instances (select_splits)
    block_scales: bool = False  # has BLK instances: 1x128 / 128x128 scales
    block_m: int = BLOCK_M  # tile rows on the kernel's A side: 128 (two consumer warpgroups) or 64 (one)

    @property
    def swap_tma_store(self) -> bool:
        """Swapped large-M config whose 16-bit output goes through the transposed TMA store
        (swap128x128_2acc, swap128x144_2acc; sm90_tile.cuh swap_tma_width)."""
        return self.swap_ab and self.block_n >= 128


#: The configs the selection below can give (the others that were measured are in docs/kernel-log.md
#: and git history: one accumulator at 128 x 128, promotion every 64, 2-CTA clusters, the pipeline
#: carried across tiles; none was faster).
CONFIGS: tuple[KernelConfig, ...] = (
    KernelConfig(1, "swap128x16_4acc", 16, True, 4, split_k=True, block_scales=True),  # M <= 16
    KernelConfig(2, "swap128x32_4acc", 32, True, 4, split_k=True, block_scales=True),  # M <= 32
    KernelConfig(6, "tile128x192", 192, False, 1, block_scales=True),  # less shared-memory / L2 traffic per FLOP
    KernelConfig(7, "tile128x128_2acc", 128, False, 1, True, split_k=True, block_scales=True),  # the large-M default
    # v10: 6% less operand traffic per FLOP; no block instances (see BLOCK_LARGE_M_CANDIDATES)
    KernelConfig(10, "tile128x144_2acc", 144, False, 1, True, split_k=True),
    KernelConfig(14, "swap128x128_2acc", 128, True, 1, True),  # 7 with A/B swapped (v21)
    KernelConfig(15, "swap128x144_2acc", 144, True, 1, True),  # 10 with A/B swapped (v21)
    # 3 with two accumulators (k-block i+1 issued before i is promoted): M <= 64 decode tiles (v27)
    KernelConfig(16, "swap128x64_2acc", 64, True, 1, True, split_k=True, block_scales=True),
    # 64 weight rows per tile (one consumer warpgroup, up to 16 stages): twice the CTAs of 1 / 2 / 16 where
    # a 128-row grid leaves SMs idle (v30); two accumulators, promotion every 128 of K; block instances
    # compiled and tested, not chosen for block scales (ROWS64_BLOCK)
    KernelConfig(17, "swap64x16_2acc", 16, True, 1, True, split_k=True, block_scales=True, block_m=64),
    KernelConfig(18, "swap64x32_2acc", 32, True, 1, True, split_k=True, block_scales=True, block_m=64),
    KernelConfig(19, "swap64x64_2acc", 64, True, 1, True, split_k=True, block_scales=True, block_m=64),
    # 64 weight rows x 128 tokens (v39): twice the CTAs of config 7 / 14 at M = 65-256 without split K's
    # fp32 partials, each weight row read by one CTA per 128 tokens
    KernelConfig(20, "swap64x128_2acc", 128, True, 1, True, block_m=64),
)
#: Config by id.
CONFIG_BY_ID: dict[int, KernelConfig] = {c.id: c for c in CONFIGS}


def config(token: int | str) -> KernelConfig:
    """The config of id or name ``token`` (``7``, ``"7"`` or ``"tile128x128_2acc"``); ValueError listing
    the known ones otherwise."""
    for c in CONFIGS:
        if str(token) in (str(c.id), c.name):
            return c
    raise ValueError(f"unknown sm90 kernel config {token!r}; expected an id or name of "
                     f"{[(c.id, c.name) for c in CONFIGS]}")


#: Config for M > 64 when no candidate below is better (the large-M workhorse): 128 x 128 with two
#: accumulators (one accumulator was 10% slower: docs/kernel-log.md v7).
LARGE_M_CONFIG = 7

#: Large-M candidates: (config id, throughput per tile-FLOP relative to a one-accumulator 128 x 128
#: tile on full waves (docs/kernel-log.md v7),
#: per-tile overhead in k-block equivalents: the tile's prologue, pipeline drain and epilogue), as
#: measured on an H200 (docs/kernel-log.md v8, v10, v11). select_config estimates each one's time as
#: waves x tile width x (k-blocks + overhead) / throughput and takes the fastest, so a wider tile wins
#: only where its coarser waves and costlier epilogue cost less than its per-FLOP gain. Config 10's
#: pair (1.019 x config 7's throughput, 2.0 k-blocks like config 7) is the least-squares fit to the
#: 27-shape steady-state measurement of v11 (its strip through TMA); config 7's 2 k-blocks is v8's tile-boundary
#: cost. Checked again after config 7 got its sixth stage (v12, forced 7 and 10 on the 27 shapes):
#: this choice gives 0.986 of cuBLASLt, the per-shape best 0.988, a refit 0.987; left as it is.
#: Config 10's overhead is 2.25 k-blocks since v18-v20 (its epilogue is wider: 144 columns, 16 of them
#: through a second TMA store): at 6144^2 x 1280 config 7 was level or faster in every measurement since v12:
#: forced steady 7/10 1.008, 1.022, 0.999 (v12-v14), 1.020 and 1.042 (v18-v20), ncu
#: 131.7 vs 135.2 kilocycles (v18-v20) and 83.71 vs 84.90 us (v16); docs/kernel-log.md. Over the 68
#: design shapes (benchmarks/common/shapes.py) the change moves only that one (tests/kernels/test_sm90_logic.py).
CONFIG10_OVERHEAD_KB = 2.25
LARGE_M_CANDIDATES: tuple[tuple[int, float, float], ...] = (
    (LARGE_M_CONFIG, 1.107, 2.0),  # docs/kernel-log.md v7
    (6, 1.086, 2.0),  # docs/kernel-log.md v7
    (10, 1.107 * 1.019, CONFIG10_OVERHEAD_KB),  # v11 (steady state); overhead: v18-v20
)

#: The large-M candidates of block-scaled launches (:func:`select_config` ``block``): those with BLK
#: instances (7 and 6), with the per-tensor throughput and overhead figures (the factors cost each tile
#: the same few FFMAs per value; not measured apart for block scales). Config 10 has no block instances:
#: on the H200 its block instance (docs/kernel-log.md v29) ran slower than config 7's on every shape it
#: would take (70B o: 268.3 against 246.9 us at M = 2048; ``python -m benchmarks.gemm_bench --mode block
#: --quick``, 2026-12-01) and spilled under nvcc 13.0 (ptxas spill stores / loads: 8 / 4 bytes, 100 / 340
#: with split K); it is in git history.
BLOCK_LARGE_M_CANDIDATES: tuple[tuple[int, float, float], ...] = tuple(
    c for c in LARGE_M_CANDIDATES if CONFIG_BY_ID[c[0]].block_scales)

#: Swapped twins of the large-M candidates: config 14 = 7 and config 15 = 10 with A/B swapped (the
#: weight's rows on wgmma's M side; scale_b[n] is then a per-thread row scale loaded at the tile start,
#: so per-channel weight scales cost the epilogue nothing: ncu at 6144^2 x 1280, docs/kernel-log.md v21,
#: config 14 84.38 / 84.19 us per-tensor / per-channel against config 7's 84.19 / 85.66). Throughput
#: and overhead as their non-swapped twins (the same tile, transposed). With ``swap_ok``
#: (:func:`select_config`) they are taken whenever N <= M: the kernel's row blocks then run over the
#: smaller dimension, which measured about as fast or faster (steady, docs/kernel-log.md v21: at M = 8192,
#: N = 4096 / 6144 the twins 2-3.5% faster; at N = M from 0.9% slower to 1.9% faster), while with N > M they
#: were slower (M = 512, N = 4096-57344: 4-6.5%; 2048 x 57344 x 8192: 5%).
SWAPPED_TWIN = {7: 14, 10: 15}
SWAPPED_LARGE_M_CANDIDATES: tuple[tuple[int, float, float], ...] = tuple(
    (SWAPPED_TWIN[cid], rel, overhead) for cid, rel, overhead in LARGE_M_CANDIDATES if cid in SWAPPED_TWIN)

#: The 64-wide swapped tile with two accumulators (config 16, docs/kernel-log.md v27): for 32 < M <= 64
#: wherever N has at least SWAP64_DBL_MIN_N_BLOCKS row blocks or K at least SWAP64_DBL_MIN_K; below both
#: (a few small k-blocks per tile) config 7 stays ahead. Block scales too since v40 (its block instances:
#: one promotion per k-block against the four of config 3, swap128x64_4acc, which it replaced for block
#: scales and which was then removed; 168 registers, 0 spills; docs/kernel-log.md v40). Measured (H200,
#: 2026-12-01, `python -m benchmarks.gemm_bench --mode decode --quick --configs 3,16`, M = 64, us, config 16 / the previous choice): 8B qkv 12.7 / 14.3 (7), o 12.2 / 13.5 (7), down 23.5 /
#: 26.9 (7, split K), gate_up 36.9 / 38.0 (3); 70B qkv 27.6 / 28.7, o 22.8 / 27.3, gate_up 127.9 / 139.9,
#: down 62.7 / 82.8 (3); Qwen2.5-0.5B down (N 896, K 4864) 12.6 / 14.6 (7), qkv (1152 x 896) 6.6 / 6.0 and
#: o (896 x 896) 6.5 / 5.9 (7 ahead).
SWAP64_DBL_CONFIG = 16
SWAP64_DBL_MIN_N_BLOCKS = 16
SWAP64_DBL_MIN_K = 2048

#: The decode configs with 64-row weight tiles (configs 17-19: one consumer warpgroup, docs/kernel-log.md
#: v30, v31). At M = 1 a 128-row grid streams the weight through ceil(N / 128) CTAs, and each SM takes in
#: about 90 GB/s (H200, decode quick set of 2026-12-01: 4096 x 4096 on 32 CTAs 9.0 us, 1.9 TB/s; cuBLASLt
#: 7.2 us through 64 CTAs), so below about 48 busy SMs the grid, not HBM, sets the time. For M <=
#: ROWS64_MAX_M :func:`select_config` takes the one of them whose grid has the most tiles that still fit
#: one wave (ceil(N / 64) x ceil(M / BN) <= the SMs; the narrower tile on a tie), unless the launch has
#: block scales (ROWS64_BLOCK) or the 128-row choice splits K (select_splits has spread that one over the
#: SMs already) and either M <= ROWS64_OVER_SPLIT_MIN_M or the 64-row grid has no more work items (tiles x
#: splits, each config split by select_splits; at M <= ROWS64_OVER_SPLIT_MIN_M config 16's split gives way to
#: config 19's where that has more work items, :func:`_split_twin`). Above ROWS64_OVER_SPLIT_MIN_M the 128-row choice is the
#: non-swapped tile config 7, whose split paid the separate reduction's ~3 us until v33; in the forced-config
#: sweep of v30 the 64-row tile unsplit beats its best split at M = 128 wherever it has more work items
#: (Llama-3.2-3B down: 96 against 48, 15.6 us against 17.3; Qwen2.5-1.5B down 14.0 against 13.5-18.2;
#: Llama-3.2-1B down 13.2 against 13.7-17.6) and ties where it has as many (Llama-3.1-8B / Gemma-2-9B down:
#: 26.0 / 25.1 against 26.9 / 24.9). At M = 64 the 64-row choice (BN 16 or 32: the weight read 2-4 times)
#: lost to config 16's split on the same sweep (Qwen2.5-3B down 15.2 us against 12.5-14.4), and the removed
#: reduction makes config 16's split cheaper still. Measured (H200, 2026-12-01, `python -m benchmarks.gemm_bench --mode splitk --set decode
#: --ms 1,2,4,8,16,32,64,128 --splits 2,3,4,6,8 --configs 1,2,3,16,17,18,19`, 296 shapes of the decode
#: set's 10 models), geomean cuBLASLt / ours with the v30 rule (one twin per M bucket, M <= 64) -> this
#: one: M = 32 0.892 -> 0.929, M = 64 0.811 -> 0.881, M = 128 0.780 -> 0.849 (e.g. 4096 x 4096 at M = 64:
#: config 19 9.8 us, 18 8.8; 896 x 896: config 7 4.9 us, 17 3.3), M <= 16 unchanged.
#: Each 64-row decode config's 128-row twin: the same tile width and schedule on twice the rows (config 19
#: gives config 16's bits, tests/kernels/test_sm90_gpu.py).
ROWS64_TWIN = {1: 17, 2: 18, SWAP64_DBL_CONFIG: 19}
ROWS64_IDS = tuple(ROWS64_TWIN.values())
#: The 64-row tile 128 tokens wide: above ROWS64_WIDE_MIN_M and up to ROWS64_WIDE_MAX_M, where the choice
#: is an unsplit non-swapped tile config (7, 6, 10) and config 20's grid (ceil(M / 128) x ceil(N / 64)
#: tiles, twice config 7's) fits one wave, config 20 instead: a 128 x 128 tile grid of N / 128 CTAs leaves
#: most SMs idle there and each CTA does the wgmma work of 2 (kernel-log v39). Measured (H200,
#: 2026-12-02, `python -m benchmarks.gemm_bench --mode decode --ms 64,128,256,512 --columns ours,cublas_t
#: --configs 20,14,19`, h200-2026-12-02-v39-config20-decode.json): 0.74-0.82 of the tile config's time on
#: all 21 such (layer, M) cells of the decode set (Qwen2.5-14B o at M = 128: 15.38 -> 12.44 us, cuBLASLt
#: 10.50; Llama-3.1-8B o at 256: 14.03 -> 10.76, cuBLASLt 10.48); 0.96-1.55 (geomean 1.28) where its grid
#: takes a second wave (Llama-3.1-70B qkv at M = 128, 160 tiles: 1.34), 0.87-1.27 against a split choice (kept: the
#: split keeps a long K on more SMs). M = 1024 was not measured, so the rule stops at 512.
ROWS64_WIDE_CONFIG = 20
ROWS64_WIDE_MIN_M = 64
ROWS64_WIDE_MAX_M = 512
#: Config 20 also replaces rule 3's config 19 (64 rows x 64 tokens) above ROWS64_WIDE_MIN_M where K is at most
#: ROWS64_WIDE_SHORT_K and config 20's grid fits one wave (:func:`_wide_over_rows64`): with few k-blocks a tile's
#: fixed cost (prologue, epilogue) weighs more than the extra CTAs of config 19 gain. Measured in one run (H200,
#: 2026-12-02, config 20 forced beside the choice at M = 128: h200-2026-12-02-v39-config20-decode.json and
#: h200-2026-12-02-v39-heldout-m128-512.json), config 20 / config 19, us: K <= 3072 on all 6 such cells 0.78-0.98
#: (4096 x 1024 4.63 / 5.91, 2304 x 2048 6.08 / 6.84, 4096 x 2304 7.04 / 7.71, Llama-3.2-1B qkv 6.28 / 6.95,
#: Qwen2.5-3B qkv 6.20 / 6.89, Llama-3.2-3B o 8.10 / 8.29); K = 4096 1.00-1.01 (Llama-3.1-8B o, Gemma-2-9B o,
#: 2560 x 4096); K = 8192 1.10 (Llama-3.2-3B down). Below M = 128 config 19 keeps its two column blocks and
#: config 20 its one (TMA zero-fills the missing token rows), so the ratio is at most the M = 128 one. Found by
#: the offline fit of docs/performance.md "A fitted choice model"; not yet run as a rule.
ROWS64_WIDE_SHORT_K = 3072
ROWS64_MAX_M = 128
#: Above this M a 64-row config may replace a 128-row choice that splits K (see ROWS64_IDS).
ROWS64_OVER_SPLIT_MIN_M = 64
#: Up to this M (config 1's range), where even the 128-row grid takes more than one wave (ceil(N / 128) tiles
#: > the SMs: the gate_up layers from 17920 rows on), the 64-row twin 16 wide (config 17, twice the tiles)
#: instead: the last wave's tiles are half as long and each SM keeps 16 k-blocks in flight instead of 8.
#: Measured (v30 sweep, H200, 2026-12-01, `python -m benchmarks.gemm_bench --mode splitk --set decode --ms
#: 1,2,4,8,16,32,64,128 --splits 2,3,4,6,8 --configs 1,2,3,16,17,18,19`, h200-2026-12-01-v30-config-split-sweep.json,
#: forced configs unsplit), config 17 against config 1 at M = 1 / 16, us: Qwen2.5-1.5B gate_up (17920 x 1536,
#: 140 tiles) 10.3 / 11.3 against 11.4 / 12.5 (cuBLASLt 10.5 / 10.7), Qwen2.5-3B gate_up 13.9 / 14.7 against
#: 14.8 / 15.9, Llama-3.1-70B gate_up 113.3 / 115.4 against 119.2 / 120.6 (cuBLASLt 113.1 / 115.4), Qwen2.5-32B
#: gate_up 70.2 / 71.7 against 73.3 / 75.2; faster on all 35 (layer, M) of M 1-16 where config 1 has more
#: tiles than SMs (0.900-0.996 of its time). At M = 32 (config 2 -> 18) 0.896-1.010, at M = 64 (16 -> 19)
#: 1.03-1.10: M <= 16 only. Where config 1 fits one wave and config 17 does not, config 1 stays (Llama-3.1-70B
#: qkv, 10240 x 8192: 24.8 us against 28.1; Qwen2.5-0.5B gate_up, 9728 x 896: 5.0 against 5.2).
ROWS64_MULTI_WAVE_MAX_M = 16
#: Above ROWS64_MULTI_WAVE_MAX_M up to MULTI_WAVE_TILE_MAX_M, where the swapped 128-row choice (config 2 or
#: 16) takes more than one wave (ceil(N / 128) > the SMs: gate_up from 16897 rows), no 64-row config fits one
#: wave and the large-M choice (LARGE_M_CANDIDATES by estimated_cost) fits one wave unsplit, the large-M
#: choice instead (:func:`_multi_wave_tile`). Its 128 token rows are one row block for any M <= 128: the
#: same grid, k-loop and wgmma work as at M = 128 (TMA zero-fills the missing rows, the epilogue stores
#: fewer), so its M = 128 time bounds its time at M = 17-64. Measured basis (H200, 2026-12-02,
#: `python -m benchmarks.gemm_bench --mode decode --columns ours,cublas_t`, h200-2026-12-02-v39-decode-set.json),
#: us, swapped choice at M = 32 / 64 against the large-M choice at M = 128: Qwen2.5-1.5B gate_up (17920 x
#: 1536, 140 tiles of 128) 14.32 / 15.99 against 11.34 (config 10, 125 tiles), Qwen2.5-3B gate_up (22016 x
#: 2048, 172 tiles) 18.09 / 19.86 against 17.07 (config 6, 115 tiles); cuBLASLt 10.87 / 10.80 and 15.39 /
#: 15.87. Config 7 forced at M = 64 (two waves, 140 and 172 tiles) 14.85 / 19.92
#: (h200-2026-12-02-decode-config-oracle-m64-256.json). Not for block scales (not measured there).
MULTI_WAVE_TILE_MAX_M = 64
#: Whether block-scaled launches take the 64-row configs too (their block instances). The one H200 miss of
#: config 19 (fp32 out, M = 1, N = 200, K = 1040: calc_diff 1.049e-8 against 1e-8, kernel-log v30) is the
#: tensor-core floor's spread over 200 outputs, not a wrong factor (kernel-log v32, design.md section 7).
ROWS64_BLOCK = True

#: Environment override: force one config id for every problem (benchmarks, debugging).
ENV_CONFIG = "FP8_LINEAR_SM90_CONFIG"
#: Environment override of the split-K factor (1 = off; an upper bound, see select_splits).
ENV_SPLITS = "FP8_LINEAR_SM90_SPLITS"
#: Split K only when the output tiles fill at most this fraction of the SMs...
SPLIT_MAX_BUSY_FRACTION = 0.25
#: ...and give every split at least this many 128-wide k-blocks. Both measured (H200, docs/kernel-log.md "Split K",
#: `benchmarks.gemm_bench --mode splitk` on the Llama shapes with M = 1..256): a split pays only where each CTA
#: keeps a long K range (4096 x 14336: 4 splits of 28 k-blocks, 1.14-1.59x faster); with 32-64
#: k-blocks per tile, or half the SMs already busy, the partials' round trip and the second launch
#: (1-6 us) cost more than the extra SMs give. Kept with the one-launch split (v33): at K = 4096 the
#: v30 sweep has 2 splits of 16 k-blocks 0.3-1.8 us slower than none (Llama-3.1-8B o, M = 1-128), more
#: than the removed launch saves.
MIN_KB_PER_SPLIT = 24
#: ...and on the 64-row configs, whose grids split only where N is small (at most SPLIT_MAX_BUSY_FRACTION
#: of the SMs busy: N <= 2112 at M <= 16): Qwen2.5-0.5B down (896 x 4864, 38 k-blocks, 14 tiles) at
#: M = 1 7.3 us unsplit, 4.8 in 3 splits, 4.6 in 6 (cuBLASLt 8.8); 2048 x 2048 and 1536 x 1536 (16 and 12
#: k-blocks) are faster unsplit (splitk sweep of 2026-12-01, docs/kernel-log.md v31).
MIN_KB_PER_SPLIT_ROWS64 = 12
#: ...and on the tile configs above ROWS64_MAX_M (no 64-row tile competes there), where their tiles fill at
#: most SPLIT_MAX_BUSY_FRACTION of the SMs: at M = 256 each tile is a long chain of wgmmas on one SM (128 x
#: 128 x K), so more, shorter ranges pay down to 12 k-blocks. Measured (H200, 2026-12-01, `python -m
#: benchmarks.gemm_bench --mode splitk --set decode --ms 1,16,64,128,256 --splits 2,3,4,6,8`,
#: h200-2026-12-01-splitk-decode-models.json, config 7 at M = 256, with the separate reduction): Qwen2.5-0.5B
#: down (896 x 4864, 14 tiles, 38 k-blocks) 14.0 us unsplit, 12.3 in 3 splits (cuBLASLt 7.4); Llama-3.2-1B
#: down (32 tiles, 64 k-blocks) 18.7 in 2, 16.6 in 4; Qwen2.5-1.5B down (24 tiles, 70 k-blocks) 18.9 in 2,
#: 16.2 in 4. The 12-16 k-block layers stay unsplit (Llama-3.2-1B o, 2048 x 2048: 8.0 unsplit, 11.6 in 2).
MIN_KB_PER_SPLIT_TILE_LARGE_M = 12
#: The tile configs (not swapped: M above the decode configs' range) split up to this fraction of the SMs
#: busy where every split keeps at least MIN_KB_PER_SPLIT_LONG_K k-blocks (one wave: num_sms // tiles
#: splits). Measured (H200, 2026-12-01, `python -m benchmarks.gemm_bench --mode splitk --set decode --ms
#: 1,16,64,128,256 --splits 2,3,4,6,8`, h200-2026-12-01-splitk-decode-models.json, with the separate
#: reduction), config 7: Qwen2.5-32B down (5120 x 27648, 40 tiles) at M = 128 68.3 us unsplit, 50.1 in 3
#: splits (cuBLASLt 41.7); Qwen2.5-14B down (40 tiles, 108 k-blocks) 35.1 -> 30.6 in 2; at M = 256
#: Llama-3.1-8B down (64 tiles) 36.3 -> 34.4 and Gemma-2-9B down (56) 36.2 -> 32.0 in 2; Llama-3.1-70B
#: down at M = 128 (64 tiles, 224 k-blocks) 72.9 both ways. The swapped decode configs keep the quarter:
#: below M = 64 the 64-row tiles take those layers (ROWS64_IDS).
SPLIT_LONG_K_BUSY_FRACTION = 0.5
MIN_KB_PER_SPLIT_LONG_K = 48
#: Above ROWS64_MAX_M, with up to SPLIT_LONG_K_BUSY_FRACTION of the SMs busy, ranges of at least this many
#: k-blocks (instead of MIN_KB_PER_SPLIT_LONG_K): there a 128 x 128 tile over 64-86 k-blocks runs at the SM's
#: wgmma rate (about 12 TFLOP/s per SM: Qwen2.5-1.5B down, 1536 x 8960, at M = 512 on 48 tiles 26.6 us,
#: cuBLASLt 15.8), so halving its range halves the critical path for one L2 round of partials. Measured at M =
#: 256 (h200-2026-12-01-splitk-decode-models.json, separate reduction): Llama-3.2-3B down (3072 x 8192, 48
#: tiles, 64 k-blocks) 22.0 us unsplit, 20.4 in 2 ranges of 32; the one-launch split of v33 took Llama-3.1-8B
#: down (64 tiles, 2 ranges of 56) from 42.7 to 31.3 us (docs/kernel-log.md v33). M = 512 not measured split.
MIN_KB_PER_SPLIT_LONG_K_LARGE_M = 32
#: Where the rule above splits on a swapped 128-row config (1, 2, 16: decode M, N at most a quarter of the
#: SMs' tiles), the factor takes ranges of at least this many k-blocks (the decision stays with
#: MIN_KB_PER_SPLIT: at K = 4096 two splits of 16 lost). Measured (v30 sweep, H200, 2026-12-01, `python -m
#: benchmarks.gemm_bench --mode splitk --set decode --ms 1,2,4,8,16,32,64,128 --splits 2,3,4,6,8 --configs
#: 1,2,3,16,17,18,19`, h200-2026-12-01-v30-config-split-sweep.json): Qwen2.5-1.5B down (1536 x 8960, 12 tiles,
#: 70 k-blocks) at M = 1 / 16 / 64 9.9 / 10.4 / 12.5 us in 2 splits, 7.3 / 7.9 / 10.0 in 4; Llama-3.2-1B down
#: (2048 x 8192, 16 tiles) 9.6 / 10.0 / 12.2 in 2, 9.0 / 8.1 / 10.7 in 4 (docs/kernel-log.md v34). Up to
#: SPLIT_SWAP128_BUSY_FRACTION of the SMs busy (work items): Llama-3.2-3B down (3072 x 8192, 24 tiles) keeps 2
#: splits, 10.1 / 10.7 us at M = 1 / 16 against 10.5 / 10.9 in 4.
MIN_KB_PER_SPLIT_SWAP128 = 16
SPLIT_SWAP128_BUSY_FRACTION = 0.5
#: Splits x tile width (BN) whose partials the last split of a tile loads in one round (sm90_epilogue.cuh
#: split_fixup's kDepth = 256 / BN splits for BN <= 128: 128 registers a thread); the swapped configs'
#: factor stays within it, so their fix-up waits for one L2 round trip.
FIXUP_ROUND_WIDTH = 256
#: Upper bound of the split factor that select_splits picks by itself...
MAX_SPLITS = 16
#: ...and of any split factor, FP8_LINEAR_SM90_SPLITS included (the binding refuses more).
BINDING_MAX_SPLITS = 64


def tiles(cfg: KernelConfig, m: int, n: int) -> int:
    """Number of output tiles the persistent grid walks for an ``m x n`` output."""
    rows_a, rows_b = (n, m) if cfg.swap_ab else (m, n)
    return -(-rows_a // cfg.block_m) * -(-rows_b // cfg.block_n)


def estimated_cost(cfg: KernelConfig, m: int, n: int, rel_throughput: float, num_sms: int = 132,
                   k: int = BLOCK_K, tile_overhead_kb: float = 0.0) -> float:
    """Relative time of an ``m x n x k`` problem on ``config``: waves of the persistent grid times the
    time of one tile, ``block_m x block_n x (k-blocks + tile_overhead_kb)`` over the config's relative
    per-FLOP throughput (with no overhead, K cancels out between candidates)."""
    waves = -(-tiles(cfg, m, n) // max(num_sms, 1))
    num_kb = -(-k // BLOCK_K)
    return waves * cfg.block_m * cfg.block_n * (num_kb + tile_overhead_kb) / rel_throughput


def _env_int(name: str, lo: int, hi: int, what: str) -> int | None:
    """The integer in environment variable ``name`` (None when unset or empty); ValueError unless it
    parses as an integer in [lo, hi]."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r}: expected {what}") from e
    if not lo <= value <= hi:
        raise ValueError(f"{name}={raw!r}: expected {lo}..{hi}")
    return value


def select_config(m: int, n: int, k: int, num_sms: int = 132, swap_ok: bool = False,
                  block: bool = False) -> KernelConfig:
    """Pick a config for an ``[m, k] x [n, k]`` problem.

    Decode-like M (<= 32, and <= 64 when N has at least SWAP64_DBL_MIN_N_BLOCKS row blocks or K at least
    SWAP64_DBL_MIN_K) puts N on wgmma's M side (swap A/B) with the narrowest tile that covers M, so no
    tensor-core work is spent on padding rows (for 32 < M <= 64 the two-accumulator tile
    SWAP64_DBL_CONFIG). Up to ROWS64_MAX_M, the 64-row config
    whose grid has the most tiles in one wave instead (:func:`_rows64`; up to ROWS64_MULTI_WAVE_MAX_M also
    config 17 where config 1's grid takes more than one wave), except where the 128-row choice splits K: then only above ROWS64_OVER_SPLIT_MIN_M and where the 64-row grid has more work items
    (:func:`work_items`; the 64-row config splits by its own rule). Where no 64-row config fits one wave
    and the swapped 128-row choice takes more than one, up to MULTI_WAVE_TILE_MAX_M, the large-M choice
    if its grid fits one wave (:func:`_multi_wave_tile`); above ROWS64_WIDE_MIN_M at K <= ROWS64_WIDE_SHORT_K,
    config 20 in place of the 64-row config 19 where it fits one wave (:func:`_wide_over_rows64`). Otherwise
    the fastest of LARGE_M_CANDIDATES by
    :func:`estimated_cost` (128 x 128 or 128 x 144 with two accumulators, or 128 x 192).

    ``swap_ok``: the launch has a per-tensor scale_a and a 16-bit output, what the swapped large-M
    configs' transposed TMA store serves (:func:`fp8_linear.kernels.swap_ok`). Then for N <= M the
    fastest of SWAPPED_LARGE_M_CANDIDATES is taken (the kernel's rows over the smaller dimension; with
    per-channel scale_b its epilogue loads no column vector), unless the non-swapped choice would
    split K (:func:`select_splits`; the swapped large-M configs have no split-K instances).

    ``block``: fine-grained scales (1x128 activation groups, 128x128 weight blocks). The same choice
    among the candidates with ``block_scales`` instances (BLOCK_LARGE_M_CANDIDATES: 7 and 6; not 10 and not
    the swapped large-M configs, whose epilogue serves a per-tensor scale_a and whose threads would hold
    BN activation factors each).
    """
    if m <= 0 or n <= 0 or k <= 0:
        raise ValueError(f"select_config: empty problem m={m}, n={n}, k={k}")
    forced = os.environ.get(ENV_CONFIG)
    if forced not in (None, ""):
        try:
            return config(forced)
        except ValueError as e:
            raise ValueError(f"{ENV_CONFIG}={forced!r}: {e}") from None
    base = _select_rows128(m, n, k, num_sms, swap_ok, block)
    if m > ROWS64_MAX_M or (block and not ROWS64_BLOCK):
        return _rows64_wide(base, m, n, k, num_sms, block)
    rows64 = _rows64(m, n, num_sms)
    if rows64 is None:
        return _multi_wave_tile(_rows64_wide(base, m, n, k, num_sms, block), m, n, k, num_sms, block)
    if select_splits(base, m, n, k, num_sms) > 1 and (
            m <= ROWS64_OVER_SPLIT_MIN_M or work_items(rows64, m, n, k, num_sms) <= work_items(base, m, n, k, num_sms)):
        return _split_twin(base, m, n, k, num_sms, block)
    return _wide_over_rows64(rows64, m, n, k, num_sms, block)


def _split_twin(base: KernelConfig, m: int, n: int, k: int, num_sms: int, block: bool) -> KernelConfig:
    """Config 19 (config 16's 64-row twin, split by :func:`select_splits` in turn) in place of ``base`` where
    the launch has no block scales (not measured with them), ``base`` is config 16 splitting K (32 < ``m`` <=
    ROWS64_OVER_SPLIT_MIN_M) and config 19's work items (tiles x splits) outnumber config 16's; ``base``
    otherwise. Measured (H200, 2026-12-04, config 19 forced
    beside the choice at M = 64 in two runs, ``python -m benchmarks.gemm_bench --mode decode --configs ...``,
    h200-2026-12-04-v43-cluster-decode.json and h200-2026-12-04-v45-kpair-decode.json), config 19 / the choice:
    0.940-0.958 on the three decode-set layers where config 19 has more work items (Llama-3.2-1B down 2048 x
    8192: 128 against 64; Qwen2.5-1.5B down 1536 x 8960: 120 against 48; Qwen2.5-3B down 2048 x 11008: 128
    against 64), 1.07-1.15 on the three where it has as many or fewer (Llama-3.2-3B down 48 / 48, Llama-3.1-8B
    down 64 / 128, Gemma-2-9B down 56 / 112). Unsplit, config 19 lost on all three of the first (15.4-19.4 us
    against 11.1-12.8; h200-2026-12-04-splitk-small-down-m64.json): its split is what wins there. Measured at M
    = 64; between 33 and 63 the two grids are the same (one token tile each)."""
    if block or base.id != SWAP64_DBL_CONFIG or m > ROWS64_OVER_SPLIT_MIN_M:
        return base
    twin = CONFIG_BY_ID[ROWS64_TWIN[SWAP64_DBL_CONFIG]]
    return twin if work_items(twin, m, n, k, num_sms) > work_items(base, m, n, k, num_sms) else base


def _wide_over_rows64(choice: KernelConfig, m: int, n: int, k: int, num_sms: int, block: bool) -> KernelConfig:
    """ROWS64_WIDE_CONFIG in place of config 19 (``choice``, rule 3's 64 x 64 tile) where ROWS64_WIDE_MIN_M <
    ``m``, ``k`` <= ROWS64_WIDE_SHORT_K, the launch has no block scales, ``choice`` does not split K and config
    20's grid fits one wave of ``num_sms``; ``choice`` otherwise."""
    wide = CONFIG_BY_ID[ROWS64_WIDE_CONFIG]
    if (block or choice.id != ROWS64_TWIN[SWAP64_DBL_CONFIG] or m <= ROWS64_WIDE_MIN_M or k > ROWS64_WIDE_SHORT_K
            or tiles(wide, m, n) > num_sms or select_splits(choice, m, n, k, num_sms) > 1):
        return choice
    return wide


def _rows64_wide(choice: KernelConfig, m: int, n: int, k: int, num_sms: int, block: bool) -> KernelConfig:
    """ROWS64_WIDE_CONFIG in place of ``choice`` where ROWS64_WIDE_MIN_M < ``m`` <= ROWS64_WIDE_MAX_M,
    the launch has no block scales, ``choice`` is a non-swapped tile config that does not split K and
    config 20's grid fits one wave of ``num_sms``; ``choice`` otherwise."""
    wide = CONFIG_BY_ID[ROWS64_WIDE_CONFIG]
    if (block or choice.swap_ab or not ROWS64_WIDE_MIN_M < m <= ROWS64_WIDE_MAX_M
            or tiles(wide, m, n) > num_sms or select_splits(choice, m, n, k, num_sms) > 1):
        return choice
    return wide


def _multi_wave_tile(choice: KernelConfig, m: int, n: int, k: int, num_sms: int, block: bool) -> KernelConfig:
    """The large-M choice (the least :func:`estimated_cost` of LARGE_M_CANDIDATES) in place of ``choice``
    where ROWS64_MULTI_WAVE_MAX_M < ``m`` <= MULTI_WAVE_TILE_MAX_M, the launch has no block scales,
    ``choice`` is a swapped 128-row config whose grid takes more than one wave of ``num_sms``, and the
    large-M choice's grid fits one wave without splitting K; ``choice`` otherwise."""
    if (block or not choice.swap_ab or choice.block_m != BLOCK_M
            or not ROWS64_MULTI_WAVE_MAX_M < m <= MULTI_WAVE_TILE_MAX_M or tiles(choice, m, n) <= num_sms):
        return choice
    tile = _fastest(LARGE_M_CANDIDATES, m, n, k, num_sms)
    if tiles(tile, m, n) > num_sms or select_splits(tile, m, n, k, num_sms) > 1:
        return choice
    return tile


def work_items(cfg: KernelConfig, m: int, n: int, k: int, num_sms: int = 132) -> int:
    """Work items of the persistent grid on ``cfg``: output tiles x the split-K factor of :func:`select_splits`."""
    return tiles(cfg, m, n) * select_splits(cfg, m, n, k, num_sms)


def _select_rows128(m: int, n: int, k: int, num_sms: int, swap_ok: bool, block: bool) -> KernelConfig:
    """:func:`select_config`'s choice among the configs of 128-row tiles."""
    if m <= 16:
        return CONFIG_BY_ID[1]
    if m <= 32:
        return CONFIG_BY_ID[2]
    if m <= 64 and (-(-n // BLOCK_M) >= SWAP64_DBL_MIN_N_BLOCKS or k >= SWAP64_DBL_MIN_K):
        return CONFIG_BY_ID[SWAP64_DBL_CONFIG]
    if block:
        return _fastest(BLOCK_LARGE_M_CANDIDATES, m, n, k, num_sms)
    best = _fastest(LARGE_M_CANDIDATES, m, n, k, num_sms)
    if swap_ok and n <= m and select_splits(best, m, n, k, num_sms) == 1:
        return _fastest(SWAPPED_LARGE_M_CANDIDATES, m, n, k, num_sms)
    return best


def _rows64(m: int, n: int, num_sms: int) -> KernelConfig | None:
    """The config of ROWS64_IDS whose grid has the most tiles within one wave of ``num_sms`` (the
    narrower tile on a tie); where none fits (N > 64 x ``num_sms``), config 1's 64-row twin if M <=
    ROWS64_MULTI_WAVE_MAX_M and config 1's grid takes more than one wave too, else None."""
    best, best_tiles = None, 0
    for cid in ROWS64_IDS:
        t = tiles(CONFIG_BY_ID[cid], m, n)
        if best_tiles < t <= num_sms:
            best, best_tiles = CONFIG_BY_ID[cid], t
    if best is None and m <= ROWS64_MULTI_WAVE_MAX_M and tiles(CONFIG_BY_ID[1], m, n) > num_sms:
        return CONFIG_BY_ID[ROWS64_TWIN[1]]
    return best


def _fastest(candidates: tuple[tuple[int, float, float], ...], m: int, n: int, k: int, num_sms: int) -> KernelConfig:
    """The candidate ``(config id, relative throughput, tile overhead)`` of least :func:`estimated_cost`
    (the first of equals)."""
    best, best_cost = CONFIG_BY_ID[candidates[0][0]], float("inf")
    for cid, rel, overhead in candidates:
        cost = estimated_cost(CONFIG_BY_ID[cid], m, n, rel, num_sms, k, overhead)
        if cost < best_cost:
            best, best_cost = CONFIG_BY_ID[cid], cost
    return best


def split_count(num_kb: int, splits: int) -> int:
    """Splits that actually run for ``splits`` requested over ``num_kb`` k-blocks: each split takes
    ``ceil(num_kb / splits)`` k-blocks, and only as many splits as that leaves non-empty (the host's rule
    in ``sm90_host.cu``)."""
    if splits <= 1 or num_kb <= 1:
        return 1
    per = -(-num_kb // splits)
    return -(-num_kb // per)


def select_splits(config: KernelConfig, m: int, n: int, k: int, num_sms: int = 132) -> int:
    """Split-K factor for an ``[m, k] x [n, k]`` problem on ``config`` (1 = no split).

    When the output tiles fill at most SPLIT_MAX_BUSY_FRACTION of the SMs (decode and short prefill
    shapes: e.g. M = 64, N = 4096 is 32 tiles on 132 SMs), K is cut into up to ``num_sms // tiles``
    ranges of at least MIN_KB_PER_SPLIT k-blocks (MIN_KB_PER_SPLIT_ROWS64 on the 64-row configs,
    MIN_KB_PER_SPLIT_TILE_LARGE_M on the tile configs above ROWS64_MAX_M), so that
    more SMs share the work (on the swapped 128-row configs, where that splits, ranges of
    MIN_KB_PER_SPLIT_SWAP128 k-blocks up to SPLIT_SWAP128_BUSY_FRACTION of the SMs and the splits the
    fix-up loads in one round); on the non-swapped tile configs also up to SPLIT_LONG_K_BUSY_FRACTION busy
    with ranges of at least MIN_KB_PER_SPLIT_LONG_K k-blocks (MIN_KB_PER_SPLIT_LONG_K_LARGE_M above
    ROWS64_MAX_M; long-K projections at M = 128-512); each split writes
    its fp32 partial sums to a workspace and the last split of each tile sums them and runs the epilogue
    (one launch, ``sm90_epilogue.cuh`` split_fixup).
    Only configs with split-K kernel instances (``split_k``: 1, 2, 7, 10, 16-19) split. ``FP8_LINEAR_SM90_SPLITS`` overrides (as an
    upper bound; 1 turns split K off).
    """
    if not config.split_k:
        return 1
    num_kb = -(-k // BLOCK_K)
    want = _env_int(ENV_SPLITS, 1, BINDING_MAX_SPLITS, "an integer >= 1")
    if want is not None:
        return split_count(num_kb, want)
    t = tiles(config, m, n)
    min_kb = MIN_KB_PER_SPLIT_ROWS64 if config.block_m == 64 else MIN_KB_PER_SPLIT
    if not config.swap_ab and m > ROWS64_MAX_M:
        min_kb = MIN_KB_PER_SPLIT_TILE_LARGE_M
    if t > num_sms * SPLIT_MAX_BUSY_FRACTION:
        if config.swap_ab or t > num_sms * SPLIT_LONG_K_BUSY_FRACTION:
            return 1
        min_kb = MIN_KB_PER_SPLIT_LONG_K_LARGE_M if m > ROWS64_MAX_M else MIN_KB_PER_SPLIT_LONG_K
    want = min(num_sms // t, num_kb // min_kb, MAX_SPLITS)
    if want > 1 and config.swap_ab and config.block_m == BLOCK_M:
        want = max(want, min(int(num_sms * SPLIT_SWAP128_BUSY_FRACTION) // t, num_kb // MIN_KB_PER_SPLIT_SWAP128,
                             MAX_SPLITS, FIXUP_ROUND_WIDTH // config.block_n))
    return split_count(num_kb, want)
