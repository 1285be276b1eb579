// Persistent, warp-specialized FP8 GEMM for Hopper (sm_90a).
//
//   out[m, n] = sum_k A[m, k] * B[n, k] * scale_a[m | 0] * scale_b[n | 0] + bias[n]
//
// CTA = 3 warpgroups: WG0 producer (one thread issues TMA), WG1/WG2 consumers, each owning 64 rows of
// the 128 x BN tile. BLOCK_K = 128 = one 128-byte swizzle row of fp8. K-blocks flow through a ring of
// STAGES shared-memory stages guarded by full/empty mbarriers. Each k-block is 4 wgmma k32 steps into
// a fresh accumulator which is then added into FP32 registers (promotion every 128 of K).
// DBL: two such accumulators per consumer WG, k-block i+1 issued before k-block i is retired and
// promoted (the large-M default, config 7). CL = 2: a 2-CTA cluster shares (multicasts) the B tile.
// OVL (config 9, fp8_gemm_sm90_overlap_kernel): DBL with the pipeline carried across tiles: the next
// tile's first two k-blocks are in flight while the finished tile's epilogue runs (no drain between tiles).
// Epilogue: scales, bias and the cast, staged in shared memory (stmatrix for 16-bit outputs) and
// written with TMA stores; direct clipped stores where TMA cannot take the output.
// SWAP: the caller passed (B, A) as the kernel's (A, B) so that a large N sits on wgmma's M side
// (decode shapes); the epilogue writes the transposed tile.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fast_div.h"
#include "sm90_api.h"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"

namespace fp8sm90 {

constexpr int kBM = 128;
constexpr int kBK = 128;
constexpr int kThreads = 384;
constexpr int kSmemLimit = 227 * 1024;
// Tile raster: groups of EpiParams::group_m row-blocks (pair-rows with clusters), column-major inside a
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
  int tma_store;  // 1: epilogue through shared memory + TMA store (non-swap, N * esize % 16 == 0)
  int group_m;    // tile raster group height in row-blocks (kGroupM unless overridden, see sm90_host.cu)
  // Split K (see split_tile): each output tile is computed as `splits` partial sums over consecutive
  // ranges of kb_per_split k-blocks, each stored (fp32, scaled, no bias) at out + split * split_stride;
  // the host then sums them (splitk_reduce). splits = 1, kb_per_split = all k-blocks: no split.
  int splits, kb_per_split;
  long split_stride;  // elements between two splits' [M, N] partial outputs
  // The tile walk's divisors as host-made FastDiv constants (tile_coords, split_tile): group_m x
  // num_n tiles per raster group, group_m, the last group's height (num_m % group_m, or group_m),
  // and splits. num_m counts pair-rows with clusters.
  FastDiv div_per_group, div_group, div_last, div_splits;
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

// The kernels' dynamic shared memory. The 1024-byte alignment (the 128B swizzle atom) is declared, not
// padded for: dynamic shared memory starts at the declared alignment (there is no static shared
// memory), which keeps the 1 KB that a run-time round-up would need (the 128-wide configs: a 6th stage).
extern __shared__ __align__(1024) uint8_t g_smem[];

template <int BN, bool SWAP>
struct TileCfg {
  static constexpr int kStageA = kBM * kBK;
  static constexpr int kStageB = BN * kBK;
  static constexpr int kStage = kStageA + kStageB;
  // per consumer WG: 64 x staged_cols 16-bit (fp32: 64-column passes)
  static constexpr int kCTile = SWAP ? 0 : 2 * (64 * staged_cols<BN>() * 2 + strip_bytes<BN>());
  static constexpr int kVec = 2 * 2 * BN * 4;                // per consumer WG: column scale + column bias
  static constexpr int kBarBytes = 2 * 8 * 16;
  static constexpr int kStagesFit = (kSmemLimit - kCTile - kVec - kBarBytes) / kStage;
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  static constexpr int kSmem = kStages * kStage + kCTile + kVec + kBarBytes;
  static_assert(kStages >= 4, "too few stages");
  static_assert(kStageB % 1024 == 0, "B stage must keep 1024-byte alignment");
  static_assert(kSmem <= kSmemLimit, "shared memory");
  static_assert(SWAP || staged_cols<BN>() >= 64, "the fp32 epilogue stages 64-column passes");
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

// Tile t -> row block mb (pair-row with clusters), column block nb: raster group g = t / (group_m x
// num_n) holds row blocks [g x group_m, + group_m) (the last group may hold fewer), column-major inside.
// The divisions use the host's FastDiv constants (EpiParams::div_*): with `/` each one was ~30
// dependent instructions at every tile start, while the tensor cores wait (ncu source counters,
// session 7 run 2: about 5% of the consumer warps' samples at 6144^2 x 1280).
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
// arithmetic costs the large-M kernels nothing; measured 1-2% when it did, session 6 run 7): one tile
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

__device__ __forceinline__ float load_bias(const void* p, int kind, int idx) {
  if (kind == 1) return __ldg(static_cast<const float*>(p) + idx);
  if (kind == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[idx]);
  if (kind == 3) return __half2float(static_cast<const __half*>(p)[idx]);
  return 0.f;
}

__device__ __forceinline__ void store_one(void* out, int kind, long idx, float v) {
  if (kind == 0) static_cast<float*>(out)[idx] = v;
  else if (kind == 1) static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(v);
  else static_cast<__half*>(out)[idx] = __float2half_rn(v);
}

// Two floats rounded to bf16 (BF16) or fp16 and packed, the lower column in the low half.
template <bool BF16>
__device__ __forceinline__ uint32_t pack_16bit(float v0, float v1) {
  if constexpr (BF16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

__device__ __forceinline__ void store_two(void* out, int kind, long idx, float v0, float v1) {
  if (kind == 0) *reinterpret_cast<float2*>(static_cast<float*>(out) + idx) = make_float2(v0, v1);
  else if (kind == 1) *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + idx) = __floats2bfloat162_rn(v0, v1);
  else *reinterpret_cast<__half2*>(static_cast<__half*>(out) + idx) = __floats2half2_rn(v0, v1);
}

// Per-tile epilogue operands fetched from global memory at the START of the tile (their latency
// hides behind the main loop): two per-thread row values and kColPerThread column values per thread
// (column tid + 128 * c of the tile, for the tile's BN columns over the warpgroup's 128 threads).
constexpr int kWgThreads = 128;
template <int BN>
struct EpiPrefetch {
  static constexpr int kColPerThread = (BN + kWgThreads - 1) / kWgThreads;
  float row_scale[2];                // non-swap: scale_a[m]; swap: scale_b[n]
  float row_bias[2];                 // swap only: bias[n]
  float col_scale[kColPerThread];    // non-swap: scale_b[n]; swap: scale_a[m]
  float col_bias[kColPerThread];     // non-swap: bias[n]
};

template <int BN, bool SWAP>
__device__ __forceinline__ void epi_prefetch(EpiPrefetch<BN>& pf, const EpiParams& ep, int row0, int col_base, int tid) {
  const int rows_lim = SWAP ? ep.N : ep.M;
  const int cols_lim = SWAP ? ep.M : ep.N;
  const float* rs = SWAP ? ep.sb : ep.sa;
  const int rs_row = SWAP ? ep.sb_row : ep.sa_row;
  const float* cs = SWAP ? ep.sa : ep.sb;
  const int cs_row = SWAP ? ep.sa_row : ep.sb_row;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + 8 * i;
    const bool ok = r < rows_lim;
    pf.row_scale[i] = (ok || !rs_row) ? __ldg(rs + (rs_row ? r : 0)) : 0.f;  // per-tensor: every thread
    pf.row_bias[i] = (SWAP && ok) ? load_bias(ep.bias, ep.bias_kind, r) : 0.f;
  }
#pragma unroll
  for (int q = 0; q < EpiPrefetch<BN>::kColPerThread; ++q) {
    const int lc = tid + kWgThreads * q;
    const int c = col_base + lc;
    const bool okc = lc < BN && c < cols_lim;
    // a per-tensor column scale is loaded for every thread (also past the last column): the uniform
    // epilogue (EpiMode::kUniform) takes it from col_scale[0]
    pf.col_scale[q] = (okc || !cs_row) ? __ldg(cs + (cs_row ? c : 0)) : 0.f;
    pf.col_bias[q] = (!SWAP && okc) ? load_bias(ep.bias, ep.bias_kind, c) : 0.f;
  }
}

// How the 16-bit TMA-store epilogue gets a value's column scale and bias. The formula is always
// acc * (row scale * column scale) + bias; the modes only skip loads that the launch does not need
// (ep.bias_kind, ep.sa_row, ep.sb_row are uniform per launch, so choosing costs nothing). Bitwise the
// same across modes: without a bias the "+ 0" stays (x * s + 0 turns -0 into +0 as the general path does).
enum class EpiMode {
  kGeneral,   // column scales and biases from the shared vectors (also: fp32 output, direct stores)
  kColScale,  // per-token scale_a, per-channel scale_b, no bias: the column scales, no bias loads
  kFolded,    // per-tensor scale_a, per-channel scale_b, no bias: vec holds scale_a x scale_b[c]
  kUniform,   // per-tensor scale_b, no bias: one factor per accumulator row, no shared-memory loads
};

__device__ __forceinline__ EpiMode epi_mode(const EpiParams& ep) {
  if (!ep.tma_store || ep.out_kind == 0 || ep.bias_kind) return EpiMode::kGeneral;
  if (!ep.sb_row) return EpiMode::kUniform;
  return ep.sa_row ? EpiMode::kColScale : EpiMode::kFolded;
}

// Slot of tile column c in the "by lane" order of the column scales (EpiMode::kFolded, kColScale): the
// thread of lane % 4 == t needs columns 8j + 2t and 8j + 2t + 1 of every j, so the four values of a pair
// of j (2p, 2p + 1) sit together: [p][t][(c % 16) / 8][c % 2]; one 16-byte load then gives a thread two
// fragments' scales (four distinct addresses per warp: no bank conflict).
__device__ __forceinline__ int epi_lane_slot(int c) {
  return ((c / 16) * 4 + (c % 8) / 2) * 4 + ((c % 16) / 8) * 2 + c % 2;
}

// Publish the prefetched column values into the warpgroup's shared vectors ([0, BN) scale,
// [BN, 2BN) bias); with `fold` (EpiMode::kFolded) the scale slots hold row scale x column scale, the
// product that the general formula forms per value (same operands, same order); with `by_lane`
// (kFolded, kColScale) the scales are in epi_lane_slot order, the biases always in column order.
template <int BN>
__device__ __forceinline__ void epi_publish_cols(float* vec, const EpiPrefetch<BN>& pf, int tid, bool fold,
                                                 bool by_lane) {
#pragma unroll
  for (int q = 0; q < EpiPrefetch<BN>::kColPerThread; ++q) {
    const int lc = tid + kWgThreads * q;
    if (lc < BN) {
      vec[by_lane ? epi_lane_slot(lc) : lc] = fold ? pf.row_scale[0] * pf.col_scale[q] : pf.col_scale[q];
      vec[BN + lc] = pf.col_bias[q];
    }
  }
}

// The epilogue's value pair of accumulator fragment (j, i) (columns c, c + 1, see below):
// acc * (row scale * column scale) + column bias, for column scales s0, s1 and biases b0, b1.
template <int BN>
__device__ __forceinline__ float2 epi_pair(const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf, int j, int i,
                                           float s0, float s1, float b0, float b1) {
  return make_float2(acc[4 * j + 2 * i] * (pf.row_scale[i] * s0) + b0,
                     acc[4 * j + 2 * i + 1] * (pf.row_scale[i] * s1) + b1);
}

// The value pairs of fragments (j0 + q / 2, q % 2), q = 0..3, for an even j0 (tile columns 8 j0 + lc and
// 8 (j0 + 1) + lc, lc = 2 (lane % 4)) in mode MODE; k0, k1: kUniform's factors of the thread's two rows.
template <int BN, EpiMode MODE>
__device__ __forceinline__ void epi_values(const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf, const float* vs,
                                           const float* vb, int j0, int lc, float k0, float k1, float2 (&v)[4]) {
  if constexpr (MODE == EpiMode::kFolded || MODE == EpiMode::kColScale) {
    const float4 f = *reinterpret_cast<const float4*>(vs + epi_lane_slot(8 * j0 + lc));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = j0 + q / 2, i = q % 2;
      const float s0 = q / 2 ? f.z : f.x, s1 = q / 2 ? f.w : f.y;
      if constexpr (MODE == EpiMode::kFolded) {
        v[q] = make_float2(acc[4 * j + 2 * i] * s0 + 0.f, acc[4 * j + 2 * i + 1] * s1 + 0.f);
      } else {
        v[q] = epi_pair<BN>(acc, pf, j, i, s0, s1, 0.f, 0.f);
      }
    }
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = j0 + q / 2, i = q % 2;
      const int c = 8 * j + lc;
      if constexpr (MODE == EpiMode::kUniform) {
        const float k = i ? k1 : k0;
        v[q] = make_float2(acc[4 * j + 2 * i] * k + 0.f, acc[4 * j + 2 * i + 1] * k + 0.f);
      } else {
        const float2 sc = *reinterpret_cast<const float2*>(vs + c);
        const float2 bc = *reinterpret_cast<const float2*>(vb + c);
        v[q] = epi_pair<BN>(acc, pf, j, i, sc.x, sc.y, bc.x, bc.y);
      }
    }
  }
}

