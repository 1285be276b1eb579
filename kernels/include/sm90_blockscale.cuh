// Fine-grained scales (the BLK kernel instances): the activation in 1 x 128 groups, scale_a [M, ceil(K/128)],
// and the weight in 128 x 128 blocks, scale_b [ceil(N/128), ceil(K/128)], both fp32 row-major. They are
// applied on the CUDA cores when a k-block's tensor-core partial sum is promoted (DeepGEMM's scheme):
//   fin += partial(kb) * (scale_a[m, kb] * scale_b[n / 128, kb])
// so the epilogue sees per-tensor scales of 1 (the host points EpiParams::sa / sb at a 1.0f) and adds
// only the bias.
//
// The factors travel with the operands: every stage has a slot (SmemLayout::scales, kScaleSlotFloats)
// that one producer warp (scale_loader) fills with cp.async while the producer thread's TMA fills the
// stage's tiles; the stage's full barrier completes when both have landed (its 32 lanes are 32 of the
// barrier's expected arrivals). The consumers read their factors from the slot before they release the
// stage. (Read straight from global memory one k-block ahead instead, the factors' latency under the
// operands' traffic cost 15-60%: docs/kernel-log.md "Block scales".)
//
// Slot layout: [0, 128) activation scales, [128] the weight block's scale, [129] the next block's.
//  - not swapped (kernel rows = activation rows m, tile columns = weight rows n): scale_a of the tile's
//    128 rows; the weight block of the tile's first column, and the next one: a tile wider than 128
//    or not starting on a block (BN = 192) crosses into it at column `cut` (a multiple of 16), so each
//    8-column fragment takes one of the two.
//  - swapped (kernel rows = weight rows n: one weight block per 128-row tile; tile columns = m): scale_a
//    of the tile's BN columns, and the weight block's scale.
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
constexpr int kSlotW0 = kBM, kSlotW1 = kBM + 1;  // the weight scales' places in a slot
// Arrivals on a BLK stage's full barrier: the producer thread's arrive.expect_tx and the loader warp's lanes.
constexpr int kLoaderLanes = 32;
constexpr int kBlkFullArrivals = 1 + kLoaderLanes;

// One k-block's factors of one consumer thread.
template <int BN, bool SWAP>
struct BlkFactors {
  static constexpr int kA = SWAP ? BN / 4 : 2;  // activation scales: two rows, or BN / 4 columns
  float a[kA];
  float w0, w1;  // the weight block's scale (w1: the next block's, for tiles that cross one)
};

// Where one consumer thread's factors sit in a stage's slot, for one tile.
template <int BN, bool SWAP>
struct BlkTile {
  static constexpr bool kTwoBlocks = !SWAP && BN % kScaleBlock != 0;
  const float* slots;  // the S slots (SmemLayout::scales)
  int pos;             // not swapped: the thread's first row in the 128-row tile; swapped: its first column
  int cut;             // tile column where the second weight block starts (kTwoBlocks)

  __device__ __forceinline__ BlkTile(const float* slot_base, int tile_row_local, int col_base, int lane)
      : slots(slot_base) {
    if constexpr (!SWAP) {
      pos = tile_row_local;
      cut = (col_base / kScaleBlock + 1) * kScaleBlock - col_base;
    } else {
      pos = 2 * (lane % 4);
      cut = BN;
    }
  }

  // The factors of the k-block in stage `stage` (its full barrier has completed).
  __device__ __forceinline__ void load(BlkFactors<BN, SWAP>& f, int stage) const {
    const float* slot = slots + stage * kScaleSlotFloats;
    f.w0 = slot[kSlotW0];
    f.w1 = kTwoBlocks ? slot[kSlotW1] : f.w0;
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

// The loader warp (producer warpgroup, warp 1): for every work item and k-block of this CTA, in the
// producer thread's order, wait until the stage is empty, then cp.async the k-block's factors into the
// stage's slot and arrive (no-increment) on its full barrier when they have landed.
template <int BN, bool SWAP, int S, bool SPLIT>
__device__ __forceinline__ void scale_loader(float* slots, uint64_t* full, uint64_t* empty, int first_tile,
                                             int num_tiles, int tile_step, int num_m, int num_kb, const EpiParams& ep,
                                             int lane) {
  constexpr int kRows = SWAP ? BN : kBM;  // activation scales per slot
  constexpr int kPer = (kRows + kLoaderLanes - 1) / kLoaderLanes;
  const int kbn = ep.blk_kb;
  int stage = 0;
  uint32_t phase = 0;
  for (int t = first_tile; t < num_tiles; t += tile_step) {
    int tile, split, kb0, nkb, mb, nb;
    split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
    tile_coords(tile, num_m, ep, mb, nb);
    // this lane's sources: activation rows (or columns) lane + 32 i, and lane 0 / 1: the weight blocks
    const int act0 = SWAP ? nb * BN : mb * kBM;
    int a_off[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) a_off[i] = min(act0 + lane + kLoaderLanes * i, ep.M - 1) * kbn;
    const int wb = SWAP ? mb : nb * BN / kScaleBlock;
    const int w_off = (lane == 0 ? wb : min(wb + 1, (ep.N - 1) / kScaleBlock)) * kbn;
    for (int kb = kb0; kb < kb0 + nkb; ++kb) {
      mbar_wait(&empty[stage], phase ^ 1);
      float* slot = slots + stage * kScaleSlotFloats;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int r = lane + kLoaderLanes * i;
        if (r < kRows) cp_async_4(slot + r, ep.blk_sa + a_off[i] + kb);
      }
      if (lane < 2) cp_async_4(slot + kSlotW0 + lane, ep.blk_sb + w_off + kb);
      cp_async_mbar_arrive_noinc(&full[stage]);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  cp_async_wait_all();
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
