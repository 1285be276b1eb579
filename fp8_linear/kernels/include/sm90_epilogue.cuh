// The sm90 GEMM's epilogue, per consumer warpgroup and tile: the scale / bias operands prefetched at
// the tile start (EpiPrefetch), the column vectors in shared memory, acc x (row scale x column scale)
// + bias in one of four modes (EpiMode), the cast, and the store (16-bit: stmatrix into a 128B-swizzled
// staging tile, then TMA; fp32: 64-column TMA passes; otherwise direct clipped stores).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"

namespace fp8sm90 {

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
template <int BN, bool BF16, EpiMode MODE>
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
  // (ncu, docs/kernel-log.md: the per-channel launch's FFMAs waiting on short_sb at 6144^2 x 1280). The
  // packed tile takes half the accumulator's registers. kUniform loads nothing and keeps the
  // interleaved order (its code is unchanged).
  constexpr bool kPackFirst = MODE != EpiMode::kUniform;
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

template <int BN, bool BF16>
__device__ __forceinline__ void stage_16bit_mode(EpiMode mode, const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf,
                                                 const float* vs, const float* vb, uint8_t* ctile, uint8_t* strip,
                                                 int lane, int warp) {
  switch (mode) {
    case EpiMode::kUniform: stage_tile_16bit<BN, BF16, EpiMode::kUniform>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    case EpiMode::kFolded: stage_tile_16bit<BN, BF16, EpiMode::kFolded>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    case EpiMode::kColScale: stage_tile_16bit<BN, BF16, EpiMode::kColScale>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
    default: stage_tile_16bit<BN, BF16, EpiMode::kGeneral>(acc, pf, vs, vb, ctile, strip, lane, warp); break;
  }
}

// Swapped 16-bit output tile of one warpgroup (swap_tma_store configs): the warpgroup's 64 kernel rows
// are output columns n, its BN kernel columns output rows m. Value pair (acc[4j + 2i], acc[4j + 2i + 1])
// is kernel row r = 16 * warp + lane / 4 + 8i (n), kernel columns c, c + 1 = 8j + 2 (lane % 4) (+1) (m):
// acc * (row scale [= scale_b[n]] x column scale [= scale_a[m]]) + row bias [= bias[n]], the direct
// path's formula bit for bit. The fragment of 8 x 8 matrix (j, i) goes through stmatrix .trans to rows
// m = 8j + (0..7), 16-byte chunk n / 8 = 2 * warp + i of the staging tile [BN rows m][64 columns n]
// (128 bytes per row, chunk index XOR row % 8: the 128-byte swizzle of the output tensor map, whose box
// is 64 columns x BN rows for the swapped configs).
// COLVEC: per-token scale_a, read from the shared column vector vs; otherwise the per-tensor
// scale_a (pf.col_scale[0]) folds into one factor per thread row and the epilogue loads nothing.
template <int BN, bool BF16, bool COLVEC>
__device__ __forceinline__ void stage_tile_16bit_swap(const float (&acc)[BN / 2], const EpiPrefetch<BN>& pf,
                                                      const float* vs, uint8_t* ctile, int lane, int warp) {
  static_assert(BN % 16 == 0, "the epilogue takes the columns in pairs of 8-column fragments");
  const int lc = 2 * (lane % 4);
  const int q_l = lane / 8;  // the matrix this lane addresses in each stmatrix.x4
  const float k[2] = {pf.row_scale[0] * pf.col_scale[0], pf.row_scale[1] * pf.col_scale[0]};
  uint32_t packed[BN / 16][4];
#pragma unroll
  for (int p = 0; p < BN / 16; ++p) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = 2 * p + q / 2, i = q % 2;
      float v0, v1;
      if constexpr (COLVEC) {
        const float2 sc = *reinterpret_cast<const float2*>(vs + 8 * j + lc);
        v0 = acc[4 * j + 2 * i] * (pf.row_scale[i] * sc.x) + pf.row_bias[i];
        v1 = acc[4 * j + 2 * i + 1] * (pf.row_scale[i] * sc.y) + pf.row_bias[i];
      } else {
        v0 = acc[4 * j + 2 * i] * k[i] + pf.row_bias[i];
        v1 = acc[4 * j + 2 * i + 1] * k[i] + pf.row_bias[i];
      }
      packed[p][q] = pack_16bit<BF16>(v0, v1);
    }
  }