// 16-bit output tile of one warpgroup (64 x BN): the strip (last BN % 64 columns, row-major
// unswizzled, pitch (BN % 64) x 2 bytes) with plain 32-bit stores, then the staged columns into the
// 128B-swizzled staging buffer with stmatrix:
// the accumulator pair (acc[4j + 2i], acc[4j + 2i + 1]) of every thread is exactly the fragment of the
// 8 x 8 matrix at rows 16 * warp + 8i + (0..7), columns 8j + (0..7); one stmatrix.x4 stores the four
// matrices (j0, 0), (j0, 1), (j0 + 1, 0), (j0 + 1, 1), lane l giving the address of row l % 8 of
// matrix l / 8 (one 16-byte chunk, swizzled: chunk index XOR row % 8). The values come from epi_values
// (column scales and biases from the shared vectors as MODE needs them).
template <int BN, bool BF16, EpiMode MODE, bool PACK_FIRST>
__device__ __forceinline__ void stage_tile_16bit(const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf,
                                                 const float* vs, const float* vb, uint8_t* ctile, uint8_t* strip,
                                                 int lane, int warp) {
  const int lc = 2 * (lane % 4);
  const int q_l = lane / 8;
  const int row_l = 16 * warp + 8 * (q_l % 2) + lane % 8;  // this lane's stmatrix row address
  // kUniform: the factor of each of the thread's two rows, row scale x the per-tensor column scale
  const float k0 = pf.row_scale[0] * pf.col_scale[0], k1 = pf.row_scale[1] * pf.col_scale[0];
  static_assert(BN % 16 == 0, "the epilogue takes the columns in pairs of 8-column fragments");
  // With column vectors to read (every mode but kUniform), every value is computed and packed before
  // the first shared-memory store: a load from the shared vectors may not move below a store that
  // could alias it, so with the stores interleaved each load's latency was exposed once per 16 columns
  // (ncu, session 7 run 2: the per-channel launch's FFMAs waiting on short_sb at 6144^2 x 1280). The
  // packed tile takes half the accumulator's registers. kUniform loads nothing and keeps the
  // interleaved order (its code is unchanged), and so does config 9 (PACK_FIRST false: it keeps the
  // next tile's k-blocks in flight here, and the packed tile spilled 52 bytes).
  constexpr bool kPackFirst = PACK_FIRST && MODE != EpiMode::kUniform;
  constexpr int kStrip = (BN - staged_cols<BN>()) / 16;  // pairs of 8-column fragments in the strip
  constexpr int kStaged = staged_cols<BN>() / 16;
  uint32_t packed[kStrip + kStaged][4];  // [strip pairs..., staged pairs...]
  auto store_pair = [&](int p) {
    if (p < kStrip) {  // the strip: row-major, pitch (BN % 64) x 2 bytes, plain 32-bit stores
      constexpr int kW = BN % 64;
      const int lr0 = warp * 16 + lane / 4;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int cs = 16 * p + 8 * (q / 2) + lc;  // column within the strip
        *reinterpret_cast<uint32_t*>(strip + (lr0 + 8 * (q % 2)) * kW * 2 + cs * 2) = packed[p][q];
      }
    } else {  // the staged columns, one stmatrix.x4
      const int col8 = 2 * (p - kStrip) + q_l / 2;  // 16-byte chunk of 8 columns
      uint8_t* dst = ctile + (col8 / 8) * (64 * 128) + row_l * 128 + (((col8 % 8) ^ (row_l & 7)) << 4);
      stmatrix_x4(dst, packed[p][0], packed[p][1], packed[p][2], packed[p][3]);
    }
  };
