// Fine-grained scales (the BLK kernel instances): the activation in 1 x 128 groups, scale_a [M, ceil(K/128)],
// and the weight in 128 x 128 blocks, scale_b [ceil(N/128), ceil(K/128)], both fp32 row-major. They are
// applied on the CUDA cores when a k-block's tensor-core partial sum is promoted (DeepGEMM's scheme):
//   fin += partial(kb) * (scale_a[m, kb] * scale_b[n / 128, kb])
// so the epilogue sees per-tensor scales of 1 (the host points EpiParams::sa / sb at a 1.0f) and adds
// only the bias. Each consumer thread reads its factors straight from global memory (L1 / L2 hits: a
// tile needs 128 + 1 or 2 floats per k-block), one k-block ahead of the promotion that uses them.
//
// Which factors a thread needs (accumulator value acc[4j + 2i + e]: warpgroup row 16 warp + lane / 4 + 8i,
// tile column 8j + 2 (lane % 4) + e; sm90_epilogue.cuh):
//  - not swapped (kernel rows = activation rows m, tile columns = weight rows n): scale_a of its two
//    rows, and scale_b of the tile's weight block; a tile wider than 128 or not starting on a block
//    (BN = 144, 192) crosses into the next block at column `cut` (a multiple of 16), so it holds both
//    blocks' factors and takes one per 8-column fragment.
//  - swapped (kernel rows = weight rows n: one weight block per 128-row tile; tile columns = m): one
//    scale_b and the scale_a of its BN / 4 columns.
// Rows or columns past M read row M - 1's scales: their partial sums are zero (TMA zero-fills the
// operand) and their outputs are never stored.
#pragma once
#include <cstdint>

#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"

namespace fp8sm90 {

// The weight-block height of scale_b and the activation-group width of scale_a (both 128 = kBK: one
// factor pair per k-block).
constexpr int kScaleBlock = 128;
static_assert(kScaleBlock == kBK, "one scale per k-block");

// One k-block's factors of one consumer thread.
template <int BN, bool SWAP>
struct BlkFactors {
  static constexpr int kA = SWAP ? BN / 4 : 2;  // activation scales: two rows, or BN / 4 columns
  float a[kA];
  float w0, w1;  // the weight block's scale (w1: the next block's, for tiles that cross one)
};

// Where one consumer thread's factors are, for one tile (set at the tile start).
template <int BN, bool SWAP>
struct BlkTile {
  static constexpr bool kTwoBlocks = !SWAP && BN % kScaleBlock != 0;
  int a_off[SWAP ? 1 : 2];  // not swapped: offsets of the thread's two rows in scale_a
  int col0;                 // swapped: the thread's first tile column (m) = col_base + 2 (lane % 4)
  int w_off0, w_off1;       // offsets of the weight block(s) in scale_b
  int cut;                  // tile column where the second weight block starts (kTwoBlocks)
  int kb0;                  // the work item's first k-block (split K)

  __device__ __forceinline__ BlkTile(const EpiParams& ep, int row0, int tile_row0, int col_base, int lane, int kb_first) {
    const int kbn = ep.blk_kb;
    kb0 = kb_first;
    if constexpr (!SWAP) {
      a_off[0] = min(row0, ep.M - 1) * kbn;
      a_off[1] = min(row0 + 8, ep.M - 1) * kbn;
      col0 = 0;
      const int nb = col_base / kScaleBlock;
      w_off0 = nb * kbn;
      w_off1 = min(nb + 1, (ep.N - 1) / kScaleBlock) * kbn;
      cut = (nb + 1) * kScaleBlock - col_base;
    } else {
      a_off[0] = 0;
      col0 = col_base + 2 * (lane % 4);
      w_off0 = w_off1 = (tile_row0 / kScaleBlock) * kbn;
      cut = BN;
    }
  }

  // The factors of the work item's k-block `kb` (0-based inside the item).
  __device__ __forceinline__ void load(BlkFactors<BN, SWAP>& f, const EpiParams& ep, int kb) const {
    const int k = kb0 + kb;
    f.w0 = __ldg(ep.blk_sb + w_off0 + k);
    if constexpr (kTwoBlocks) f.w1 = __ldg(ep.blk_sb + w_off1 + k);
    else f.w1 = f.w0;
    if constexpr (!SWAP) {
      f.a[0] = __ldg(ep.blk_sa + a_off[0] + k);
      f.a[1] = __ldg(ep.blk_sa + a_off[1] + k);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = min(col0 + 8 * j + e, ep.M - 1);
          f.a[2 * j + e] = __ldg(ep.blk_sa + m * ep.blk_kb + k);
        }
    }
  }
};

// The k-block's partial sum of accumulator value v over its NACC accumulators (as promote).
template <int BN, int NACC>
__device__ __forceinline__ float kblock_partial(float (&acc)[NACC][BN / 2], int v) {
#pragma unroll
  for (int q = 0; q < NACC; ++q) fence_reg(acc[q][v]);
  float part = acc[0][v];
#pragma unroll
  for (int q = 1; q < NACC; ++q) part += acc[q][v];
  return part;
}

// Block-scaled FP32 promotion: fin += (sum of the k-block's NACC partial accumulators) x factor.
template <int BN, bool SWAP, int NACC>
__device__ __forceinline__ void promote_blk(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2],
                                            const BlkFactors<BN, SWAP>& f, const BlkTile<BN, SWAP>& t) {
  if constexpr (!SWAP) {
    const float lo[2] = {f.a[0] * f.w0, f.a[1] * f.w0};
    const float hi[2] = {f.a[0] * f.w1, f.a[1] * f.w1};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const bool first = !BlkTile<BN, SWAP>::kTwoBlocks || 8 * j < t.cut;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float s = first ? lo[i] : hi[i];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int v = 4 * j + 2 * i + e;
          fin[v] += kblock_partial<BN, NACC>(acc, v) * s;
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float s = f.w0 * f.a[2 * j + e];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int v = 4 * j + 2 * i + e;
          fin[v] += kblock_partial<BN, NACC>(acc, v) * s;
        }
      }
  }
}

}  // namespace fp8sm90
