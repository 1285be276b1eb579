// Grouped (mixture-of-experts) FP8 GEMM for Hopper (sm_90a): one launch for every expert.
//
//   out[m, n] = sum_k x[m, k] * w[e(m), n, k] * scale_x[m | 0] * scale_w[e(m)][n | 0] + bias[e(m), n]
//   (BLK: sum over k-blocks kb of the k-block's partial sum * scale_x[m, kb] * scale_w[e(m), n / 128, kb]
//    + bias[e(m), n]: 1 x 128 token groups, 128 x 128 weight blocks per expert)
//
// DeepGEMM's m-grouped contiguous layout: the routed tokens x [M, K] are sorted by expert, expert e
// owning rows [offsets[e - 1], offsets[e]) (offsets stay on the device: no host sync, CUDA-graph safe).
// Rows at or past offsets[E - 1] are written as zeros.
//
// Tiles are "swapped" as in the dense decode configs (sm90_gemm.cuh SWAP): the kernel's A side (wgmma M,
// 128 rows, two consumer warpgroups of 64) is 128 weight rows n of one expert, its B side (wgmma N, BN
// columns) BN tokens of that expert, so an expert with 1..BN tokens wastes no tensor-core rows on
// padding tokens beyond BN. Weights are read through one 3-D tensor map {K, N, E} (box 128 x 128 x 1:
// rows past N of an expert are zero-filled, never the next expert's), tokens through a 2-D map {K, M}
// (box 128 x BN; a block that runs into the next expert's rows computes columns that are not stored).
//
// Work list: built by every CTA at its start in shared memory from the offsets: per expert its number
// of BN-token blocks and their prefix sum (warp 0, shuffles), so that work item t of the persistent
// walk (t = blockIdx.x, += gridDim.x) is expert-block t / num_nb, weight block t % num_nb; a per-CTA
// cursor finds the expert (t only grows). Experts with no tokens have no blocks.
//
// Main loop, producer and promotion are the dense kernel's (sm90_mainloop.cuh): BN <= 64 promote every
// 32 of K (four accumulators, as the decode configs); BN = 128 keeps two accumulators in flight
// (mainloop_double) and promotes every 128 of K. Epilogue: per-thread weight-row scales and biases
// loaded at the tile start, direct clipped stores (tokens of the tile's expert, n < N).
//
// Block scales (BLK, the dense kernel's fine-grained scheme, sm90_blockscale.cuh with its swapped
// tiles): scale_x [M, ceil(K/128)] M-major (element [m, kb] at kb * ld + m) is read by TMA, one box of
// the tile's token scales per k-block, into the stage's slot on the stage's full barrier (tokens past M
// read as zero); the expert's weight-block scale scale_w[e, nb, kb] from global memory. A TMA box must
// start 16-byte aligned in global memory (its innermost coordinate a multiple of 16 bytes; otherwise
// the load faults as an illegal instruction), and an expert's token tile starts at any row: the box
// starts at the tile's first row rounded down to kSxAlign tokens and is kSxAlign wider (grouped_sx_box),
// and each thread reads its scales shifted by the remainder (GroupedBlkPromote). Both are
// applied at each k-block's promotion (GroupedBlkPromote), so the epilogue adds only the bias. A 128-row tile
// is one weight block (kBM == kScaleBlock), hence one weight factor per k-block. BN = 128 with block
// scales runs one accumulator without mainloop_double: two accumulators, the result and two k-blocks'
// 32 token factors each would not fit the 232 registers of a consumer thread.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>

#include "sm90_blockscale.cuh"
#include "sm90_epilogue.cuh"
#include "sm90_grouped_api.h"
#include "sm90_mainloop.cuh"
#include "sm90_ptx.cuh"
#include "sm90_tile.cuh"
#include "sm90_wgmma.cuh"

