// Plain C++ interface of the grouped (mixture-of-experts) sm90 FP8 GEMM between the torch binding
// (binding.cpp) and its kernel unit (csrc/sm90_grouped.cu). No torch headers, no device code.
#pragma once
#include <cuda_runtime_api.h>

namespace fp8sm90 {

// Experts per launch the kernel's shared-memory work list holds (sm90_grouped.cuh); more go elsewhere.
constexpr int kGroupedMaxExperts = 512;

// Token-tile widths of the grouped kernel (tokens on wgmma's N side): one instance each.
constexpr int kGroupedTiles[] = {16, 32, 64, 128};

struct GroupedArgs {
  // Tokens sorted by expert, [M, K] fp8, K-contiguous, row stride K; expert e owns rows
  // [offsets[e - 1], offsets[e]) (offsets[-1] = 0). Rows at or past offsets[E - 1] come out as zeros.
  const void* x;
  // Expert weights [E, N, K] fp8, each expert's [N, K] K-contiguous; w_expert_stride elements (bytes)
  // between two experts (N * K when contiguous; a multiple of 16).
  const void* w;
  long w_expert_stride;
  int M, N, K, E;
  int fmt_x, fmt_w;       // 0 = e4m3, 1 = e5m2
  const void* offsets;    // [E] cumulative row ends, on the device
  int offsets_64;         // 1: int64, 0: int32
  const float* scale_x;   // [1] or [M] (per token); block scales: [M, ceil(K/128)] M-major (1 x 128 groups)
  int scale_x_row;        // 0: [1], 1: [M]
  long scale_x_ld;        // block scales: elements between two k-blocks' columns of scale_x (>= M, % 4 == 0)
  const float* scale_w;   // [E] (per expert) or [E, N] (per expert and channel);
                          // block scales: [E, ceil(N/128), ceil(K/128)] contiguous (128 x 128 blocks)
  int scale_w_row;        // 0: [E], 1: [E, N]
  int scale_block;        // 1: block scales (scale_x groups, scale_w blocks), applied at each k-block's promotion
  const void* bias;       // nullptr or [E, N] contiguous
  int bias_kind;          // 0 none, 1 fp32, 2 bf16, 3 fp16
  void* out;              // [M, N] row-major
  int out_kind;           // 0 fp32, 1 bf16, 2 fp16
  int block_n;            // token tile width: one of kGroupedTiles
  int num_sms;            // persistent grid size
};

// Launches on `stream` (no host synchronisation: the offsets stay on the device). Returns nullptr on
// success, else a message naming what failed.
const char* grouped_gemm(const GroupedArgs& args, cudaStream_t stream);

}  // namespace fp8sm90