#pragma unroll
  for (int p = 0; p < kStrip + kStaged; ++p) {
    const int j0 = p < kStrip ? staged_cols<BN>() / 8 + 2 * p : 2 * (p - kStrip);
    float2 v[4];
    epi_values<BN, MODE>(acc, pf, vs, vb, j0, lc, k0, k1, v);
#pragma unroll
    for (int q = 0; q < 4; ++q) packed[p][q] = pack_16bit<BF16>(v[q].x, v[q].y);
    if constexpr (!kPackFirst) store_pair(p);
  }
  if constexpr (kPackFirst) {
#pragma unroll
    for (int p = 0; p < kStrip + kStaged; ++p) store_pair(p);
  }
}

template <int BN, bool BF16, bool PACK_FIRST>
__device__ __forceinline__ void stage_16bit_mode(EpiMode mode, const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf,
                                                 const float* vs, const float* vb, uint8_t* ctile, uint8_t* strip,
                                                 int lane, int warp) {
  switch (mode) {
    case EpiMode::kUniform: stage_tile_16bit<BN, BF16, EpiMode::kUniform, PACK_FIRST>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    case EpiMode::kFolded: stage_tile_16bit<BN, BF16, EpiMode::kFolded, PACK_FIRST>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    case EpiMode::kColScale: stage_tile_16bit<BN, BF16, EpiMode::kColScale, PACK_FIRST>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    default: stage_tile_16bit<BN, BF16, EpiMode::kGeneral, PACK_FIRST>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
  }
}

// Accumulator fragment of wgmma m64nBN (per thread): value acc[4j + 2i + e] sits at
// row = 16*warp + lane/4 + 8*i, col = 8*j + 2*(lane%4) + e  (of the warpgroup's 64 x BN block).
// vec: this warpgroup's shared column vectors, [0, BN) scale, [BN, 2BN) bias.
// ctile: this warpgroup's 64 x BN output staging buffer (TMA store path).
template <int BN, bool SWAP, bool PACK_FIRST = true>
__device__ __forceinline__ void epilogue(const float (&acc)[BN / 2], const EpiParams& ep, const EpiPrefetch<BN>& pf,
                                         const float* vec, uint8_t* ctile, const CUtensorMap* tma_out,
                                         int row0, int col_base, int lr0, int lane, int tid, int bar_id,
                                         int tile_row0, long out_off = 0) {
  if constexpr (!SWAP) {
    const float* vs = vec;
    const float* vb = vec + BN;
    if (ep.tma_store) {
      // Stage the 64 x BN tile in shared memory with the 128-byte swizzle (conflict-free writes),
      // then one thread stores it with TMA, which clips rows >= M and columns >= N.
      const int lc = 2 * (lane % 4);
      uint8_t* strip = ctile + 64 * staged_cols<BN>() * 2;
      if (staged_cols<BN>() < BN && ep.out_kind == 0) {
        // fp32: the strip (last BN % 64 columns), row-major unswizzled: row pitch (BN % 64) x 4 bytes
        // (16-bit outputs: in stage_tile_16bit).
        constexpr int kW = BN % 64;
#pragma unroll
        for (int j = staged_cols<BN>() / 8; j < BN / 8; ++j) {
          const int c = 8 * j + lc;
          const int cs = c - staged_cols<BN>();
          const float s0 = vs[c], s1 = vs[c + 1], b0 = vb[c], b1 = vb[c + 1];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int r = lr0 + 8 * i;
            const auto [v0, v1] = epi_pair<BN>(acc, pf, j, i, s0, s1, b0, b1);
            *reinterpret_cast<float2*>(strip + r * kW * 4 + cs * 4) = make_float2(v0, v1);
          }
        }
      }
      // tid 0, after the first staging barrier: the strip's TMA store (clipped like the others).
      auto store_strip = [&]() {
        if constexpr (staged_cols<BN>() < BN) {
          const int gc = col_base + staged_cols<BN>();
          if (gc < ep.N) tma_store_2d(&ep.tma_strip, strip, gc, tile_row0);
        }
      };
      if (ep.out_kind == 0) {
        // fp32: 64 columns (two 32-column swizzle blocks, 16 KiB) per pass, over the staged columns.
#pragma unroll
        for (int h = 0; h < staged_cols<BN>() / 64; ++h) {
          if (h > 0) {
            if (tid == 0) bulk_wait_read0();
            named_bar_sync(bar_id, 128);
          }
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = h * 8 + jj;
            const int c = 8 * j + lc;
            const float s0 = vs[c], s1 = vs[c + 1], b0 = vb[c], b1 = vb[c + 1];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int r = lr0 + 8 * i;
              const auto [v0, v1] = epi_pair<BN>(acc, pf, j, i, s0, s1, b0, b1);
              const int cl = c - 64 * h;
              const int sub = cl / 32, byte = (cl % 32) * 4;
              uint8_t* dst = ctile + sub * (64 * 128) + r * 128 + ((((byte >> 4) ^ (r & 7)) << 4) | (byte & 15));
              *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
            }
          }
          fence_proxy_async();  // generic-proxy smem writes -> visible to the TMA engine
          named_bar_sync(bar_id, 128);
          if (tid == 0 && tile_row0 < ep.M) {
#pragma unroll
            for (int sub = 0; sub < 2; ++sub) {
              const int gc = col_base + 64 * h + 32 * sub;
              if (gc < ep.N) tma_store_2d(tma_out, ctile + sub * (64 * 128), gc, tile_row0);
            }
            if (h == 0) store_strip();
            bulk_commit();
          }
        }
      } else {
        constexpr int W = 64;  // 16-bit elements per 128-byte swizzle row
        const EpiMode mode = epi_mode(ep);
        const int w = tid / 32;
        if (ep.out_kind == 1) stage_16bit_mode<BN, true, PACK_FIRST>(mode, acc, pf, vs, vb, ctile, strip, lane, w);
        else stage_16bit_mode<BN, false, PACK_FIRST>(mode, acc, pf, vs, vb, ctile, strip, lane, w);
        fence_proxy_async();  // generic-proxy smem writes -> visible to the TMA engine
        named_bar_sync(bar_id, 128);
        if (tid == 0 && tile_row0 < ep.M) {
#pragma unroll
          for (int sub = 0; sub < staged_cols<BN>() / W; ++sub) {
            const int gc = col_base + sub * W;
            if (gc < ep.N) tma_store_2d(tma_out, ctile + sub * (64 * 128), gc, tile_row0);
          }
          store_strip();
          bulk_commit();
        }
      }
      return;
    }
    // Direct (clipped) global stores.
    const bool pair_ok = (ep.N % 2) == 0;
    const int col0 = col_base + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int c = col0 + 8 * j;
      if (c >= ep.N) continue;
      const int lc = c - col_base;
      const bool c1 = c + 1 < ep.N;
      const float s0 = vs[lc], s1 = vs[lc + 1], b0 = vb[lc], b1 = vb[lc + 1];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = row0 + 8 * i;
        if (r >= ep.M) continue;
        const long idx = static_cast<long>(r) * ep.N + c + out_off;
        const auto [v0, v1] = epi_pair<BN>(acc, pf, j, i, s0, s1, b0, b1);
        if (pair_ok) {  // c is even, so idx is even: 2-element vector store is aligned
          store_two(ep.out, ep.out_kind, idx, v0, v1);
        } else {
          store_one(ep.out, ep.out_kind, idx, v0);
          if (c1) store_one(ep.out, ep.out_kind, idx + 1, v1);
        }
      }
    }
  } else {
    // kernel rows = output cols n, kernel cols = output rows m: out[m, n] = acc[n-row, m-col].
    const int col0 = col_base + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = col0 + 8 * j + e;
        if (m >= ep.M) continue;
        const float sm = vec[m - col_base];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int n = row0 + 8 * i;
          if (n >= ep.N) continue;
          const long idx = static_cast<long>(m) * ep.N + n + out_off;
          store_one(ep.out, ep.out_kind, idx, acc[4 * j + 2 * i + e] * (pf.row_scale[i] * sm) + pf.row_bias[i]);
        }
      }
    }
  }
}