namespace fp8sm90 {

// 3-D tile load global -> shared (coordinates innermost first), completion counted on `bar` (bytes).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// Launch parameters (a __grid_constant__ kernel argument).
struct GroupedParams {
  const void* offsets;  // [E] cumulative row ends (int32, or int64 when offsets_64)
  int offsets_64;
  int M, N, K, E;
  const float* sx;  // token scales: [1] or [M]
  int sx_row;
  const float* sw;  // weight scales: [E] or [E, N]
  int sw_row;
  const void* bias;  // [E, N] or nullptr
  int bias_kind;
  void* out;  // [M, N]
  int out_kind;
  int kbn;  // ceil(K / 128): the row length of block scales (BLK)
};

// TMA facts: a box's first element in global memory and its shared-memory destination must be 16- and
// 128-byte aligned.
constexpr int kTmaGlobalAlign = 16;
constexpr int kTmaSmemAlign = 128;
// Token scales (fp32) per 16 bytes: the scale box starts at the tile's first row rounded down to this.
constexpr int kSxAlign = kTmaGlobalAlign / static_cast<int>(sizeof(float));
// The scale box of a BN-token tile (host: the tensor map's box; device: the expect-tx bytes): BN tokens
// from any row, read from the aligned row before it (a multiple of 16 bytes, as TMA boxes must be).
__host__ __device__ constexpr int grouped_sx_box(int bn) { return bn + kSxAlign; }
// Floats of one stage's scale slot: the box, rounded up to whole TMA destinations.
__host__ __device__ constexpr int grouped_slot_floats(int bn) {
  return (grouped_sx_box(bn) * 4 + kTmaSmemAlign - 1) / kTmaSmemAlign * kTmaSmemAlign / 4;
}

// Shared memory of one CTA: S stages of a weight tile (128 x 128) and a token tile (BN x 128), (BLK) S
// slots of a k-block's token scales (grouped_slot_floats each, TMA destinations right after the
// 1024-byte aligned stages), the full / empty barriers, then the work list: per expert its first token
// block (prefix sum, [E + 1]) and its first row ([E + 1], the clamped offsets).
template <int BN, bool BLK = false>
struct GroupedCfg {
  static constexpr int kStageA = kBM * kBK;
  static constexpr int kStageB = BN * kBK;
  static constexpr int kStage = kStageA + kStageB;
  static constexpr int kSlotFloats = BLK ? grouped_slot_floats(BN) : 0;
  static constexpr int kSlot = kSlotFloats * 4;  // bytes per stage
  static constexpr int kMaxStages = 8;
  static constexpr int kBarBytes = 2 * kMaxStages * 8;
  static constexpr int kTableInts = kGroupedMaxExperts + 1;
  static constexpr int kTableBytes = 2 * kTableInts * 4;
  static constexpr int kStagesFit = (kSmemLimit - kBarBytes - kTableBytes) / (kStage + kSlot);
  static constexpr int kStages = kStagesFit > kMaxStages ? kMaxStages : kStagesFit;
  static constexpr int kSmem = kStages * (kStage + kSlot) + kBarBytes + kTableBytes;
  static_assert(!BLK || (grouped_sx_box(BN) * 4 % kTmaGlobalAlign == 0 && grouped_sx_box(BN) <= 256),
                "the scale box: a multiple of 16 bytes, at most 256 elements");
  static_assert(kSlot % kTmaSmemAlign == 0 && (kStages * kStage) % kTmaSmemAlign == 0,
                "the scale slots are TMA destinations: 128-byte aligned");
  static_assert(kStages >= 4, "too few stages");
  static_assert(kStageB % 1024 == 0, "token stage must keep 1024-byte alignment");
  static_assert(kSmem <= kSmemLimit, "shared memory");
};

__device__ __forceinline__ int load_offset(const GroupedParams& p, int e) {
  const long v = p.offsets_64 ? static_cast<const long long*>(p.offsets)[e] : static_cast<const int*>(p.offsets)[e];
  return static_cast<int>(v < 0 ? 0 : (v > p.M ? p.M : v));
}

// Every CTA: rows[e] = first row of expert e (rows[E] = end of the last), blocks[e] = first token block
// of expert e over all experts (blocks[E] = their total). Ends with __syncthreads.
template <int BN>
__device__ __forceinline__ void build_work_list(const GroupedParams& p, int* blocks, int* rows) {
  for (int e = threadIdx.x; e < p.E; e += kThreads) rows[e + 1] = load_offset(p, e);
  if (threadIdx.x == 0) rows[0] = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int carry = 0;
    for (int base = 0; base < p.E; base += 32) {
      const int e = base + lane;
      int n = 0;
      if (e < p.E) {
        const int s = rows[e], t = rows[e + 1];
        n = t > s ? (t - s + BN - 1) / BN : 0;
      }
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, n, d);
        if (lane >= d) n += up;
      }
      if (e < p.E) blocks[e + 1] = carry + n;
      carry += __shfl_sync(0xffffffffu, n, 31);
    }
    if (lane == 0) blocks[0] = 0;
  }
  __syncthreads();
}