#pragma unroll
  for (int p = 0; p < BN / 16; ++p) {
    const int m_l = 8 * (2 * p + q_l / 2) + lane % 8;  // staging row (m) of this lane's address
    uint8_t* dst = ctile + m_l * 128 + (((2 * warp + q_l % 2) ^ (lane % 8)) << 4);
    stmatrix_x4_trans(dst, packed[p][0], packed[p][1], packed[p][2], packed[p][3]);
  }
}

// Accumulator fragment of wgmma m64nBN (per thread): value acc[4j + 2i + e] sits at
// row = 16*warp + lane/4 + 8*i, col = 8*j + 2*(lane%4) + e  (of the warpgroup's 64 x BN block).
// vec: this warpgroup's shared column vectors, [0, BN) scale, [BN, 2BN) bias.
// ctile: this warpgroup's 64 x BN output staging buffer (TMA store path).
template <int BN, bool SWAP>
__device__ __forceinline__ void epilogue(const float (&acc)[BN / 2], const EpiParams& ep, const EpiPrefetch<BN>& pf,
                                         const float* vec, uint8_t* ctile, const CUtensorMap* tma_out,
                                         int row0, int col_base, int lr0, int lane, int tid, int bar_id,
                                         int tile_row0) {
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
        if (ep.out_kind == 1) stage_16bit_mode<BN, true>(mode, acc, pf, vs, vb, ctile, strip, lane, w);
        else stage_16bit_mode<BN, false>(mode, acc, pf, vs, vb, ctile, strip, lane, w);
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
        const long idx = static_cast<long>(r) * ep.N + c;
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
    if constexpr (swap_tma_store<BN, SWAP>()) {
      if (ep.tma_store) {  // 16-bit output (the host's rule): transposed staging, then one BN-row TMA box
        const int w = tid / 32;
        const bool colvec = ep.sa_row != 0;
        if (ep.out_kind == 1) {
          if (colvec) stage_tile_16bit_swap<BN, true, true>(acc, pf, vec, ctile, lane, w);
          else stage_tile_16bit_swap<BN, true, false>(acc, pf, vec, ctile, lane, w);
        } else {
          if (colvec) stage_tile_16bit_swap<BN, false, true>(acc, pf, vec, ctile, lane, w);
          else stage_tile_16bit_swap<BN, false, false>(acc, pf, vec, ctile, lane, w);
        }
        fence_proxy_async();  // generic-proxy smem writes -> visible to the TMA engine
        named_bar_sync(bar_id, 128);
        if (tid == 0 && tile_row0 < ep.N) {  // tile_row0: the warpgroup's first output column n
          tma_store_2d(tma_out, ctile, tile_row0, col_base);
          bulk_commit();
        }
        return;
      }
    }
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
          const long idx = static_cast<long>(m) * ep.N + n;
          store_one(ep.out, ep.out_kind, idx, acc[4 * j + 2 * i + e] * (pf.row_scale[i] * sm) + pf.row_bias[i]);
        }
      }
    }
  }
}

// End of a tile for one consumer warpgroup: once its previous TMA store has finished reading ctile
// (bulk_wait_read0) and every thread passed barrier bar_id (the warpgroup's own named barrier, 128
// threads: nobody still reads vec / ctile of the previous tile), publish this tile's column
// scales/bias to vec, barrier again (vec complete), then the epilogue.
template <int BN, bool SWAP>
__device__ __forceinline__ void finish_tile(const float (&fin)[BN / 2], const EpiParams& ep, const EpiPrefetch<BN>& pf,
                                            float* vec, uint8_t* ctile, const CUtensorMap* tma_out, int row0,
                                            int col_base, int lr0, int lane, int tid, int bar_id, int tile_row0) {
  if ((!SWAP || swap_tma_store<BN, SWAP>()) && tid == 0) bulk_wait_read0();
  named_bar_sync(bar_id, 128);
  const EpiMode mode = SWAP ? EpiMode::kGeneral : epi_mode(ep);
  epi_publish_cols<BN>(vec, pf, tid, mode == EpiMode::kFolded,
                       mode == EpiMode::kFolded || mode == EpiMode::kColScale);
  named_bar_sync(bar_id, 128);
  epilogue<BN, SWAP>(fin, ep, pf, vec, ctile, tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0);
}

