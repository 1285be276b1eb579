// Plain C++ interface between the torch binding (binding.cpp) and the kernel units (csrc/*.cu).
// No torch headers here, no CUDA device code.
#pragma once
#include <cuda_runtime_api.h>

namespace fp8sm90 {

// Kernel configurations; the table must match kernels/configs.py (CONFIGS).
//   id : (BN, swap_ab, NACC = accumulators per 128-wide k-block: promotion every 128 / NACC of K, cluster)
//   0  : (128, false, 1, 1)   M > 64: A rows on wgmma's M; TMA-store epilogue when N * esize % 16 == 0
//   1  : ( 16, true,  4, 1)   M <= 16: swap A/B, N on wgmma's M
//   2  : ( 32, true,  4, 1)   M <= 32
//   3  : ( 64, true,  4, 1)   M <= 64 when N > 6144 (smaller N: config 7; kernels/configs.py)
//   4  : (128, false, 2, 1)   as 0 with promotion every 64 of K (slower; comparison)
//   5  : (128, false, 1, 2)   as 0 on 2-CTA clusters, B tile multicast (half the B traffic from L2)
//   6  : (192, false, 1, 1)   128 x 192 tile: 20% less shared-memory traffic per FLOP than 128 x 128
//   7  : (128, false, 1, 1)   as 0 with two accumulators: k-block i+1 issued before k-block i is promoted
//                             (the large-M default, see kernels/configs.py)
//   8  : (128, false, 1, 2)   as 7 on 2-CTA clusters, B tile multicast
//   9  : (128, false, 1, 1)   as 7 with the pipeline carried across tiles: the next tile's first two
//                             k-blocks are issued before this tile's epilogue (not selected; NOTES v9)
//   10 : (144, false, 1, 1)   as 7 on a 128 x 144 tile (the tile cuBLASLt picks for most large shapes):
//                             6% less operand traffic per FLOP, other wave counts; consumers at 240 registers
//   11 : (144, false, 1, 2)   as 10 on 2-CTA clusters, B tile multicast (cuBLASLt's 144 x 128, cluster 1x2)
//   12 : (128, false, 1, 1)   as 7 with each tile's first k-block issued before the previous tile's
//                             epilogue (CARRY; even k-block counts, else config 7's kernel; prepared,
//                             not yet run on a device, not selected)
//   13 : (144, false, 1, 1)   as 10 with CARRY (else config 10's kernel; prepared, not selected)
//   14 : (128, true,  1, 1)   as 7 with A/B swapped (the weight's N on wgmma's M side) for large M: the
//                             per-channel scale_b is then a per-thread row scale (two values per thread,
//                             loaded at the tile start) instead of a column vector read in the epilogue;
//                             16-bit outputs through a transposed TMA store (stmatrix .trans); chosen
//                             for N <= M with a per-tensor scale_a and a 16-bit output (kernels/configs.py)
//   15 : (144, true,  1, 1)   as 10 with A/B swapped (config 14's epilogue; consumers at 240 registers)
enum { kNumConfigs = 16 };

struct GemmArgs {
  const void* a;  // [M, K] fp8, K-contiguous
  const void* b;  // [N, K] fp8, K-contiguous
  int M, N, K;
  int fmt_a, fmt_b;  // 0 = e4m3, 1 = e5m2
  const float* scale_a;
  int scale_a_row;  // 0: [1], 1: [M, 1]
  const float* scale_b;
  int scale_b_row;  // 0: [1], 1: [N, 1]
  // 1: fine-grained scales, scale_a [M, ceil(K/128)] (1 x 128 activation groups) and scale_b
  // [ceil(N/128), ceil(K/128)] (128 x 128 weight blocks), fp32 row-major, applied at each k-block's
  // promotion (sm90_blockscale.cuh); scale_a_row / scale_b_row are then ignored. Configs 1, 2, 3, 6 and 7
  // only (their BLK kernel instances; kernels/configs.py block_scales).
  int scale_block;
  const void* bias;  // nullptr or [N]
  int bias_kind;     // 0 none, 1 fp32, 2 bf16, 3 fp16
  void* out;         // [M, N], row-major
  int out_kind;      // 0 fp32, 1 bf16, 2 fp16
  int config;        // 0 .. kNumConfigs-1
  int num_sms;       // persistent grid size upper bound
  int force_direct_store;  // 1: never use the TMA-store epilogue (tests of the fallback path)
  // Split K (kernels/configs.py select_splits): 1 = none; > 1: each output tile is computed as up to
  // `splits` partial sums over K ranges, written (fp32, scaled) to `workspace`, then summed with the
  // bias into `out` by splitk_reduce. Configs 1, 2, 3, 7 and 10 only (their SPLIT kernel instances).
  int splits;
  float* workspace;  // [splits, M, N] fp32 when splits > 1, else unused
};

// Launches on `stream`. Returns nullptr on success, else a message naming what failed.
const char* gemm(const GemmArgs& args, cudaStream_t stream);

// out [M, N] (out_kind as GemmArgs) = sum over s of ws[s] ([splits, M, N] fp32) + bias (bias_kind as
// GemmArgs; nullptr: none), summed in split order (csrc/splitk_reduce.cu).
const char* splitk_reduce(const float* ws, int splits, int M, int N, const void* bias, int bias_kind, void* out,
                          int out_kind, cudaStream_t stream);

}  // namespace fp8sm90
