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
// stored. The weight factors (one or two per k-block and tile, the same for a whole warp) of a tile's
// k-blocks are staged in shared memory once per tile (BlkTileStaged), so a k-block's factor products
// are two or three shared-memory reads and FMULs right after its full barrier. (v26-v31 read the weight
// factor from global memory per k-block: its load and the FMUL waiting on it were ~3% of the block
// path's stall samples at 4096^3, docs/kernel-log.md v29.)
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
// block rows of scale_b in global memory (the grouped kernel's GroupedBlkPromote, sm90_grouped.cuh).
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
};

// One k-block's factor products of one consumer thread, fin += partial x product: not swapped, its two
// rows' activation scales times the tile's first weight block's scale (p[0], p[1]) and the second's (p[2],
// p[3]; the same for tiles inside one block); swapped, the weight block's scale times its BN / 4
// columns' activation scales. One fp32 rounding per product, as written in the formula above.
template <int BN, bool SWAP>
struct BlkProducts {
  static constexpr int kN = SWAP ? BN / 4 : 4;
  float p[kN];
};

// The products of one k-block's factors: a: the activation scales (BlkFactors::a), w0 / w1: the weight
// blocks' scales.
template <int BN, bool SWAP>
__device__ __forceinline__ BlkProducts<BN, SWAP> blk_products(const float (&a)[BlkFactors<BN, SWAP>::kA], float w0,
                                                             float w1) {
  BlkProducts<BN, SWAP> r;
  if constexpr (!SWAP) {
    r.p[0] = a[0] * w0;
    r.p[1] = a[1] * w0;
    r.p[2] = a[0] * w1;
    r.p[3] = a[1] * w1;
  } else {
#pragma unroll
    for (int j = 0; j < BN / 4; ++j) r.p[j] = w0 * a[j];
  }
  return r;
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

// The tile's weight factors staged in shared memory (the dense kernel, sm90_gemm.cuh): at the tile
// start each thread of the consumer warpgroup loads up to kWFacCap / 128 entries of each of the tile's
// scale_b rows from global memory (entry tid into a register as the tile starts, `pre`), stores them
// into the warpgroup's buffer for this tile (`buf`: one of two, alternate tiles, so the stores of tile
// t never meet the reads of tile t - 1: every thread finished those before it passed tile t - 1's
// barrier, two tiles back for this buffer) once the tile's first k-block is issued (tile_start), and
// one named barrier of the warpgroup publishes them. Each k-block's factors are then two shared-memory
// reads and the products, right after the stage's full barrier: no global load in the k loop
// (docs/kernel-log.md v29 "Stall samples", v32). K-blocks past kWFacCap of a tile (K > 32768 in one
// tile or split) read their weight factor from global memory.
template <int BN, bool SWAP>
struct BlkTileStaged {
  static constexpr int kRows = blk_weight_rows<BN, SWAP>();
  static constexpr bool kTwoBlocks = kRows == 2;
  const float* slots;  // the S activation-factor slots (SmemLayout::scales), at the thread's first entry
  float* buf;          // kRows x kWFacCap floats: this tile's weight factors (row r at r * kWFacCap)
  const EpiParams& ep;  // the launch's (scale_b: ep.blk_sb; a kernel parameter, read from the constant bank)
  int w;               // offset in scale_b of the tile's (first) weight block's row, from its first k-block
  int w1;              // the next block's row, as an offset from w (kTwoBlocks; clamped to the last block)
  float pre[kRows];    // this thread's first staged factor of each row (k-block tid of the tile)
  int cut;             // tile column where the second weight block starts (kTwoBlocks)
  int nstaged;         // min(nkb, kWFacCap)
  int tid, bar;        // thread in the consumer warpgroup, the warpgroup's named barrier

  // mb / nb: the tile's row block of 128 rows / column block; kb0 / nkb: its k-block range (split K).
  __device__ __forceinline__ BlkTileStaged(const float* slot_base, float* buffer, const EpiParams& ep_, int mb, int nb,
                                           int kb0, int nkb, int tile_row_local, int lane, int tid_, int bar_id)
      : buf(buffer), ep(ep_), w1(0), tid(tid_), bar(bar_id) {
    const int kbn = ep.blk_kb;
    if constexpr (!SWAP) {
      const int col_base = nb * BN;
      const int wb = col_base / kScaleBlock;
      slots = slot_base + tile_row_local;
      cut = (wb + 1) * kScaleBlock - col_base;
      w = wb * kbn + kb0;
      if constexpr (kTwoBlocks) w1 = (min(wb + 1, (ep.N - 1) / kScaleBlock) - wb) * kbn;
    } else {
      slots = slot_base + 2 * (lane % 4);
      cut = BN;
      w = mb * kbn + kb0;
    }
    nstaged = min(nkb, kWFacCap);
#pragma unroll
    for (int r = 0; r < kRows; ++r) pre[r] = tid < nstaged ? __ldg(ep.blk_sb + w + r * w1 + tid) : 0.f;
  }

  // The whole consumer warpgroup, once per tile, after its first k-block's wgmmas are issued.
  __device__ __forceinline__ void tile_start() const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (tid < nstaged) buf[r * kWFacCap + tid] = pre[r];
#pragma unroll 1
      for (int i = tid + 128; i < nstaged; i += 128) buf[r * kWFacCap + i] = __ldg(ep.blk_sb + w + r * w1 + i);
    }
    named_bar_sync(bar, 128);
  }

  // The weight factor of row r at the tile's k-block i.
  __device__ __forceinline__ float weight(int r, int i) const {
    return i < kWFacCap ? buf[r * kWFacCap + i] : __ldg(ep.blk_sb + w + r * w1 + i);
  }

  // The products of the tile's i-th k-block, in stage `stage` (its full barrier has completed).
  __device__ __forceinline__ void load(BlkProducts<BN, SWAP>& f, int stage, int i) const {
    const float* slot = slots + stage * kScaleSlotFloats;
    float a[BlkFactors<BN, SWAP>::kA];
    if constexpr (!SWAP) {
      a[0] = slot[0];
      a[1] = slot[8];
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(slot + 8 * j);
        a[2 * j] = v.x;
        a[2 * j + 1] = v.y;
      }
    }
    const float w0 = weight(0, i);
    f = blk_products<BN, SWAP>(a, w0, kTwoBlocks ? weight(kRows - 1, i) : w0);
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
                                                const BlkProducts<BN, false>& f) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = 4 * j + 2 * i + e;
        // one FFMA, as promote_blk's contracted `fin += part * s` (explicit: with the mul and the add
        // apart, ptxas merged the eight cases' adds after the switch, an FMUL + FADD per value)
        fin[v] = __fmaf_rn(kblock_partial<BN, NACC>(acc, v), 8 * j < CUT ? f.p[i] : f.p[2 + i], fin[v]);
      }
}