// One 128-wide k-block = 4 wgmma k32 steps. NACC accumulators: steps are split evenly among them
// (NACC = 1: all four into one; 2: two each; 4: one each), each starting from zero, so the tensor
// core's reduced-precision accumulation spans at most 128 / NACC of K before the FP32 promotion.
template <int BN, int NACC, int FA, int FB>
__device__ __forceinline__ void issue_kblock(float (&acc)[NACC][BN / 2], const uint8_t* a_tile, const uint8_t* b_tile) {
  const uint64_t da = make_desc_sw128(a_tile);
  const uint64_t db = make_desc_sw128(b_tile);
#pragma unroll
  for (int q = 0; q < NACC; ++q)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_reg(acc[q][i]);
  wgmma_fence();
  constexpr int kSteps = kBK / 32;
  constexpr int kPer = kSteps / NACC;
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    // +32 bytes along K inside the 128-byte swizzled row = +2 in the descriptor's 16-byte units.
    wgmma_fp8<BN, FA, FB>(acc[k / kPer], da + 2 * k, db + 2 * k, k % kPer);  // first step per acc: scale-d = 0
  }
  wgmma_commit();
}

// Arrive on the empty barrier of stage `s` once per warp, on every CTA that writes into this stage:
// with clusters, lane r arrives on CTA r's (both CTAs multicast into both), in parallel.
template <int CL>
__device__ __forceinline__ void release_stage(uint64_t* empty, int s, int lane) {
  if constexpr (CL == 1) {
    if (lane == 0) mbar_arrive(&empty[s]);
  } else {
    if (lane < CL) mbar_arrive_cluster(&empty[s], lane);
  }
}

// FP32 promotion: fin += the k-block's partial sums (NACC accumulators).
template <int BN, int NACC>
__device__ __forceinline__ void promote(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2]) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
#pragma unroll
    for (int q = 0; q < NACC; ++q) fence_reg(acc[q][i]);
    float part = acc[0][i];
#pragma unroll
    for (int q = 1; q < NACC; ++q) part += acc[q][i];
    fin[i] += part;
  }
}

// DBL: two accumulators; k-block i+1's wgmmas are issued before k-block i is promoted
// (wgmma.wait_group 1), so the tensor core always has this warpgroup's next k-block queued. The
// roles of the two accumulators are fixed in each half of the loop body (no run-time indexing). The
// two halves are written out on purpose: folded into one lambda with the accumulators as arguments,
// ptxas no longer proves the pipeline and serializes every wgmma (C7514 + C7517, nvcc 13.0).
// after_first() runs right after the first k-block's wgmmas are issued (the tile's epilogue prefetch:
// its address arithmetic and loads then overlap the MMAs instead of delaying the first issue).
template <int BN, int CL, int FA, int FB, int S, int kStageA, int kStageB, class AfterFirst>
__device__ __forceinline__ void mainloop_double(float (&fin)[BN / 2], const uint8_t* sA, const uint8_t* sB,
                                                uint64_t* full, uint64_t* empty, int& stage, uint32_t& phase,
                                                int num_kb, int lane, AfterFirst&& after_first) {
  float a0[1][BN / 2], a1[1][BN / 2];
  auto advance = [&]() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }
  };
  mbar_wait(&full[stage], phase);
  issue_kblock<BN, 1, FA, FB>(a0, sA + stage * kStageA, sB + stage * kStageB);
  after_first();  // work of the tile start that can run while the first k-block's MMAs do
  int prev = stage;
  advance();
  for (int kb = 1;; ++kb) {
    if (kb == num_kb) {
      wgmma_wait<0>();
      release_stage<CL>(empty, prev, lane);
      promote<BN, 1>(fin, a0);
      break;
    }
    mbar_wait(&full[stage], phase);
    issue_kblock<BN, 1, FA, FB>(a1, sA + stage * kStageA, sB + stage * kStageB);
    wgmma_wait<1>();
    release_stage<CL>(empty, prev, lane);
    promote<BN, 1>(fin, a0);
    prev = stage;
    advance();
    if (++kb == num_kb) {
      wgmma_wait<0>();
      release_stage<CL>(empty, prev, lane);
      promote<BN, 1>(fin, a1);
      break;
    }
    mbar_wait(&full[stage], phase);
    issue_kblock<BN, 1, FA, FB>(a0, sA + stage * kStageA, sB + stage * kStageB);
    wgmma_wait<1>();
    release_stage<CL>(empty, prev, lane);
    promote<BN, 1>(fin, a1);
    prev = stage;
    advance();
  }
}

// Shared-memory carve-up of one CTA from the 1024-byte-aligned base: S stages of A (128 x 128) and
// B (BN x 128) tiles, the consumer warpgroups' output staging (kCTile) and column vectors (kVec),
// then the S full and S empty mbarriers.
template <int BN, bool SWAP>
struct SmemLayout {
  uint8_t* sA;
  uint8_t* sB;
  uint8_t* sC;
  float* sVec;
  uint64_t* full;
  uint64_t* empty;
  __device__ __forceinline__ explicit SmemLayout(uint8_t* smem) {
    using C = TileCfg<BN, SWAP>;
    sA = smem;
    sB = smem + C::kStages * C::kStageA;
    sC = sB + C::kStages * C::kStageB;
    sVec = reinterpret_cast<float*>(sC + C::kCTile);
    full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sVec) + C::kVec);
    empty = full + C::kStages;
  }
};

// Thread 0: prefetch the operand tensor maps and initialise the stage barriers.
//   full[s]:  1 arrival (the producer's arrive.expect_tx) + the stage's TMA bytes; consumers wait on it.
//   empty[s]: one arrival per consumer warp (2 warpgroups x 4 warps) of every CTA reading the stage;
//             the producer waits on it before refilling the stage.
template <int S, int CL>
__device__ __forceinline__ void init_stage_barriers(const CUtensorMap* tma_a, const CUtensorMap* tma_b,
                                                    uint64_t* full, uint64_t* empty) {
  tma_prefetch_desc(tma_a);
  tma_prefetch_desc(tma_b);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], 8 * CL);  // one arrival per consumer warp (2 warpgroups x 4 warps) per CTA
  }
  fence_mbar_init();
  fence_proxy_async();
}