// Work item t -> expert e (cursor: t only grows within a CTA), its token block mb and weight block nb.
__device__ __forceinline__ void locate(int t, int num_nb, const int* blocks, int& e, int& mb, int& nb) {
  const int blk = t / num_nb;
  nb = t - blk * num_nb;
  while (blocks[e + 1] <= blk) ++e;
  mb = blk - blocks[e];
}

// The block-scale promotion of one tile (BLK): the dense kernel's swapped BlkTile and promote_blk
// (sm90_blockscale.cuh) over expert e's weight-block scales, with the grouped slot: its box starts at
// the tile's first row m0 rounded down to kSxAlign tokens, so a thread's first token scale sits at
// 2 (lane % 4) + m0 % kSxAlign (BlkTile::pos), which may be odd: read as single floats (BlkTile::load's
// float2 reads need an even position).
template <int BN, int NACC>
struct GroupedBlkPromote {
  using Factors = BlkFactors<BN, true>;
  static constexpr int kSlotFloats = GroupedCfg<BN, true>::kSlotFloats;
  BlkTile<BN, true> tile;
  // the factors of the tile's i-th k-block, in stage `stage` (its full barrier has completed)
  __device__ __forceinline__ void load(Factors& f, int stage, int i) const {
    const float* slot = tile.slots + stage * kSlotFloats + tile.pos;
    f.w0 = f.w1 = __ldg(tile.w0 + i);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      f.a[2 * j] = slot[8 * j];
      f.a[2 * j + 1] = slot[8 * j + 1];
    }
  }
  // every lane's reads of the slot are ordered before lane 0 releases the stage
  __device__ __forceinline__ void before_release() const { __syncwarp(); }
  __device__ __forceinline__ void promote(float (&fin)[BN / 2], float (&acc)[NACC][BN / 2], const Factors& f) const {
    promote_blk<BN, true, NACC>(fin, acc, f, tile);
  }
};

// BlkTile reads three launch fields of EpiParams (blk_sb, blk_kb, N); a local one carries them (the rest
// is never read). Swapped, BlkTile's row block is the weight block nb. m0: the tile's first token row.
template <int BN, int NACC>
__device__ __forceinline__ GroupedBlkPromote<BN, NACC> grouped_blk_promote(const float* slots, const GroupedParams& p,
                                                                           int e, int nb, int num_nb, int m0,
                                                                           int lane) {
  EpiParams ep;
  ep.blk_sb = p.sw + static_cast<long>(e) * num_nb * p.kbn;
  ep.blk_kb = p.kbn;
  ep.N = p.N;
  GroupedBlkPromote<BN, NACC> pro{BlkTile<BN, true>(slots, ep, nb, 0, 0, 0, lane)};
  pro.tile.pos += m0 % kSxAlign;
  return pro;
}