// ---------------------------------------------------------------- split K in one launch
// Each output tile of a SPLIT launch is ep.splits work items over consecutive K ranges (split_tile). Per
// consumer warpgroup (its 64 x BN half of the tile is the unit; the two warpgroups of a 128-row tile
// never wait for each other), the fix-up ("serial split K", as CUTLASS's stream-K fix-up):
//  1. every split stores its raw fp32 accumulator (fin, before any scale) into its own workspace slot in
//     the fragment's register order: float4 j of thread tid at (j * 128 + tid) * 4 floats of the slot, so
//     a warp's stores are 512 contiguous bytes (st.global.cg: L2 only); fragments that lie wholly
//     outside the output (rows past the kernel's rows, columns past its columns) are neither stored nor read;
//  2. arrival: the warpgroup's named barrier, then thread 0 alone adds one to the warpgroup's arrival
//     counter (ep.split_flags[tile * consumers + cw]) with atom.add.acq_rel.gpu, which returns the old
//     count (split_arrive; CUTLASS's GenericBarrier: barrier, then one thread's fence.acq_rel.gpu + red);
//  3. the warpgroup that brings the count to splits (old == splits - 1) is the tile's last: thread 0
//     resets the counter to 0 (st.relaxed.gpu; zero at rest: the next launch and CUDA-graph replays find
//     it so) and tells the warpgroup through shared memory and a second barrier (bar.red.or instead made
//     the 144-wide block-scaled kernel spill, nvcc 13.0); every thread then reads the splits' slots
//     (ld.global.cg, its own included; all of a round's loads before any add) and sums them in the
//     fixed order 0, 1, ..., splits - 1, so the bits do not depend on which split arrives last; it then
//     runs the tile's normal epilogue (scales, bias, cast, TMA or direct stores). The other warpgroups
//     skip it.
// Why one thread's acq_rel is enough (PTX ISA, memory consistency model): a split's stores precede its
// bar.sync in program order, the barrier orders them before thread 0's atom (base causality order
// includes the CTA barrier's synchronization), and the atom's release half makes them visible before its
// add; the RMWs on one counter are morally strong (same location, .gpu scope, all atomic), so the last
// split's acq_rel atom reads from every earlier split's release sequence and synchronizes with each;
// its second bar.sync then orders the other threads' loads after that acquire. Causality order is
// transitive, so every load sees every split's store. v33 fenced every thread twice with
// __threadfence (fence.sc.gpu: MEMBAR.SC.GPU + ERRBAR + CCTL.IVALL in the SASS, on all 128 threads,
// before the arrival and again before the loads): an SC fence orders against every other SC fence of
// the GPU, more than the release / acquire pair that this protocol needs.
// PDL: the consumers pass griddepcontrol.wait before any of this, and a dependent kernel's wait returns
// only once this grid has finished (stores flushed), so neither the workspace nor the counters of the
// next launch overlap this one. The counters: one device array of kSplitFlags ints (sm90_host.cu,
// zero from the module's load; each launch leaves it zero), so there is nothing to allocate or clear
// per launch and CUDA graphs capture no memset; split launches on one device must therefore not run
// concurrently on two streams.
constexpr int kSplitFlags = 1 << 16;  // arrival counters: output tiles x consumer warpgroups of one launch

// Floats of a split launch's workspace: one slot of 64 x BN per work item (tiles x splits) and
// consumer warpgroup, i.e. tiles x splits x BM x BN (the host's split_workspace_floats).
template <int BN>
__device__ __forceinline__ float* split_slot(const EpiParams& ep, int item, int consumers, int cw) {
  return ep.split_ws + (static_cast<long>(item) * consumers + cw) * (64 * BN);
}

// The arrival of one split at its warpgroup's counter: the old count (atom.add.acq_rel.gpu: release of
// what the warpgroup stored before the barrier that precedes this, acquire of what the earlier splits
// released; see above). One thread of the warpgroup calls it.
__device__ __forceinline__ int split_arrive(int* flag) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(flag) : "memory");
  return old;
}

