// Fine-grained scales (the BLK kernel instances): the activation in 1 x 128 groups, scale_a [M, ceil(K/128)],
// and the weight in 128 x 128 blocks, scale_b [ceil(N/128), ceil(K/128)], both fp32. They are applied on the
// CUDA cores when a k-block's tensor-core partial sum is promoted (DeepGEMM's scheme):
//   fin += partial(kb) * (scale_a[m, kb] * scale_b[n / 128, kb])
// so the epilogue sees per-tensor scales of 1 (the host points EpiParams::sa / sb at a 1.0f) and adds
// only the bias.
//
// The activation factors travel with the operands: scale_a is M-major (element [m, kb] at kb * ld + m,
// ld % 4 == 0), so one k-block's factors of a tile are one contiguous box, which the producer thread
// loads by TMA (EpiParams::tma_sa) into the stage's slot (SmemLayout::scales) together with the stage's
// A and B tiles, completing on the same full barrier (DeepGEMM's layout and order). Rows past M read
// as zero: their partial sums are zero too (TMA zero-fills the operand) and their outputs are never
// stored. The weight factors (one or two per k-block and tile, the same for a whole warp) are read from
// global memory (L1-resident rows of scale_b) when the stage is full, one k-block before they are used.
// (Before: a loader warp copied row-major scale_a with 4-byte cp.async per row, 33 arrivals per stage:
// 20% slower than per-tensor at 4096^3, docs/kernel-log.md "Block scales".)
//
// Slot layout: 128 activation scales.
//  - not swapped (kernel rows = activation rows m, tile columns = weight rows n): scale_a of the tile's
//    128 rows; the weight block of the tile's first column, and the next one: a tile wider than 128
//    or not starting on a block (BN = 192) crosses into it at column `cut` (a multiple of 16), so each
//    8-column fragment takes one of the two.
//  - swapped (kernel rows = weight rows n: one weight block per 128-row tile; tile columns = m): scale_a
//    of the tile's BN columns, and the weight block's scale.
#pragma once
#include <cstdint>

#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"

namespace fp8sm90 {

// The weight-block height of scale_b and the activation-group width of scale_a (both 128 = kBK: one
// factor pair per k-block).
constexpr int kScaleBlock = 128;
static_assert(kScaleBlock == kBK, "one scale per k-block");
// Bytes of one k-block's activation factors that the producer's TMA brings into a slot: the tile's
// activation rows (128, or BN when swapped).
template <int BN, bool SWAP>
constexpr uint32_t scale_box_bytes() {
  return (SWAP ? BN : kBM) * 4;
}

// One k-block's factors of one consumer thread.
template <int BN, bool SWAP>
struct BlkFactors {
  static constexpr int kA = SWAP ? BN / 4 : 2;  // activation scales: two rows, or BN / 4 columns
  float a[kA];
  float w0, w1;  // the weight block's scale (w1: the next block's, for tiles that cross one)
};

// Where one consumer thread's factors sit: its activation scales in a stage's slot, its tile's weight
// block rows of scale_b in global memory.
template <int BN, bool SWAP>
struct BlkTile {
  static constexpr bool kTwoBlocks = !SWAP && BN % kScaleBlock != 0;
  const float* slots;  // the S slots (SmemLayout::scales)
  const float* w0;     // scale_b row of the tile's (first) weight block, from the tile's first k-block
  const float* w1;     // the next block's row (kTwoBlocks; clamped to the last block)
  int pos;             // not swapped: the thread's first row in the 128-row tile; swapped: its first column
  int cut;             // tile column where the second weight block starts (kTwoBlocks)

  // mb / nb: the tile's row block of 128 rows / column block; kb0: its first k-block (split K).
  __device__ __forceinline__ BlkTile(const float* slot_base, const EpiParams& ep, int mb, int nb, int kb0,
                                     int tile_row_local, int lane)
      : slots(slot_base) {
    const int kbn = ep.blk_kb;
    if constexpr (!SWAP) {
      const int col_base = nb * BN;
      const int wb = col_base / kScaleBlock;
      pos = tile_row_local;
      cut = (wb + 1) * kScaleBlock - col_base;
      w0 = ep.blk_sb + wb * kbn + kb0;
      w1 = ep.blk_sb + min(wb + 1, (ep.N - 1) / kScaleBlock) * kbn + kb0;
    } else {
      pos = 2 * (lane % 4);
      cut = BN;
      w0 = w1 = ep.blk_sb + mb * kbn + kb0;
    }
  }