// The producer thread: for every tile of this CTA, every k-block: wait until the stage is empty, then
// load A (128 rows) and B (BN rows; with clusters half of it, multicast) into it, completing on full[].
template <int BN, int CL, int S, int kStageA, int kStageB, int kStage, bool SPLIT = false>
__device__ __forceinline__ void producer_loop(const CUtensorMap* tma_a, const CUtensorMap* tma_b, uint8_t* sA,
                                              uint8_t* sB, uint64_t* full, uint64_t* empty, int first_tile,
                                              int num_tiles, int tile_step, int num_mp, int num_kb,
                                              uint32_t rank, const EpiParams& ep) {
  int stage = 0;
  uint32_t phase = 0;
  for (int t = first_tile; t < num_tiles; t += tile_step) {
    int tile, split, kb0, nkb, mb, nb;
    split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
    tile_coords(tile, num_mp, ep, mb, nb);
    mb = mb * CL + rank;
    for (int kb = kb0; kb < kb0 + nkb; ++kb) {
      mbar_wait(&empty[stage], phase ^ 1);
      mbar_arrive_expect_tx(&full[stage], kStage);  // OOB parts are zero-filled and still counted
      tma_load_2d(sA + stage * kStageA, tma_a, &full[stage], kb * kBK, mb * kBM);
      if constexpr (CL == 1) {
        tma_load_2d(sB + stage * kStageB, tma_b, &full[stage], kb * kBK, nb * BN);
      } else {
        constexpr int kHalf = BN / 2;
        tma_load_2d_mc(sB + stage * kStageB + rank * kHalf * kBK, tma_b, &full[stage], kb * kBK,
                       nb * BN + rank * kHalf, static_cast<uint16_t>(0x3));
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

// End of a tile for one consumer warpgroup: once its previous TMA store has finished reading ctile
// (bulk_wait_read0) and every thread passed barrier bar_id (the warpgroup's own named barrier, 128
// threads: nobody still reads vec / ctile of the previous tile), publish this tile's column
// scales/bias to vec, barrier again (vec complete), then the epilogue.
template <int BN, bool SWAP, bool PACK_FIRST = true>
__device__ __forceinline__ void finish_tile(const float (&fin)[BN / 2], const EpiParams& ep, const EpiPrefetch<BN>& pf,
                                            float* vec, uint8_t* ctile, const CUtensorMap* tma_out, int row0,
                                            int col_base, int lr0, int lane, int tid, int bar_id, int tile_row0,
                                            long out_off = 0) {
  if (!SWAP && tid == 0) bulk_wait_read0();
  named_bar_sync(bar_id, 128);
  const EpiMode mode = SWAP ? EpiMode::kGeneral : epi_mode(ep);
  epi_publish_cols<BN>(vec, pf, tid, mode == EpiMode::kFolded,
                       mode == EpiMode::kFolded || mode == EpiMode::kColScale);
  named_bar_sync(bar_id, 128);
  epilogue<BN, SWAP, PACK_FIRST>(fin, ep, pf, vec, ctile, tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0,
                                 out_off);
}

// CARRY (configs 12, 13; measured in session 5: no faster than 7 / 10, not selected): config 7's / 10's two accumulators, with
// each tile's first k-block issued BEFORE the previous tile's epilogue, so that the tensor cores work
// through the epilogue (configs 7/10 drain at every tile end: wait_group 0, promote, epilogue, and
// only then the next MMA; benchmarks/NOTES.md, session 4). One warpgroup's schedule, one flat loop over
// k-block pairs, n = num_kb even (the host routes odd n to the base kernel):
//   kb 0 -> a0 (issued before the previous epilogue), kb 1 -> a1, kb 2 -> a0, ..., kb n-1 -> a1;
//   each issue is followed by wait_group 1 (the previous k-block retired), its stage's release and its
//   promotion into fin, in mainloop_double's order (so the output is bit for bit config 7's / 10's).
// Tile end: kb n-1 in flight in a1; the next tile's kb 0 goes into a0 (after the CTA's last tile: a
// dummy re-read of kb n-1's stage, so that every path has the same wgmma groups in flight), wait_group
// 1, promote a1, then the epilogue runs with that k-block in flight. What ptxas (nvcc 13.0) needs to
// keep the wgmmas pipelined here (found by compiling variants, NOTES.md v13): the accumulators' first
// k32 step write-only (issue_kblock_fresh), and an exit at the loop head that drains with wait_group 0
// (never taken for even n; without it every wgmma is serialized, C7514).
// One 128-wide k-block into an accumulator whose old value is dead: the first k32 step with scale-d =
// false through the write-only wrapper, so the old value is not kept alive across the epilogue.
template <int BN, int FA, int FB>
__device__ __forceinline__ void issue_kblock_fresh(float (&acc)[BN / 2], const uint8_t* a_tile, const uint8_t* b_tile) {
  const uint64_t da = make_desc_sw128(a_tile);
  const uint64_t db = make_desc_sw128(b_tile);
  wgmma_fence();
  wgmma_fp8_zero<BN, FA, FB>(acc, da, db);
#pragma unroll
  for (int k = 1; k < kBK / 32; ++k) wgmma_fp8<BN, FA, FB>(acc, da + 2 * k, db + 2 * k, 1);
  wgmma_commit();
}

template <int BN, int FA, int FB, int S, int kStageA, int kStageB>
__device__ __forceinline__ void consumer_carry(const uint8_t* sA, const uint8_t* sB, uint64_t* full, uint64_t* empty,
                                               const EpiParams& ep, float* vec, uint8_t* ctile,
                                               const CUtensorMap* tma_out, int first_tile, int num_tiles,
                                               int tile_step, int num_m, int num_n, int num_kb, int cw, int tid,
                                               int warp, int lane, int bar_id) {
  if (first_tile >= num_tiles) return;
  int stage = 0;
  uint32_t phase = 0;
  auto advance = [&]() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }
  };
  const int lr0 = warp * 16 + lane / 4;  // local row inside the warpgroup's 64 rows
  int t = first_tile;
  int tile_row0, row0, col_base;
  bool last_tile;  // t is this CTA's last tile (one flag: t and num_tiles kept in the loop spilled at BN 144)
  EpiPrefetch<BN> pf;
  auto begin_tile = [&]() {
    last_tile = t + tile_step >= num_tiles;
    int mb, nb;
    tile_coords(t, num_m, ep, mb, nb);
    tile_row0 = mb * kBM + cw * 64;
    row0 = tile_row0 + lr0;
    col_base = nb * BN;
    epi_prefetch<BN, false>(pf, ep, row0, col_base, tid);
  };
  float a0[1][BN / 2], a1[1][BN / 2];  // promote<BN, 1>'s layout
  float fin[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
  begin_tile();
  mbar_wait(&full[stage], phase);
  issue_kblock_fresh<BN, FA, FB>(a0[0], sA + stage * kStageA, sB + stage * kStageB);  // tile t, kb 0
  int prev = stage;
  advance();
  int kb = 1;  // this iteration's odd k-block
  for (;;) {
    if (kb >= num_kb) {  // never taken (n even); ptxas's pipelining needs this draining exit (above)
      wgmma_wait<0>();
      return;
    }
    // kb (odd) -> a1; retire and promote a0 (kb - 1)
    mbar_wait(&full[stage], phase);
    issue_kblock_fresh<BN, FA, FB>(a1[0], sA + stage * kStageA, sB + stage * kStageB);
    wgmma_wait<1>();
    release_stage<1>(empty, prev, lane);
    promote<BN, 1>(fin, a0);
    prev = stage;
    advance();
    // the even k-block -> a0: kb + 1 of this tile, the next tile's kb 0, or (after this CTA's last
    // tile) the dummy re-read of kb's stage; then retire and promote a1 (kb)
    const bool tile_end = kb + 1 == num_kb;
    const bool last = tile_end && last_tile;
    if (!last) mbar_wait(&full[stage], phase);
    const int nst = last ? prev : stage;
    issue_kblock_fresh<BN, FA, FB>(a0[0], sA + nst * kStageA, sB + nst * kStageB);
    wgmma_wait<1>();
    if (!last) release_stage<1>(empty, prev, lane);
    promote<BN, 1>(fin, a1);
    if (!last) {
      prev = stage;
      advance();
    }
    kb += 2;
    if (tile_end) {
      finish_tile<BN, false>(fin, ep, pf, vec, ctile, tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0);
      if (last) break;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
      t += tile_step;
      begin_tile();
      kb = 1;
    }
  }
  wgmma_wait<0>();  // the dummy k-block (its stage is not released: the producer has finished)
}

template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL, bool CARRY = false, bool SPLIT = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ CUtensorMap tma_out, int rows_a, int rows_b, int K,
                         const __grid_constant__ EpiParams ep) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using C = TileCfg<BN, SWAP>;
  constexpr int S = C::kStages;
  uint8_t* smem = g_smem;
  const SmemLayout<BN, SWAP> L(smem);
  uint8_t* sA = L.sA;
  uint8_t* sB = L.sB;
  uint8_t* sC = L.sC;
  float* sVec = L.sVec;
  uint64_t* full = L.full;
  uint64_t* empty = L.empty;

  static_assert(CL == 1 || (CL == 2 && !SWAP), "clusters only for the non-swapped config");
  // CL == 2: a cluster of two CTAs takes a 256 x BN "pair tile": CTA r computes row-block 2p + r, and
  // each CTA loads half of the shared B tile, multicast into both CTAs' shared memory.
  const int num_m = (rows_a + kBM - 1) / kBM;
  const int num_mp = (num_m + CL - 1) / CL;
  const int num_n = (rows_b + BN - 1) / BN;
  const int num_kb = (K + kBK - 1) / kBK;
  static_assert(!SPLIT || (CL == 1 && !CARRY), "split K: single-CTA configs without the carried schedule");
  const int num_tiles = num_mp * num_n * (SPLIT ? ep.splits : 1);  // work items: tiles x K splits
  const int wg = threadIdx.x / 128;
  const uint32_t rank = CL > 1 ? cluster_ctarank() : 0;
  const int first_tile = blockIdx.x / CL;
  const int tile_step = gridDim.x / CL;

  if (threadIdx.x == 0) init_stage_barriers<S, CL>(&tma_a, &tma_b, full, empty);
  if constexpr (CL > 1) cluster_sync();  // peers' barriers are initialised before any multicast
  else __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<RegSplit<BN, DBL>::kProducer>();
    if (threadIdx.x == 0) {
      producer_loop<BN, CL, S, C::kStageA, C::kStageB, C::kStage, SPLIT>(&tma_a, &tma_b, sA, sB, full, empty, first_tile,
                                                                  num_tiles, tile_step, num_mp, num_kb, rank, ep);
    }
  } else {
    // ------------------------------------------------------------ consumers
    setmaxnreg_inc<RegSplit<BN, DBL>::kConsumer>();
    const int cw = wg - 1;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int bar_id = 1 + cw;
    float* vec = sVec + cw * 2 * BN;
    uint8_t* ctile = sC + cw * (C::kCTile / 2);
    int stage = 0;
    uint32_t phase = 0;
    if constexpr (CARRY) {
      static_assert(DBL && NACC == 1 && CL == 1 && !SWAP, "CARRY is the two-accumulator single-CTA schedule");
      consumer_carry<BN, FA, FB, S, C::kStageA, C::kStageB>(sA + cw * 64 * kBK, sB, full, empty, ep, vec, ctile,
                                                            &tma_out, first_tile, num_tiles, tile_step, num_mp,
                                                            num_n, num_kb, cw, tid, warp, lane, bar_id);
    } else
    for (int t = first_tile; t < num_tiles; t += tile_step) {
      int tile, split, kb0, nkb, mb, nb;
      split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
      tile_coords(tile, num_mp, ep, mb, nb);
      mb = mb * CL + rank;
      const int lr0 = warp * 16 + lane / 4;  // local row inside the warpgroup's 64 rows
      const int tile_row0 = mb * kBM + cw * 64;
      const int row0 = tile_row0 + lr0;
      const int col_base = nb * BN;
      EpiPrefetch<BN> pf;

      float fin[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
      if constexpr (DBL) {
        static_assert(NACC == 1, "DBL keeps one accumulator per k-block");
        mainloop_double<BN, CL, FA, FB, S, C::kStageA, C::kStageB>(
            fin, sA + cw * 64 * kBK, sB, full, empty, stage, phase, nkb, lane,
            [&]() { epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid); });
      } else {
        epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid);
        float acc[NACC][BN / 2];
        for (int kb = 0; kb < nkb; ++kb) {
          mbar_wait(&full[stage], phase);
          issue_kblock<BN, NACC, FA, FB>(acc, sA + stage * C::kStageA + cw * 64 * kBK, sB + stage * C::kStageB);
          wgmma_wait<0>();
          release_stage<CL>(empty, stage, lane);
          promote<BN, NACC>(fin, acc);  // FP32 promotion every 128 / NACC of K
          if (++stage == S) {
            stage = 0;
            phase ^= 1;
          }
        }
      }

      finish_tile<BN, SWAP>(fin, ep, pf, vec, ctile, &tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0,
                            SPLIT ? split * ep.split_stride : 0);
    }
    if (!SWAP && tid == 0) bulk_wait0();
  }
  // No CTA may leave while its peer can still multicast into it or arrive on its barriers.
  if constexpr (CL > 1) cluster_sync();
