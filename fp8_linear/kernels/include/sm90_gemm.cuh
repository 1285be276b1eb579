// Persistent, warp-specialized FP8 GEMM for Hopper (sm_90a).
//
//   out[m, n] = sum_k A[m, k] * B[n, k] * scale_a[m | 0] * scale_b[n | 0] + bias[n]
//   (BLK: sum over k-blocks kb of the k-block's partial sum * scale_a[m, kb] * scale_b[n / 128, kb] + bias[n])
//
// CTA = 3 warpgroups: WG0 producer (one thread issues TMA: the operands' tiles and, with block scales,
// the k-blocks' activation factors), WG1/WG2 consumers, each owning 64 rows of the 128 x BN tile (BM = 64:
// 2 warpgroups, one consumer owning the 64 x BN tile; the swapped decode tiles, see TileCfg). BLOCK_K = 128 = one
// 128-byte swizzle row of fp8. K-blocks flow through a ring of STAGES shared-memory stages guarded by
// full/empty mbarriers. Each k-block is 4 wgmma k32 steps into a fresh accumulator (NACC of them: the
// four-accumulator decode tiles promote every 32 of K) which is then added into FP32 registers (promotion every 128 of K).
// DBL: two such accumulators per consumer WG, k-block i+1 issued before k-block i is retired and
// promoted (the large-M tiles).
// Epilogue: scales, bias and the cast, staged in shared memory (stmatrix for 16-bit outputs) and
// written with TMA stores; direct clipped stores where TMA cannot take the output.
// SWAP: the caller passed (B, A) as the kernel's (A, B) so that N sits on wgmma's M side: decode shapes
// (BN 16 / 32 / 64: direct stores of the transposed tile) and the large-M swapped tiles (BN 128 / 144,
// taken for N <= M: per-channel scale_b becomes a row scale; 16-bit outputs staged transposed with
// stmatrix .trans and stored with TMA, see stage_tile_16bit_swap).
// SPLIT: each output tile is `splits` work items over consecutive K ranges (split_tile); the last of them
// to finish sums the raw partials in split order and runs the epilogue (split_fixup, sm90_epilogue.cuh):
// one launch. BLK: fine-grained scales (sm90_blockscale.cuh).
// Programmatic dependent launch (pdl.h): barrier init, tensor-map prefetch, setmaxnreg and the L2
// prefetch of the first weight k-blocks (prefetch_kb > 0) run before griddepcontrol.wait, which every
// thread that touches global memory (the producer thread, the consumers) passes first; the producer
// thread lets the next kernel launch once it has issued its last load.
//
// Files: sm90_tile.cuh (tiling, parameters, tile walk), sm90_mainloop.cuh (k-blocks, promotion,
// producer), sm90_blockscale.cuh (block scales), sm90_epilogue.cuh (scales, bias, cast, stores), this
// file (the kernel), sm90_launch.cuh (launch), sm90_configs.cuh (the configs' instances, generated from
// fp8_linear/kernels/configs.py).
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>

#include "pdl.h"
#include "sm90_epilogue.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"
#include "sm90_wgmma.cuh"