// The counter back to zero after the tile's last arrival (nobody else touches it in this launch; the next
// launch reads it only after this grid has finished).
__device__ __forceinline__ void split_reset(int* flag) {
  asm volatile("st.relaxed.gpu.global.s32 [%0], 0;" ::"l"(flag) : "memory");
}

// The fix-up of one consumer warpgroup's half of work item t (see above); CONSUMERS warpgroups a tile.
// fin: this split's raw accumulator, replaced by the sum over all splits in the warpgroup of the tile's
// last split. row_ok: this thread's fragment rows start inside the kernel's rows; col0: the kernel column
// of its first fragment column (col_base + 2 (lane % 4)); cols: the kernel's columns. `note`: a shared
// int of the warpgroup (the first word of its column vectors: every thread has read the previous tile's
// before the first barrier here, and the epilogue rewrites it only after its own). Returns whether this
// warpgroup is the tile's last (then it runs the epilogue).
template <int BN, int CONSUMERS>
__device__ __forceinline__ bool split_fixup(float (&fin)[BN / 2], const EpiParams& ep, int t, int cw, int tid,
                                            int bar_id, bool row_ok, int col0, int cols, volatile int* note) {
  constexpr int kVecs = BN / 8;  // float4 j of the fragment: acc[4j .. 4j + 3] = rows r, r + 8 x columns c, c + 1
  const int splits = ep.splits;
  const int tile = fast_div(t, ep.div_splits);
  const int first = tile * splits;  // the item of the tile's split 0
  // the fragments j < nvec lie (partly) inside the output: the only ones stored and read
  const int nvec = row_ok ? min(kVecs, (cols - col0 + 7) / 8) : 0;
  {
    float4* dst = reinterpret_cast<float4*>(split_slot<BN>(ep, t, CONSUMERS, cw)) + tid;
    asm volatile("" : "+l"(dst));  // one base register, the fragments at immediate offsets
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (j < nvec) __stcg(dst + j * kWgThreads, make_float4(fin[4 * j], fin[4 * j + 1], fin[4 * j + 2], fin[4 * j + 3]));
    }
  }
  named_bar_sync(bar_id, kWgThreads);  // every thread's stores before thread 0's release
  if (tid == 0) {
    int* flag = ep.split_flags + tile * CONSUMERS + cw;
    const bool last = split_arrive(flag) == splits - 1;
    if (last) split_reset(flag);  // every split of this tile has arrived: zero at rest again
    *note = last;
  }
  named_bar_sync(bar_id, kWgThreads);  // thread 0's acquire before every thread's loads
  if (!*note) return false;
  // fin = p_0 + p_1 + ... + p_{splits-1} in this order, this split's own slot read back too (it is in L2;
  // summing in place keeps one accumulator's registers: with a second one the 128- and 144-wide split
  // kernels spilled); -0 is the exact identity of the fp32 add. kDepth splits' loads in flight at once,
  // so the sum waits for ceil(splits / kDepth) L2 round trips, not splits: 128 registers of them on the
  // swapped configs (BN 16 / 32 / 64: 16 / 8 / 4 splits, one round for every factor the choice makes
  // there), 64 on the 128-wide tile (2), one split's on the 144-wide one (set while its block-scaled
  // instances, since removed, spilled; a deeper round there is unmeasured). fp8_linear/kernels/configs.py
  // FIXUP_ROUND_WIDTH keeps the swapped configs' factors within it.
  constexpr int kDepth = BN > 128 ? 1 : 256 / BN;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) fin[i] = -0.f;
#pragma unroll 1
  for (int s0 = 0; s0 < splits; s0 += kDepth) {
    float4 v[kDepth][kVecs];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const float4* src = reinterpret_cast<const float4*>(split_slot<BN>(ep, first + s0 + d, CONSUMERS, cw)) + tid;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        v[d][j] = make_float4(0.f, 0.f, 0.f, 0.f);  // (no value carried over from the previous round)
        if (j < nvec && s0 + d < splits) v[d][j] = __ldcg(src + j * kWgThreads);
      }
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if (s0 + d < splits) {  // (fragments j >= nvec add zeros: never stored)
          fin[4 * j] += v[d][j].x;
          fin[4 * j + 1] += v[d][j].y;
          fin[4 * j + 2] += v[d][j].z;
          fin[4 * j + 3] += v[d][j].w;
        }
      }
    }
  }
  return true;
}

}  // namespace fp8sm90