#endif
}

// ---------------------------------------------------------------------------------------------------
// OVL (config 9): config 7's two accumulators per consumer warpgroup, with the k-block pipeline carried
// across tile boundaries (consumer_stream). Config 7 drains its pipeline at the end of every tile
// (wait_group 0) and then runs the epilogue with no MMA of its own queued: measured as about 2
// k-blocks of tensor-core time per tile (NOTES.md v8). Here the next tile's first k-block is issued
// before the finished tile's last one is retired, its second right after, and the epilogue (scales,
// bias, cast, stmatrix staging, TMA store; all on `fin`, which no wgmma touches) runs while they execute.
//
// Stage ring, per consumer warpgroup: `iss` = (stage, phase) of the next k-block to issue (waited on
// full[]), `rel` = stage of the oldest k-block still in flight (arrived on empty[] once its wgmmas
// have retired). The warpgroup holds at most two stages; k-blocks are consumed and released in ring
// order, across tiles, exactly as the producer fills them.
struct RingPos {
  int stage;
  uint32_t phase;
};

template <int S>
__device__ __forceinline__ void ring_advance(RingPos& p) {
  if (++p.stage == S) {
    p.stage = 0;
    p.phase ^= 1;
  }
}

// Wait until the stage at `iss` is full (producer's TMA bytes landed), issue its k-block into `acc`
// (4 wgmma k32 steps, one commit group) and move `iss` on.
template <int BN, int FA, int FB, int S, int kStageA, int kStageB>
__device__ __forceinline__ void issue_next_kblock(float (&acc)[1][BN / 2], const uint8_t* sA, const uint8_t* sB,
                                                  uint64_t* full, RingPos& iss) {
  mbar_wait(&full[iss.stage], iss.phase);
  issue_kblock<BN, 1, FA, FB>(acc, sA + iss.stage * kStageA, sB + iss.stage * kStageB);
  ring_advance<S>(iss);
}

