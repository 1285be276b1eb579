// The sm90 GEMM's main loop: one 128-wide k-block as four wgmma k32 steps, the FP32 promotion, the
// two-accumulator consumer loop (mainloop_double), the stage barriers and the producer thread's TMA
// loads.
#pragma once
#include <cstdint>
#include <type_traits>

#include "sm90_blockscale.cuh"
#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"
#include "sm90_wgmma.cuh"

namespace fp8sm90 {

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

// Arrive on the empty barrier of stage `s` once per warp (lane 0).
__device__ __forceinline__ void release_stage(uint64_t* empty, int s, int lane) {
  if (lane == 0) mbar_arrive(&empty[s]);
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

// How the consumer loops promote a k-block: PlainPromote adds the partial sums as they are (the
// launch's per-tensor / per-row scales are applied in the epilogue); BlkPromote scales them by the
// k-block's fine-grained factor products (sm90_blockscale.cuh BlkTileStaged), which `load(f, stage, i)`
// (i: the tile's k-block index) forms from the stage's activation-factor slot and the tile's weight
// factors in shared memory as soon as the stage is full, before its wgmmas are issued (read after the
// wgmmas, the loads queue behind their shared-memory traffic). A promotion with `tile_start()` stages
// per-tile data once the tile's first k-block is issued; its first k-block's factors are read after that.
template <int BN, int NACC>
struct PlainPromote {
  struct Factors {};
  __device__ __forceinline__ void load(Factors&, int, int) const {}
  __device__ __forceinline__ void before_release() const {}
  __device__ __forceinline__ void promote(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2], const Factors&) const {
    fp8sm90::promote<BN, NACC>(fin, acc);
  }
};

template <int BN, bool SWAP, int NACC>
struct BlkPromote {
  using Factors = BlkProducts<BN, SWAP>;
  static constexpr bool kStagesPerTile = true;
  BlkTileStaged<BN, SWAP> tile;
  __device__ __forceinline__ void tile_start() const { tile.tile_start(); }
  __device__ __forceinline__ void load(Factors& f, int stage, int i) const { tile.load(f, stage, i); }
  // every lane's reads of the slot are ordered before lane 0 releases the stage
  __device__ __forceinline__ void before_release() const { __syncwarp(); }
  __device__ __forceinline__ void promote(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2], const Factors& f) const {
    promote_blk<BN, SWAP, NACC>(fin, acc, f, tile.cut);
  }
};

// Whether promotion Pro stages per-tile data (Pro::kStagesPerTile: BlkPromote).
template <class Pro, class = void>
struct StagesPerTile : std::false_type {};
template <class Pro>
struct StagesPerTile<Pro, std::void_t<decltype(Pro::kStagesPerTile)>> : std::bool_constant<Pro::kStagesPerTile> {};

// DBL: two accumulators; k-block i+1's wgmmas are issued before k-block i is promoted
// (wgmma.wait_group 1), so the tensor core always has this warpgroup's next k-block queued. The
// roles of the two accumulators are fixed in each half of the loop body (no run-time indexing). The
// two halves are written out on purpose: folded into one lambda with the accumulators as arguments,
// ptxas no longer proves the pipeline and serializes every wgmma (C7514 + C7517, nvcc 13.0).
// after_first() runs right after the first k-block's wgmmas are issued (the tile's epilogue prefetch:
// its address arithmetic and loads then overlap the MMAs instead of delaying the first issue).
// pro: the promotion (PlainPromote or BlkPromote); f0 / f1: the factors of a0's / a1's k-block, loaded
// from its stage right after its full barrier, before its wgmmas are issued (when Pro stages per-tile
// data: the tile's first k-block's after its issue, pro.tile_start and after_first).
template <int BN, int FA, int FB, int S, int kStageA, int kStageB, class AfterFirst, class Pro>
__device__ __forceinline__ void mainloop_double(float (&fin)[BN / 2], const uint8_t* sA, const uint8_t* sB,
                                                uint64_t* full, uint64_t* empty, int& stage, uint32_t& phase,
                                                int num_kb, int lane, AfterFirst&& after_first, const Pro& pro) {
  float a0[1][BN / 2], a1[1][BN / 2];
  typename Pro::Factors f0, f1;
  auto advance = [&]() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }
  };
  mbar_wait(&full[stage], phase);
  if constexpr (!StagesPerTile<Pro>::value) pro.load(f0, stage, 0);
  issue_kblock<BN, 1, FA, FB>(a0, sA + stage * kStageA, sB + stage * kStageB);
  if constexpr (StagesPerTile<Pro>::value) pro.tile_start();
  after_first();  // work of the tile start that can run while the first k-block's MMAs do
  if constexpr (StagesPerTile<Pro>::value) pro.load(f0, stage, 0);
  int prev = stage;
  advance();
  for (int kb = 1;; ++kb) {
    if (kb == num_kb) {
      wgmma_wait<0>();
      pro.before_release();
      release_stage(empty, prev, lane);
      pro.promote(fin, a0, f0);
      break;
    }
    mbar_wait(&full[stage], phase);
    pro.load(f1, stage, kb);
    issue_kblock<BN, 1, FA, FB>(a1, sA + stage * kStageA, sB + stage * kStageB);
    wgmma_wait<1>();
    pro.before_release();
    release_stage(empty, prev, lane);
    pro.promote(fin, a0, f0);
    prev = stage;
    advance();
    if (++kb == num_kb) {
      wgmma_wait<0>();
      pro.before_release();
      release_stage(empty, prev, lane);
      pro.promote(fin, a1, f1);
      break;
    }
    mbar_wait(&full[stage], phase);
    pro.load(f0, stage, kb);
    issue_kblock<BN, 1, FA, FB>(a0, sA + stage * kStageA, sB + stage * kStageB);
    wgmma_wait<1>();
    pro.before_release();
    release_stage(empty, prev, lane);
    pro.promote(fin, a1, f1);
    prev = stage;
    advance();
  }
}