template <int BN, int NACC, int FW, int FX, bool DBL, bool BLK = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_grouped_sm90_kernel(const __grid_constant__ CUtensorMap tma_w, const __grid_constant__ CUtensorMap tma_x,
                            const __grid_constant__ CUtensorMap tma_sx, const __grid_constant__ GroupedParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using C = GroupedCfg<BN, BLK>;
  constexpr int S = C::kStages;
  uint8_t* smem = g_smem;
  uint8_t* sA = smem;
  uint8_t* sB = smem + S * C::kStageA;
  float* slots = reinterpret_cast<float*>(sB + S * C::kStageB);  // BLK: S slots of C::kSlotFloats
  uint64_t* full = reinterpret_cast<uint64_t*>(sB + S * (C::kStageB + C::kSlot));
  uint64_t* empty = full + C::kMaxStages;
  int* blocks = reinterpret_cast<int*>(full + 2 * C::kMaxStages);
  int* rows = blocks + C::kTableInts;

  if (threadIdx.x == 0) {
    init_stage_barriers<S>(&tma_w, &tma_x, full, empty);
    if constexpr (BLK) tma_prefetch_desc(&tma_sx);
  }
  build_work_list<BN>(p, blocks, rows);  // its __syncthreads also publish the barriers' initialisation

  const int num_nb = (p.N + kBM - 1) / kBM;
  const int num_kb = (p.K + kBK - 1) / kBK;
  const int num_tiles = blocks[p.E] * num_nb;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<RegSplit<BN, DBL>::kProducer>();
    if (threadIdx.x == 0) {
      constexpr uint32_t kBytes = C::kStage + (BLK ? grouped_sx_box(BN) * 4 : 0);
      int stage = 0, e = 0;
      uint32_t phase = 0;
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        int mb, nb;
        locate(t, num_nb, blocks, e, mb, nb);
        const int y = rows[e] + mb * BN;
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);
          mbar_arrive_expect_tx(&full[stage], kBytes);  // OOB parts are zero-filled and still counted
          tma_load_3d(sA + stage * C::kStageA, &tma_w, &full[stage], kb * kBK, nb * kBM, e);
          tma_load_2d(sB + stage * C::kStageB, &tma_x, &full[stage], kb * kBK, y);
          // the scale box from the 16-byte aligned row at or before y (y >= 0)
          if constexpr (BLK) tma_load_2d(slots + stage * C::kSlotFloats, &tma_sx, &full[stage], y & -kSxAlign, kb);
          if (++stage == S) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    // ------------------------------------------------------------ consumers
    setmaxnreg_inc<RegSplit<BN, DBL>::kConsumer>();
    const int cw = wg - 1;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32;
    const int lane = tid % 32;
    int stage = 0, e = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
      int mb, nb;
      locate(t, num_nb, blocks, e, mb, nb);
      const int n0 = nb * kBM + cw * 64 + warp * 16 + lane / 4;  // weight row of fin[4j + e'] (i = 0)
      const int m_begin = rows[e] + mb * BN;
      const int m_end = rows[e + 1];
      // the tile's weight-row scales (BLK: in the promotion instead) and biases, loaded before the main
      // loop (latency hidden by it)
      float rs[2], rb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int n = n0 + 8 * i;
        const bool ok = n < p.N;
        const long wi = static_cast<long>(e) * p.N + n;
        rs[i] = BLK || !ok ? 1.f : __ldg(p.sw + (p.sw_row ? wi : e));
        rb[i] = ok ? load_bias(p.bias, p.bias_kind, wi) : 0.f;
      }
      float fin[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fin[i] = 0.f;
      using Pro = std::conditional_t<BLK, GroupedBlkPromote<BN, NACC>, PlainPromote<BN, NACC>>;
      const Pro pro = [&]() {
        if constexpr (BLK) return grouped_blk_promote<BN, NACC>(slots, p, e, nb, num_nb, m_begin, lane);
        else return Pro{};
      }();
      if constexpr (DBL) {
        static_assert(NACC == 1, "DBL keeps one accumulator per k-block");
        mainloop_double<BN, FW, FX, S, C::kStageA, C::kStageB>(fin, sA + cw * 64 * kBK, sB, full, empty, stage, phase,
                                                              num_kb, lane, []() {}, pro);
      } else {
        float acc[NACC][BN / 2];
        typename Pro::Factors f;  // the k-block's factors (BLK), read from its stage before its MMAs
        for (int kb = 0; kb < num_kb; ++kb) {
          mbar_wait(&full[stage], phase);
          pro.load(f, stage, kb);
          issue_kblock<BN, NACC, FW, FX>(acc, sA + stage * C::kStageA + cw * 64 * kBK, sB + stage * C::kStageB);
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
      // epilogue: kernel row (weight row n) r = 16 warp + lane / 4 + 8 i, kernel column (token) c = 8 j + 2 (lane % 4) + h
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = m_begin + 8 * j + 2 * (lane % 4) + h;
          if (m >= m_end) continue;
          const float sm = BLK ? 1.f : __ldg(p.sx + (p.sx_row ? m : 0));
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int n = n0 + 8 * i;
            if (n >= p.N) continue;
            const float v = fin[4 * j + 2 * i + h];
            store_one(p.out, p.out_kind, static_cast<long>(m) * p.N + n, (BLK ? v : v * (rs[i] * sm)) + rb[i]);
          }
        }
      }
    }
    // rows past the last expert's end: zeros (grid-stride over the consumer threads of every CTA)
    const long total = static_cast<long>(p.M) * p.N;
    for (long idx = static_cast<long>(rows[p.E]) * p.N + blockIdx.x * 256L + (threadIdx.x - 128); idx < total;
         idx += gridDim.x * 256L)
      store_one(p.out, p.out_kind, idx, 0.f);
  }
#endif
}

}  // namespace fp8sm90