// The oldest k-block's wgmmas have retired (after wgmma_wait): this warp no longer reads its stage.
template <int S>
__device__ __forceinline__ void retire_oldest(uint64_t* empty, int& rel, int lane) {
  release_stage<1>(empty, rel, lane);
  rel = rel + 1 == S ? 0 : rel + 1;
}

// One consumer warpgroup (cw = 0 or 1: rows 64 * cw .. 64 * cw + 63 of each 128 x BN tile) over its
// tiles t = first_tile, first_tile + tile_step, ... as ONE stream of k-blocks g = 0 .. total - 1
// (tile g / num_kb, k-block g % num_kb): mainloop_double's two-accumulator loop (a0: even g, a1: odd
// g; issue g, wait_group 1, retire and promote g - 1), run across tile boundaries. When g - 1 was a
// tile's last k-block, the next tile's k-blocks g and g + 1 are put in flight and that tile's epilogue
// runs under them: the tensor core keeps working through the epilogue and never drains between
// tiles. Needs num_kb >= 2 (launch_one runs config 7's kernel for K <= 128).
// ptxas constraints (nvcc 13.0), why the code looks the way it does:
//  - the halves are written out with fixed accumulator roles (a lambda over swapped accumulators
//    serializes the wgmmas, C7514);
//  - wherever paths join, the same wgmma groups are in flight in the same order (the gotos land right
//    after the other half's issue, where that holds); joins of different in-flight states made ptxas
//    inject a full wait before the epilogue (C7517) or serialize every wgmma (C7514);
//  - no __trap() in the consumer path (it, too, made ptxas serialize the wgmmas);
//  - the epilogue recomputes its pointers and thread indices per tile (opaque asm copies): hoisted out
//    of the loop for each of the epilogue's copies they spilled (24-216 bytes).
template <int BN, int FA, int FB>
__device__ __forceinline__ void consumer_stream(const SmemLayout<BN, false>& L, const EpiParams& ep,
                                                const CUtensorMap* tma_out, int cw, int first_tile, int num_tiles,
                                                int tile_step, int num_m, int num_n, int num_kb) {
  using C = TileCfg<BN, false>;
  constexpr int S = C::kStages;
  if (first_tile >= num_tiles) return;  // (the grid has at most one CTA per tile)
  const int tid = threadIdx.x % kWgThreads;
  const int warp = tid / 32;
  const int lane = tid % 32;
  float* vec = L.sVec + cw * 2 * BN;
  uint8_t* ctile = L.sC + cw * (C::kCTile / 2);
  const uint8_t* sA = L.sA + cw * 64 * kBK;  // this warpgroup's 64 rows of every A stage
  const uint8_t* sB = L.sB;
  const int lr0 = warp * 16 + lane / 4;  // this thread's first local row inside the warpgroup's 64 rows
  const int total = (num_tiles - first_tile + tile_step - 1) / tile_step * num_kb;
  RingPos iss{0, 0};
  int rel = 0;
  float a0[1][BN / 2], a1[1][BN / 2];
  float fin[BN / 2];
  EpiPrefetch<BN> pf;
  int t = first_tile, tile_row0 = 0, col_base = 0;
  int kb_left = num_kb;  // k-blocks of tile t not yet promoted
  // Tile t's coordinates and epilogue operands (loaded now, used after its k-blocks); fin = 0.
  auto begin_tile = [&]() {
    int mb, nb;
    tile_coords(t, num_m, ep, mb, nb);
    tile_row0 = mb * kBM + cw * 64;
    col_base = nb * BN;
    epi_prefetch<BN, false>(pf, ep, tile_row0 + lr0, col_base, tid);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
    kb_left = num_kb;
  };
  auto end_tile = [&]() {
    // Opaque copies of the staging pointers: the epilogue's shared-memory addresses are then computed
    // per tile, not hoisted out of the loop for each of its copies (which spilled, 216 bytes).
    // The same for the thread's indices (read again from %tid.x): fewer values live across the loop.
    float* vec_t = vec;
    uint8_t* ctile_t = ctile;
    asm volatile("" : "+l"(vec_t), "+l"(ctile_t));
    uint32_t tx;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tx));
    const int tid_t = static_cast<int>(tx) % kWgThreads, lane_t = tid_t % 32;
    const int lr0_t = (tid_t / 32) * 16 + lane_t / 4;
    finish_tile<BN, false, false>(fin, ep, pf, vec_t, ctile_t, tma_out, tile_row0 + lr0_t, col_base, lr0_t, lane_t, tid_t,
                           static_cast<int>(tx) / kWgThreads /* = 1 + cw: this warpgroup's named barrier */,
                           tile_row0);
  };
  auto next_tile = [&]() {  // tile t's epilogue, then the start of the next tile
    end_tile();
    t += tile_step;
    begin_tile();
  };
  auto issue_a0 = [&]() { issue_next_kblock<BN, FA, FB, S, C::kStageA, C::kStageB>(a0, sA, sB, L.full, iss); };
  auto issue_a1 = [&]() { issue_next_kblock<BN, FA, FB, S, C::kStageA, C::kStageB>(a1, sA, sB, L.full, iss); };

  // The stream's last k-block is retired and promoted, and the last epilogue run, inside the half that
  // owns it: a shared tail after the loop would let the compiler merge the two promotions through a
  // register copy between the accumulators, and ptxas then serializes every wgmma (C7514).
  // At a tile boundary the half also issues the next tile's SECOND k-block (it exists: num_kb >= 2)
  // before the epilogue, so two k-blocks run under it, and then continues in the other half right
  // after that half's issue (goto), where the same two k-blocks are in flight in the same order.
  begin_tile();
  issue_a0();  // g = 0
  for (int g = 1;; ++g) {
    // a0: k-block g - 1 in flight.
    if (g == total) {  // k-block g - 1 is the stream's last
      wgmma_wait<0>();
      retire_oldest<S>(L.empty, rel, lane);
      promote<BN, 1>(fin, a0);
      end_tile();
      break;
    }
    issue_a1();  // k-block g
  wait_a0:       // a0: k-block g - 1, a1: k-block g, both in flight
    wgmma_wait<1>();
    retire_oldest<S>(L.empty, rel, lane);
    promote<BN, 1>(fin, a0);  // k-block g - 1
    if (--kb_left == 0) {     // g - 1 was tile t's last: k-blocks g, g + 1 (the next tile's 0, 1) run
      issue_a0();             // under its epilogue
      next_tile();
      ++g;
      goto wait_a1;
    }
    ++g;
    // a1: k-block g - 1 in flight.
    if (g == total) {
      wgmma_wait<0>();
      retire_oldest<S>(L.empty, rel, lane);
      promote<BN, 1>(fin, a1);
      end_tile();
      break;
    }
    issue_a0();  // k-block g
  wait_a1:       // a1: k-block g - 1, a0: k-block g, both in flight
    wgmma_wait<1>();
    retire_oldest<S>(L.empty, rel, lane);
    promote<BN, 1>(fin, a1);  // k-block g - 1
    if (--kb_left == 0) {
      issue_a1();
      next_tile();
      ++g;
      goto wait_a0;
    }
  }
  if (tid == 0) bulk_wait0();  // the last TMA store has completed before the CTA exits
}