// Thread 0: prefetch the operand tensor maps and initialise the stage barriers.
//   full[s]:  1 arrival (the producer's arrive.expect_tx) + the stage's TMA bytes; consumers wait on it.
//   empty[s]: one arrival per consumer warp (kEmpty: 2 warpgroups x 4 warps, or 4 for the one consumer
//             warpgroup of a 64-row tile); the producer waits on it before refilling the stage.
//   (BLK: the stage's activation factors come with the same expect_tx, sm90_blockscale.cuh.)
template <int S, int kFull = 1, int kEmpty = 8>
__device__ __forceinline__ void init_stage_barriers(const CUtensorMap* tma_a, const CUtensorMap* tma_b,
                                                    uint64_t* full, uint64_t* empty) {
  tma_prefetch_desc(tma_a);
  tma_prefetch_desc(tma_b);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    mbar_init(&full[s], kFull);
    mbar_init(&empty[s], kEmpty);  // one arrival per consumer warp
  }
  fence_mbar_init();
  fence_proxy_async();
}

// The producer thread: for every tile of this CTA, every k-block: wait until the stage is empty, then
// load A (BM rows) and B (BN rows) into it, completing on full[] (BLK: and the k-block's activation
// factors into the stage's slot of `slots`).
template <int BN, int S, int kStageA, int kStageB, int kStage, bool SPLIT = false, bool SWAP = false, bool BLK = false,
          int BM = kBM>
__device__ __forceinline__ void producer_loop(const CUtensorMap* tma_a, const CUtensorMap* tma_b, uint8_t* sA,
                                              uint8_t* sB, uint64_t* full, uint64_t* empty, int first_tile,
                                              int num_tiles, int tile_step, int num_m, int num_kb,
                                              const EpiParams& ep, float* slots = nullptr) {
  constexpr uint32_t kBytes = kStage + (BLK ? scale_box_bytes<BN, SWAP>() : 0);
  int stage = 0;
  uint32_t phase = 0;
  for (int t = first_tile; t < num_tiles; t += tile_step) {
    int tile, split, kb0, nkb, mb, nb;
    split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
    tile_coords(tile, num_m, ep, mb, nb);
    for (int kb = kb0; kb < kb0 + nkb; ++kb) {
      mbar_wait(&empty[stage], phase ^ 1);
      mbar_arrive_expect_tx(&full[stage], kBytes);  // OOB parts are zero-filled and still counted
      tma_load_2d(sA + stage * kStageA, tma_a, &full[stage], kb * kBK, mb * BM);
      tma_load_2d(sB + stage * kStageB, tma_b, &full[stage], kb * kBK, nb * BN);
      if constexpr (BLK) load_scale_slot<BN, SWAP>(slots + stage * kScaleSlotFloats, ep, &full[stage], kb,
                                                   SWAP ? nb * BN : mb * kBM);
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

}  // namespace fp8sm90
