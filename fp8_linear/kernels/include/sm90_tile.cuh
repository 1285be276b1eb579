// The sm90 GEMM's tiling: block sizes, the launch parameters every kernel reads (EpiParams), the
// shared-memory budget and carve-up of a CTA (TileCfg, SmemLayout), the register split between the
// producer and the consumer warpgroups, and the persistent tile walk (tile_coords, split_tile).
#pragma once
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "fast_div.h"

namespace fp8sm90 {

constexpr int kBM = 128;
constexpr int kBK = 128;
constexpr int kThreads = 384;  // 128-row tiles (and the grouped kernel): producer + 2 consumer warpgroups
constexpr int kSmemLimit = 227 * 1024;
// Tile raster: groups of EpiParams::group_m row-blocks, column-major inside a
// group, so that a group's A panel stays in L2 while its columns go by. kGroupM is the default.
constexpr int kGroupM = 16;

struct EpiParams {
  // TMA store map of a tile's register strip (its last BN % 64 columns, see staged_cols): box
  // (BN % 64) columns x 64 rows, no swizzle; unused (zero) for BN % 64 == 0. First member: 64-byte
  // alignment; the kernels take EpiParams as a __grid_constant__ parameter so its address is valid
  // for TMA.
  CUtensorMap tma_strip;
  void* out;
  const float* sa;  // scale of the output's rows (m)
  const float* sb;  // scale of the output's columns (n)
  const void* bias;
  int M, N;  // output dims
  int sa_row, sb_row, bias_kind, out_kind;
  int tma_store;  // 1: epilogue through shared memory + TMA store (N * esize % 16 == 0; swapped: swap_tma_store, 16-bit)
  int group_m;    // tile raster group height in row-blocks (kGroupM unless overridden, see sm90_host.cu)
  // Split K (see split_tile): each output tile is computed as `splits` partial sums over consecutive
  // ranges of kb_per_split k-blocks, the raw fp32 partials in split_ws, summed by the tile's last split
  // (split_fixup, sm90_epilogue.cuh; split_flags: its arrival counters). splits = 1, kb_per_split = all
  // k-blocks: no split.
  int splits, kb_per_split;
  float* split_ws;   // tiles x splits x BM x BN floats (sm90_api.h split_workspace_floats)
  int* split_flags;  // one arrival counter per tile and consumer warpgroup, zero at rest
  // The tile walk's divisors as host-made FastDiv constants (tile_coords, split_tile): group_m x
  // num_n tiles per raster group, group_m, the last group's height (num_m % group_m, or group_m),
  // and splits.
  FastDiv div_per_group, div_group, div_last, div_splits;
  // Fine-grained scales (the BLK kernel instances, sm90_blockscale.cuh): scale_a [M, blk_kb] (1 x 128
  // activation groups) M-major, read by TMA through tma_sa (box: a tile's 128 rows, or its BN columns
  // when swapped, of one k-block; rows past M read as zero); scale_b [ceil(N / 128), blk_kb] (128 x 128
  // weight blocks) row-major, read from global memory. Applied at each k-block's promotion; sa / sb
  // then point at a 1.0f. Unused otherwise.
  CUtensorMap tma_sa;
  const float* blk_sb;
  int blk_kb;  // ceil(K / 128): the scales' row length
};

// Columns of a BN-wide tile that go through the swizzled TMA-store staging buffer: whole 64-column
// (128-byte 16-bit swizzle row) blocks. The rest, the "strip" (BN % 64 columns, e.g. 16 of BN = 144),
// is staged unswizzled right after them (64 rows x BN % 64 x up to 4 bytes) and stored with its own
// tensor map (EpiParams::tma_strip).
template <int BN>
constexpr int staged_cols() {
  return BN / 64 * 64;
}
template <int BN>
constexpr int strip_bytes() {  // per consumer warpgroup
  return 64 * (BN % 64) * 4;
}

// Swapped configs whose 16-bit output goes through a transposed TMA-store epilogue (stmatrix .trans into
// a [BN m-rows x 64 n-columns] 128B-swizzled tile per consumer warpgroup, one TMA box of BN rows): the
// large-M swapped tiles (configs 14 and 15: the weight on wgmma's M side). The narrow decode configs
// (BN 16 / 32 / 64) keep their direct stores.
// (Host and device; fp8_linear/kernels/configs.py KernelConfig.swap_tma_store mirrors it.)
constexpr bool swap_tma_width(int bn) { return bn >= 128; }
template <int BN, bool SWAP>
constexpr bool swap_tma_store() {
  return SWAP && swap_tma_width(BN);
}

// The kernels' dynamic shared memory. The 1024-byte alignment (the 128B swizzle atom) is declared, not
// padded for: dynamic shared memory starts at the declared alignment (there is no static shared
// memory), which keeps the 1 KB that a run-time round-up would need (the 128-wide configs: a 6th stage).
extern __shared__ __align__(1024) uint8_t g_smem[];

// Fine-grained scales (BLK): per stage, a slot of the k-block's activation scales next to its A and B
// tiles (sm90_blockscale.cuh), filled by the producer's TMA: the tile's 128 kernel rows, or its BN <= 128
// columns when swapped (one box of the M-major scale_a).
constexpr int kScaleSlotFloats = kBM;
// BLK: the weight factors of a tile (its k-blocks' scale_b entries of the one or two 128-row weight blocks
// it covers), staged in shared memory once per tile by its consumer warpgroup (sm90_blockscale.cuh
// BlkTileStaged::tile_start): up to kWFacCap k-blocks per weight block (K <= 32768 per tile or split; beyond,
// the factors come from global memory), two buffers per consumer warpgroup (alternate tiles).
constexpr int kWFacCap = 256;
template <int BN, bool SWAP>
constexpr int blk_weight_rows() {  // weight blocks one tile's columns cover: 2 if BN is not a multiple of 128
  return !SWAP && BN % kBM != 0 ? 2 : 1;
}

// BM: the tile's rows on the kernel's A side, 128 (two consumer warpgroups of 64 rows) or 64 (one consumer
// warpgroup: the swapped decode tiles of 64 weight rows, twice the CTAs of a 128-row grid; each tile lies
// inside one 128-row weight block of block scales). A 64-row tile keeps up to kMaxStages64 k-blocks in flight (16 x 8-10 KB per SM, the bytes in
// flight of the 128-row tile's 8 stages): the stage count, not the tile, sets how much of the weight stream
// an SM has requested (docs/kernel-log.md v30).
constexpr int kMaxStages128 = 8;
constexpr int kMaxStages64 = 16;
template <int BN, bool SWAP, bool BLK = false, int BM = kBM>
struct TileCfg {
  static_assert(BM == kBM || (BM == 64 && SWAP), "64-row tiles: the swapped decode tiles");
  static constexpr int kConsumers = BM / 64;           // consumer warpgroups, 64 rows each
  static constexpr int kThreads = 128 * (1 + kConsumers);  // + the producer warpgroup
  static constexpr int kStageA = BM * kBK;
  static constexpr int kStageB = BN * kBK;
  static constexpr int kStage = kStageA + kStageB;
  static constexpr int kScaleSlot = BLK ? kScaleSlotFloats * 4 : 0;  // bytes per stage
  static constexpr int kWFac = BLK ? 2 * kConsumers * blk_weight_rows<BN, SWAP>() * kWFacCap * 4 : 0;  // bytes
  // per consumer WG: 64 x staged_cols 16-bit (fp32: 64-column passes)
  static constexpr int kCTile = swap_tma_store<BN, SWAP>() ? 2 * BN * 64 * 2
                                : SWAP                      ? 0
                                                            : 2 * (64 * staged_cols<BN>() * 2 + strip_bytes<BN>());
  static constexpr int kVec = 2 * 2 * BN * 4;                // per consumer WG: column scale + column bias
  static constexpr int kBarBytes = 2 * 8 * 16;  // full + empty mbarriers of up to 16 stages
  static constexpr int kStagesFit = (kSmemLimit - kCTile - kVec - kBarBytes - kWFac) / (kStage + kScaleSlot);
  static constexpr int kMaxStages = BM == kBM ? kMaxStages128 : kMaxStages64;
  static constexpr int kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static constexpr int kSmem = kStages * (kStage + kScaleSlot) + kCTile + kVec + kBarBytes + kWFac;
  static_assert(kStages >= 4, "too few stages");
  static_assert(kStages <= 16, "kBarBytes holds the barriers of 16 stages");
  static_assert((kStages * kStage + kCTile + kVec + kBarBytes) % 128 == 0 && kScaleSlot % 128 == 0,
                "the scale slots are TMA destinations: 128-byte aligned");
  static_assert(kStageB % 1024 == 0, "B stage must keep 1024-byte alignment");
  static_assert(kSmem <= kSmemLimit, "shared memory");
  static_assert(SWAP || staged_cols<BN>() >= 64, "the fp32 epilogue stages 64-column passes");
  static_assert(!swap_tma_store<BN, SWAP>() || (BN <= 256 && BN * 128 % 1024 == 0),
                "the transposed store: one TMA box of BN <= 256 rows, each warpgroup's tile 1024-byte aligned");
};

// setmaxnreg split (register file: 64K 32-bit registers per SM, 384 threads at 168 on entry): the
// producer warpgroup gives registers to the two consumer warpgroups. A 128 x 144 tile with two
// accumulators holds 3 x 72 accumulator registers per consumer thread: consumers 240, producer 24
// (128 x 24 + 256 x 240 = 64512); otherwise consumers 232, producer 40.
template <int BN, bool DBL>
struct RegSplit {
  static constexpr bool kWide = DBL && BN > 128;
  static constexpr int kConsumer = kWide ? 240 : 232;
  static constexpr int kProducer = kWide ? 24 : 40;
  static_assert(128 * kProducer + 256 * kConsumer <= 65536, "register file");
};

// Tile t -> row block mb, column block nb: raster group g = t / (group_m x
// num_n) holds row blocks [g x group_m, + group_m) (the last group may hold fewer), column-major inside.
// The divisions use the host's FastDiv constants (EpiParams::div_*): with `/` each one was ~30
// dependent instructions at every tile start, while the tensor cores wait (ncu source counters,
// docs/kernel-log.md "Per-channel cost": about 5% of the consumer warps' samples at 6144^2 x 1280).
__device__ __forceinline__ void tile_coords(int t, int num_m, const EpiParams& ep, int& mb, int& nb) {
  const int g = fast_div(t, ep.div_per_group);
  const int first_m = g * ep.group_m;
  const int r = t - g * ep.div_per_group.d;
  const bool full = num_m - first_m >= ep.group_m;  // else the last, shorter group
  const FastDiv dg{full ? ep.div_group.d : ep.div_last.d, full ? ep.div_group.m : ep.div_last.m,
                   full ? ep.div_group.s : ep.div_last.s};
  nb = fast_div(r, dg);
  mb = first_m + r - nb * dg.d;
}

// Work item t of the persistent walk -> output tile and k-block range: with split K each tile is
// `splits` consecutive work items (t = tile * splits + split), split s covering k-blocks
// [s * kb_per, min((s + 1) * kb_per, num_kb)). The host picks kb_per so that no range is empty.
// SPLIT = false (every launch without split K: its own kernel instance, so the split's index
// arithmetic costs the large-M kernels nothing; measured 1-2% when it did: docs/kernel-log.md): one tile
// per item, all k-blocks.
template <bool SPLIT>
__device__ __forceinline__ void split_tile(int t, const EpiParams& ep, int num_kb, int& tile, int& split, int& kb0,
                                          int& nkb) {
  if constexpr (!SPLIT) {
    tile = t;
    split = kb0 = 0;
    nkb = num_kb;
    return;
  }
  tile = fast_div(t, ep.div_splits);
  split = t - tile * ep.splits;
  kb0 = split * ep.kb_per_split;
  nkb = min(ep.kb_per_split, num_kb - kb0);
}

// Shared-memory carve-up of one CTA from the 1024-byte-aligned base: S stages of A (BM x 128) and
// B (BN x 128) tiles, the consumer warpgroups' output staging (kCTile) and column vectors (kVec),
// then the S full and S empty mbarriers (kBarBytes), then (BLK) the S scale slots and the consumer
// warpgroups' weight-factor buffers (kWFac).
template <int BN, bool SWAP, bool BLK = false, int BM = kBM>
struct SmemLayout {
  uint8_t* sA;
  uint8_t* sB;
  uint8_t* sC;
  float* sVec;
  uint64_t* full;
  uint64_t* empty;
  float* scales;  // BLK: S slots of kScaleSlotFloats
  float* wfac;    // BLK: per consumer warpgroup 2 buffers of blk_weight_rows x kWFacCap floats
  __device__ __forceinline__ explicit SmemLayout(uint8_t* smem) {
    using C = TileCfg<BN, SWAP, BLK, BM>;
    sA = smem;
    sB = smem + C::kStages * C::kStageA;
    sC = sB + C::kStages * C::kStageB;
    sVec = reinterpret_cast<float*>(sC + C::kCTile);
    full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sVec) + C::kVec);
    empty = full + C::kStages;
    scales = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(full) + C::kBarBytes);
    wfac = scales + (BLK ? C::kStages * kScaleSlotFloats : 0);
  }
};

}  // namespace fp8sm90