// Block-scaled FP32 promotion: fin += (sum of the k-block's NACC partial accumulators) x its factor
// product (cut: the tile column where the second weight block starts, not swapped).
template <int BN, bool SWAP, int NACC>
__device__ __forceinline__ void promote_blk(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2],
                                            const BlkProducts<BN, SWAP>& f, int cut) {
  if constexpr (blk_cut_dispatch<BN, SWAP>()) {
    static_assert(kScaleBlock == 8 * 16, "cut cases 16, 32, .., 128");
    switch (cut) {
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
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const bool first = BN % kScaleBlock == 0 || 8 * j < cut;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float s = first ? f.p[i] : f.p[2 + i];
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
        const float s = f.p[2 * j + e];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int v = 4 * j + 2 * i + e;
          fin[v] += kblock_partial<BN, NACC>(acc, v) * s;
        }
      }
  }
}

// The same from one k-block's factors read as they are (the grouped kernel's GroupedBlkPromote).
template <int BN, bool SWAP, int NACC>
__device__ __forceinline__ void promote_blk(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2],
                                            const BlkFactors<BN, SWAP>& f, const BlkTile<BN, SWAP>& t) {
  promote_blk<BN, SWAP, NACC>(fin, acc, blk_products<BN, SWAP>(f.a, f.w0, f.w1), t.cut);
}

}  // namespace fp8sm90