template <int BN, int FA, int FB>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_sm90_overlap_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                 const __grid_constant__ CUtensorMap tma_out, int rows_a, int rows_b, int K,
                                 const __grid_constant__ EpiParams ep) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using C = TileCfg<BN, false>;
  constexpr int S = C::kStages;
  uint8_t* smem = g_smem;
  const SmemLayout<BN, false> L(smem);
  const int num_m = (rows_a + kBM - 1) / kBM;
  const int num_n = (rows_b + BN - 1) / BN;
  const int num_kb = (K + kBK - 1) / kBK;
  const int num_tiles = num_m * num_n;
  const int wg = threadIdx.x / kWgThreads;

  if (threadIdx.x == 0) init_stage_barriers<S, 1>(&tma_a, &tma_b, L.full, L.empty);
  __syncthreads();  // the stage barriers are initialised before anyone waits on or arrives at them
  if (wg == 0) {
    // Producer: fills the stages in the order the consumers' streams take them (tile by tile).
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      producer_loop<BN, 1, S, C::kStageA, C::kStageB, C::kStage>(&tma_a, &tma_b, L.sA, L.sB, L.full, L.empty,
                                                                 blockIdx.x, num_tiles, gridDim.x, num_m, num_kb, 0,
                                                                 ep);
    }
  } else {
    setmaxnreg_inc<232>();
    consumer_stream<BN, FA, FB>(L, ep, &tma_out, wg - 1, blockIdx.x, num_tiles, gridDim.x, num_m, num_n, num_kb);
  }
#endif
}

struct LaunchArgs {
  CUtensorMap tma_a, tma_b, tma_out;
  int rows_a, rows_b, K;
  EpiParams ep;
  int config;
  int num_sms;
  int even_waves;  // 1: the fewest CTAs for the same number of waves (sm90_host.cu, even_waves)
};

// The kernel of a config: OVL selects the cross-tile pipelined consumers (config 9), which exist only for
// the non-swapped, single-CTA, two-accumulator case.
template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL, bool OVL, bool CARRY, bool SPLIT>
constexpr auto kernel_of() {
  if constexpr (OVL) {
    static_assert(!SWAP && NACC == 1 && CL == 1 && DBL && !CARRY, "OVL is config 7's layout with the pipeline across tiles");
    return &fp8_gemm_sm90_overlap_kernel<BN, FA, FB>;
  } else {
    return &fp8_gemm_sm90_kernel<BN, SWAP, NACC, CL, FA, FB, DBL, CARRY, SPLIT>;
  }
}

template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL = false, bool OVL = false,
          bool CARRY = false, bool SPLIT = false>
const char* launch_one(const LaunchArgs& la, cudaStream_t stream) {
  using C = TileCfg<BN, SWAP>;
  if constexpr (OVL) {
    // consumer_stream issues a tile's second k-block early: a one-k-block tile (K <= 128) runs config 7's
    // kernel instead (nothing to overlap there anyway).
    if (la.K <= kBK) return launch_one<BN, SWAP, NACC, CL, FA, FB, DBL, false>(la, stream);
  }
  if constexpr (CARRY) {
    // consumer_carry keeps each tile's first k-block in the first accumulator: an even number of
    // k-blocks per tile only; otherwise the base config's kernel (the same numbers, bit for bit).
    if (((la.K + kBK - 1) / kBK) % 2 != 0) return launch_one<BN, SWAP, NACC, CL, FA, FB, DBL, false, false>(la, stream);
  }
  auto kernel = kernel_of<BN, SWAP, NACC, CL, FA, FB, DBL, OVL, CARRY, SPLIT>();
  // Once per instance and device (not on every launch: later calls, CUDA graph capture included, see
  // only the launch).
  static std::atomic<uint64_t> done_mask{0};
  static std::atomic<int> max_clusters[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = CL > 1 ? 1 : 0;  // plain launch for single-CTA configs
  if (!(done_mask.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    // Persistent grid: one CTA per SM. For clusters the occupancy query is only reported (verbose):
    // a grid larger than what is co-resident is still correct (tiles are walked in a loop).
    const int n = la.num_sms / CL;
    int active = -1;
    if (CL > 1) {
      cfg.gridDim = dim3(la.num_sms / CL * CL, 1, 1);
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) != cudaSuccess) {
        active = -1;
        cudaGetLastError();
      }
    }
    max_clusters[dev & 63].store(n, std::memory_order_relaxed);
    if (const char* v = getenv("FP8_LINEAR_SM90_VERBOSE"); v != nullptr && v[0] == '1') {
      fprintf(stderr,
              "fp8_linear sm90: BN=%d swap=%d nacc=%d cluster=%d dbl=%d ovl=%d carry=%d stages=%d smem=%d: grid up "
              "to %d clusters (occupancy query: %d)\n",
              BN, int(SWAP), NACC, CL, int(DBL), int(OVL), int(CARRY), C::kStages, C::kSmem, n, active);
    }
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int num_m = (la.rows_a + kBM - 1) / kBM;
  const int tiles = ((num_m + CL - 1) / CL) * ((la.rows_b + BN - 1) / BN) * (SPLIT ? la.ep.splits : 1);
  const int maxc = max_clusters[dev & 63].load(std::memory_order_relaxed);
  int clusters = tiles < maxc ? tiles : maxc;
  if (la.even_waves && clusters > 0) {
    const int waves = (tiles + clusters - 1) / clusters;
    clusters = (tiles + waves - 1) / waves;
  }
  cfg.gridDim = dim3(clusters * CL, 1, 1);
  e = cudaLaunchKernelEx(&cfg, kernel, la.tma_a, la.tma_b, la.tma_out, la.rows_a, la.rows_b, la.K, la.ep);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Config table: see sm90_api.h / kernels/configs.py.
template <int FA, int FB>
const char* launch_fmt(const LaunchArgs& la, cudaStream_t stream) {
  // split K (ep.splits > 1; the host allows it only for config_splits_k): the SPLIT kernel instances
  const bool split = la.ep.splits > 1;
  switch (la.config) {
    case 0: return launch_one<128, false, 1, 1, FA, FB>(la, stream);
    case 1: return split ? launch_one<16, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<16, true, 4, 1, FA, FB>(la, stream);
    case 2: return split ? launch_one<32, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<32, true, 4, 1, FA, FB>(la, stream);
    case 3: return split ? launch_one<64, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<64, true, 4, 1, FA, FB>(la, stream);
    case 4: return launch_one<128, false, 2, 1, FA, FB>(la, stream);
    case 5: return launch_one<128, false, 1, 2, FA, FB>(la, stream);
    case 6: return launch_one<192, false, 1, 1, FA, FB>(la, stream);
    case 7: return split ? launch_one<128, false, 1, 1, FA, FB, true, false, false, true>(la, stream)
                         : launch_one<128, false, 1, 1, FA, FB, true>(la, stream);
    case 8: return launch_one<128, false, 1, 2, FA, FB, true>(la, stream);
    case 9: return launch_one<128, false, 1, 1, FA, FB, true, true>(la, stream);
    case 10: return split ? launch_one<144, false, 1, 1, FA, FB, true, false, false, true>(la, stream)
                          : launch_one<144, false, 1, 1, FA, FB, true>(la, stream);
    case 11: return launch_one<144, false, 1, 2, FA, FB, true>(la, stream);
    case 12: return launch_one<128, false, 1, 1, FA, FB, true, false, true>(la, stream);
    case 13: return launch_one<144, false, 1, 1, FA, FB, true, false, true>(la, stream);
    default: return "unknown kernel config";
  }
}

// Tile width and operand order of each config (host side).
// Configs with split-K kernel instances (kernels/configs.py: KernelConfig.split_k).
inline bool config_splits_k(int config) {
  static const bool kSplitK[kNumConfigs] = {false, true, true, true, false, false, false,
                                            true, false, false, true, false, false, false};
  return kSplitK[config];
}

inline void config_shape(int config, int& bn, bool& swap, int& cluster) {
  static const int kBN[kNumConfigs] = {128, 16, 32, 64, 128, 128, 192, 128, 128, 128, 144, 144, 128, 144};
  static const bool kSwap[kNumConfigs] = {false, true, true, true, false, false, false,
                                          false, false, false, false, false, false, false};
  static const int kCluster[kNumConfigs] = {1, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1, 1};
  bn = kBN[config];
  swap = kSwap[config];
  cluster = kCluster[config];
}

}  // namespace fp8sm90