namespace fp8sm90 {

// The first `n` k-blocks (at most the item's) of the weight tile of work item t into L2: the kernel's A
// side when SWAP (the weight's rows on wgmma's M side), else its B side; `map` is that side's operand map
// (box: 128 x BM or 128 x BN). Issued before the PDL wait: it reads only the weight, into L2.
template <int BN, bool SWAP, bool SPLIT, int BM = kBM>
__device__ __forceinline__ void prefetch_weight_l2(const CUtensorMap* map, int t, int num_tiles, int num_m, int num_kb,
                                                   const EpiParams& ep, int n) {
  if (n <= 0 || t >= num_tiles) return;
  int tile, split, kb0, nkb, mb, nb;
  split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
  tile_coords(tile, num_m, ep, mb, nb);
  const int row = SWAP ? mb * BM : nb * BN;
  const int end = kb0 + (n < nkb ? n : nkb);
#pragma unroll 1
  for (int kb = kb0; kb < end; ++kb) tma_prefetch_l2_2d(map, kb * kBK, row);
}

template <int BN, bool SWAP, int NACC, int FA, int FB, bool DBL, bool SPLIT = false, bool BLK = false, int BM = kBM>
__global__ void __launch_bounds__(TileCfg<BN, SWAP, BLK, BM>::kThreads, 1)
    fp8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ CUtensorMap tma_out, int rows_a, int rows_b, int K,
                         const __grid_constant__ EpiParams ep, int prefetch_kb) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using C = TileCfg<BN, SWAP, BLK, BM>;
  constexpr int S = C::kStages;
  // One consumer warpgroup (BM = 64) runs without setmaxnreg: 256 threads have up to 255 registers each.
  constexpr bool kRegSplit = C::kConsumers == 2;
  uint8_t* smem = g_smem;
  const SmemLayout<BN, SWAP, BLK, BM> L(smem);
  uint8_t* sA = L.sA;
  uint8_t* sB = L.sB;
  uint8_t* sC = L.sC;
  float* sVec = L.sVec;
  uint64_t* full = L.full;
  uint64_t* empty = L.empty;

  const int num_m = (rows_a + BM - 1) / BM;
  const int num_n = (rows_b + BN - 1) / BN;
  const int num_kb = (K + kBK - 1) / kBK;
  const int num_tiles = num_m * num_n * (SPLIT ? ep.splits : 1);  // work items: tiles x K splits
  const int wg = threadIdx.x / 128;
  const int first_tile = blockIdx.x;
  const int tile_step = gridDim.x;

  if (threadIdx.x == 0) {
    init_stage_barriers<S, 1, 4 * C::kConsumers>(&tma_a, &tma_b, full, empty);
    if constexpr (BLK) tma_prefetch_desc(&ep.tma_sa);
    // PDL: the weight's first k-blocks into L2 while the previous kernel finishes (here, before
    // setmaxnreg: in the producer's 40 registers the tile arithmetic spilled, nvcc 13.0)
    prefetch_weight_l2<BN, SWAP, SPLIT, BM>(SWAP ? &tma_a : &tma_b, first_tile, num_tiles, num_m, num_kb, ep,
                                            prefetch_kb);
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    if constexpr (kRegSplit) setmaxnreg_dec<RegSplit<BN, DBL>::kProducer>();
    if (threadIdx.x == 0) {
      fp8pdl::pdl_wait();  // the activation, its scales: the previous kernel's output
      producer_loop<BN, S, C::kStageA, C::kStageB, C::kStage, SPLIT, SWAP, BLK, BM>(
          &tma_a, &tma_b, sA, sB, full, empty, first_tile, num_tiles, tile_step, num_m, num_kb, ep, L.scales);
      fp8pdl::pdl_launch_dependents();  // every load issued: the next kernel may start its prologue
    }
  } else {
    // ------------------------------------------------------------ consumers
    if constexpr (kRegSplit) setmaxnreg_inc<RegSplit<BN, DBL>::kConsumer>();
    fp8pdl::pdl_wait();  // scales, bias, the output (and split-K workspace) may be the previous kernel's
    const int cw = wg - 1;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int bar_id = 1 + cw;
    float* vec = sVec + cw * 2 * BN;
    uint8_t* ctile = sC + cw * (C::kCTile / 2);
    int stage = 0;
    uint32_t phase = 0;
    for (int t = first_tile; t < num_tiles; t += tile_step) {
      int tile, split, kb0, nkb, mb, nb;
      split_tile<SPLIT>(t, ep, num_kb, tile, split, kb0, nkb);
      tile_coords(tile, num_m, ep, mb, nb);
      const int lr0 = warp * 16 + lane / 4;  // local row inside the warpgroup's 64 rows
      const int tile_row0 = mb * BM + cw * 64;
      const int row0 = tile_row0 + lr0;
      const int col_base = nb * BN;
      EpiPrefetch<BN> pf;

      float fin[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
      // the k-blocks' promotion: plain, or with the fine-grained scales of this tile (BLK)
      using Pro = std::conditional_t<BLK, BlkPromote<BN, SWAP, NACC>, PlainPromote<BN, NACC>>;
      const Pro pro = [&]() {
        // (the row block of 128: a 64-row tile lies inside one 128-row weight block, block mb / 2)
        if constexpr (BLK) {
          // alternate tiles of this CTA (t = first_tile + j tile_step, first_tile < tile_step: j = t / tile_step)
          // stage into alternate buffers of the warpgroup
          const int parity = (t / tile_step) & 1;
          float* buf = L.wfac + (2 * cw + parity) * blk_weight_rows<BN, SWAP>() * kWFacCap;
          return Pro{BlkTileStaged<BN, SWAP>(L.scales, buf, ep, mb / (kBM / BM), nb, kb0, nkb, cw * 64 + lr0, lane,
                                             tid, bar_id)};
        }
        else return Pro{};
      }();
      if constexpr (DBL) {
        static_assert(NACC == 1, "DBL keeps one accumulator per k-block");
        mainloop_double<BN, FA, FB, S, C::kStageA, C::kStageB>(
            fin, sA + cw * 64 * kBK, sB, full, empty, stage, phase, nkb, lane,
            [&]() { epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid); }, pro);
      } else {
        epi_prefetch<BN, SWAP>(pf, ep, row0, col_base, tid);
        float acc[NACC][BN / 2];
        typename Pro::Factors f;  // the k-block's factors (BLK), read from its stage before its MMAs
        for (int kb = 0; kb < nkb; ++kb) {
          mbar_wait(&full[stage], phase);
          if (!StagesPerTile<Pro>::value || kb > 0) pro.load(f, stage, kb);
          issue_kblock<BN, NACC, FA, FB>(acc, sA + stage * C::kStageA + cw * 64 * kBK, sB + stage * C::kStageB);
          if constexpr (StagesPerTile<Pro>::value) {
            if (kb == 0) {  // the tile's weight factors into shared memory, under its first k-block's MMAs
              pro.tile_start();
              pro.load(f, stage, 0);
            }
          }
          wgmma_wait<0>();
          pro.before_release();
          release_stage(empty, stage, lane);
          pro.promote(fin, acc, f);  // FP32 promotion every 128 / NACC of K
          if (++stage == S) {
            stage = 0;
            phase ^= 1;
          }
        }
      }

      if constexpr (SPLIT) {  // the tile's last split sums the partials and runs the epilogue; the others skip it
        if (!split_fixup<BN, C::kConsumers>(fin, ep, t, cw, tid, bar_id, row0 < (SWAP ? ep.N : ep.M),
                                            col_base + 2 * (lane % 4), SWAP ? ep.M : ep.N,
                                            reinterpret_cast<volatile int*>(vec)))
          continue;
      }
      finish_tile<BN, SWAP>(fin, ep, pf, vec, ctile, &tma_out, row0, col_base, lr0, lane, tid, bar_id, tile_row0);
    }
    if ((!SWAP || swap_tma_store<BN, SWAP>()) && tid == 0) bulk_wait0();
  }
#endif
}

}  // namespace fp8sm90