  // The factors of the tile's i-th k-block, in stage `stage` (its full barrier has completed).
  __device__ __forceinline__ void load(BlkFactors<BN, SWAP>& f, int stage, int i) const {
    const float* slot = slots + stage * kScaleSlotFloats;
    f.w0 = __ldg(w0 + i);
    f.w1 = kTwoBlocks ? __ldg(w1 + i) : f.w0;
    if constexpr (!SWAP) {
      f.a[0] = slot[pos];
      f.a[1] = slot[pos + 8];
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(slot + 8 * j + pos);
        f.a[2 * j] = v.x;
        f.a[2 * j + 1] = v.y;
      }
    }
  }
};

// The producer thread's loads of one BLK stage (with its A and B tiles, on the same full barrier): the
// k-block's activation factors of the tile (act0: its first activation row, mb * 128, or nb * BN
// when swapped).
template <int BN, bool SWAP>
__device__ __forceinline__ void load_scale_slot(float* slot, const EpiParams& ep, uint64_t* full, int kb, int act0) {
  tma_load_2d(slot, &ep.tma_sa, full, act0, kb);
}

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

// The non-swapped promotion with the second weight block's first fragment known at compile time
// (CUT: tile column where it starts, a multiple of 16): one multiply per accumulator value, no selects.
template <int BN, int NACC, int CUT>
__device__ __forceinline__ void promote_blk_cut(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2],
                                                const BlkFactors<BN, false>& f) {
  const float lo[2] = {f.a[0] * f.w0, f.a[1] * f.w0};
  const float hi[2] = {f.a[0] * f.w1, f.a[1] * f.w1};
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = 4 * j + 2 * i + e;
        // one FFMA, as promote_blk's contracted `fin += part * s` (explicit: with the mul and the add
        // apart, ptxas merged the eight cases' adds after the switch, an FMUL + FADD per value)
        fin[v] = __fmaf_rn(kblock_partial<BN, NACC>(acc, v), 8 * j < CUT ? lo[i] : hi[i], fin[v]);
      }
}

// Tiles wider than a weight block but narrower than two (BN = 144: the column where the second block
// starts is 128 - 16 * (nb % 8); BN = 192: 128 or 64): the promotion is dispatched on that column (one
// uniform branch per k-block) so that it holds two products per row and no per-fragment selected
// factors (with a run-time column, ptxas kept the selected factors in registers: the 128 x 144 tile's
// two accumulators spilled 76-88 bytes, the 128 x 192 tile 4-12, nvcc 13.0; DeepGEMM's sm90 1d2d kernel
// dispatches its whole k loop the same way).
template <int BN, bool SWAP>
constexpr bool blk_cut_dispatch() {
  return !SWAP && BN > kScaleBlock && BN < 2 * kScaleBlock && BN % 16 == 0;
}

// Block-scaled FP32 promotion: fin += (sum of the k-block's NACC partial accumulators) x factor.
template <int BN, bool SWAP, int NACC>
__device__ __forceinline__ void promote_blk(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2],
                                            const BlkFactors<BN, SWAP>& f, const BlkTile<BN, SWAP>& t) {
  if constexpr (blk_cut_dispatch<BN, SWAP>()) {
    static_assert(kScaleBlock == 8 * 16, "cut cases 16, 32, .., 128");
    switch (t.cut) {
      case 16: promote_blk_cut<BN, NACC, 16>(fin, acc, f); break;
      case 32: promote_blk_cut<BN, NACC, 32>(fin, acc, f); break;
      case 48: promote_blk_cut<BN, NACC, 48>(fin, acc, f); break;
      case 64: promote_blk_cut<BN, NACC, 64>(fin, acc, f); break;
      case 80: promote_blk_cut<BN, NACC, 80>(fin, acc, f); break;
      case 96: promote_blk_cut<BN, NACC, 96>(fin, acc, f); break;
      case 112: promote_blk_cut<BN, NACC, 112>(fin, acc, f); break;
      default: promote_blk_cut<BN, NACC, 128>(fin, acc, f); break;
    }
  } else if constexpr (!SWAP) {
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
