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
// SWAP: the caller passed (B, A) as the kernel's (A, B) so that N sits on wgmma's M side: decode shapes
// (configs 1-3, direct stores of the transposed tile) and the large-M twins of configs 7 / 10 (14 / 15,
// taken for N <= M: per-channel scale_b becomes a row scale; 16-bit outputs staged transposed with
// stmatrix .trans and stored with TMA, see stage_tile_16bit_swap).
//
// Files: sm90_tile.cuh (tiling, parameters, tile walk), sm90_mainloop.cuh (k-blocks, promotion,
// producer), sm90_epilogue.cuh (scales, bias, cast, stores), this file (the kernels: the persistent
// kernel with its consumer schedules, and config 9's cross-tile pipeline), sm90_launch.cuh (launch
// and the config table).
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>

#include "sm90_epilogue.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"
#include "sm90_wgmma.cuh"

namespace fp8sm90 {

// CARRY (configs 12, 13; measured, kernel-log v13: no faster than 7 / 10, not selected): config 7's / 10's two accumulators, with
// each tile's first k-block issued BEFORE the previous tile's epilogue, so that the tensor cores work
// through the epilogue (configs 7/10 drain at every tile end: wait_group 0, promote, epilogue, and
// only then the next MMA; docs/kernel-log.md v12). One warpgroup's schedule, one flat loop over
// k-block pairs, n = num_kb even (the host routes odd n to the base kernel):
//   kb 0 -> a0 (issued before the previous epilogue), kb 1 -> a1, kb 2 -> a0, ..., kb n-1 -> a1;
//   each issue is followed by wait_group 1 (the previous k-block retired), its stage's release and its
//   promotion into fin, in mainloop_double's order (so the output is bit for bit config 7's / 10's).
// Tile end: kb n-1 in flight in a1; the next tile's kb 0 goes into a0 (after the CTA's last tile: a
// dummy re-read of kb n-1's stage, so that every path has the same wgmma groups in flight), wait_group
// 1, promote a1, then the epilogue runs with that k-block in flight. What ptxas (nvcc 13.0) needs to
// keep the wgmmas pipelined here (found by compiling variants, docs/kernel-log.md v13): the accumulators' first
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

template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL, bool CARRY = false, bool SPLIT = false,
          bool BLK = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ CUtensorMap tma_out, int rows_a, int rows_b, int K,
                         const __grid_constant__ EpiParams ep) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using C = TileCfg<BN, SWAP, BLK>;
  constexpr int S = C::kStages;
  uint8_t* smem = g_smem;
  const SmemLayout<BN, SWAP, BLK> L(smem);
  uint8_t* sA = L.sA;
  uint8_t* sB = L.sB;
  uint8_t* sC = L.sC;
  float* sVec = L.sVec;
  uint64_t* full = L.full;
  uint64_t* empty = L.empty;

  static_assert(CL == 1 || (CL == 2 && !SWAP), "clusters only for the non-swapped config");
  static_assert(!BLK || (CL == 1 && !CARRY), "block scales: single-CTA configs without the carried schedule");
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

  if (threadIdx.x == 0) init_stage_barriers<S, CL, BLK ? kBlkFullArrivals : 1>(&tma_a, &tma_b, full, empty);
  if constexpr (CL > 1) cluster_sync();  // peers' barriers are initialised before any multicast
  else __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<RegSplit<BN, DBL>::kProducer>();
    if (threadIdx.x == 0) {
      producer_loop<BN, CL, S, C::kStageA, C::kStageB, C::kStage, SPLIT>(&tma_a, &tma_b, sA, sB, full, empty, first_tile,
                                                                  num_tiles, tile_step, num_mp, num_kb, rank, ep);
    }
    if constexpr (BLK) {
      if (threadIdx.x / 32 == 1)  // the scale loader warp (sm90_blockscale.cuh)
        scale_loader<BN, SWAP, S, SPLIT>(L.scales, full, empty, first_tile, num_tiles, tile_step, num_mp, num_kb, ep,
                                         threadIdx.x % 32);
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
      // the k-blocks' promotion: plain, or with the fine-grained scales of this tile (BLK)
      using Pro = std::conditional_t<BLK, BlkPromote<BN, SWAP, NACC>, PlainPromote<BN, NACC>>;
      const Pro pro = [&]() {
        if constexpr (BLK) return Pro{BlkTile<BN, SWAP>(L.scales, cw * 64 + lr0, col_base, lane)};
        else return Pro{};
      }();
      if constexpr (DBL) {
        static_assert(NACC == 1, "DBL keeps one accumulator per k-block");
        mainloop_double<BN, CL, FA, FB, S, C::kStageA, C::kStageB>(
            fin, sA + cw * 64 * kBK, sB, full, empty, stage, phase, nkb, lane,
            [&]() { epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid); }, pro);
      } else {
        epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid);
        float acc[NACC][BN / 2];
        typename Pro::Factors f;  // the k-block's factors (BLK), read from its stage before its MMAs
        for (int kb = 0; kb < nkb; ++kb) {
          mbar_wait(&full[stage], phase);
          pro.load(f, stage);
          issue_kblock<BN, NACC, FA, FB>(acc, sA + stage * C::kStageA + cw * 64 * kBK, sB + stage * C::kStageB);
          wgmma_wait<0>();
          pro.before_release();
          release_stage<CL>(empty, stage, lane);
          pro.promote(fin, acc, f);  // FP32 promotion every 128 / NACC of K
          if (++stage == S) {
            stage = 0;
            phase ^= 1;
          }
        }
      }

      finish_tile<BN, SWAP>(fin, ep, pf, vec, ctile, &tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0,
                            SPLIT ? split * ep.split_stride : 0);
    }
    if ((!SWAP || swap_tma_store<BN, SWAP>()) && tid == 0) bulk_wait0();
  }
  // No CTA may leave while its peer can still multicast into it or arrive on its barriers.
  if constexpr (CL > 1) cluster_sync();
#endif
}

// ---------------------------------------------------------------------------------------------------
// OVL (config 9): config 7's two accumulators per consumer warpgroup, with the k-block pipeline carried
// across tile boundaries (consumer_stream). Config 7 drains its pipeline at the end of every tile
// (wait_group 0) and then runs the epilogue with no MMA of its own queued: measured as about 2
// k-blocks of tensor-core time per tile (docs/kernel-log.md v8). Here the next tile's first k-block is issued
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

}  // namespace fp8sm90
