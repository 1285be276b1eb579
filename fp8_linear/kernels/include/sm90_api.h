// Plain C++ interface between the torch binding (binding.cpp) and the kernel units (csrc/*.cu).
// No torch headers here, no CUDA device code.
#pragma once
#include <cuda_runtime_api.h>

namespace fp8sm90 {

// Kernel configurations: fp8_linear/kernels/configs.py CONFIGS, the one table (its C++ side, the kernel instances
// of each config id, is generated into sm90_configs.cuh by fp8_linear/kernels/jit/_gen_configs.py).

struct GemmArgs {
  const void* a;  // [M, K] fp8, K-contiguous
  const void* b;  // [N, K] fp8, K-contiguous
  int M, N, K;
  int fmt_a, fmt_b;  // 0 = e4m3, 1 = e5m2
  const float* scale_a;
  int scale_a_row;  // 0: [1], 1: [M, 1]
  const float* scale_b;
  int scale_b_row;  // 0: [1], 1: [N, 1]
  // 1: fine-grained scales, scale_a [M, ceil(K/128)] (1 x 128 activation groups) M-major (element
  // [m, kb] at kb * scale_a_ld + m; scale_a_ld >= M, a multiple of 4, the pointer 16-byte aligned: TMA
  // reads it) and scale_b [ceil(N/128), ceil(K/128)] (128 x 128 weight blocks) row-major, fp32, applied
  // at each k-block's promotion (sm90_blockscale.cuh); scale_a_row / scale_b_row are then ignored. Only
  // configs with BLK kernel instances (fp8_linear/kernels/configs.py block_scales).
  int scale_block;
  long scale_a_ld;
  const void* bias;  // nullptr or [N]
  int bias_kind;     // 0 none, 1 fp32, 2 bf16, 3 fp16
  void* out;         // [M, N], row-major
  int out_kind;      // 0 fp32, 1 bf16, 2 fp16
  int config;        // a config id of fp8_linear/kernels/configs.py CONFIGS
  int num_sms;       // persistent grid size upper bound
  int force_direct_store;  // 1: never use the TMA-store epilogue (tests of the fallback path)
  // Split K (fp8_linear/kernels/configs.py select_splits): 1 = none; > 1: each output tile is computed as up to
  // `splits` partial sums over K ranges in one launch, the raw fp32 partials in `workspace`, summed in
  // split order by the tile's last split, which then runs the epilogue (sm90_epilogue.cuh split_fixup).
  // Only configs with SPLIT kernel instances (fp8_linear/kernels/configs.py split_k).
  int splits;
  float* workspace;       // split_workspace_floats(config, M, N, K, splits) fp32 when splits > 1, else unused
  long workspace_floats;  // its size
};

// Launches on `stream`. Returns nullptr on success, else a message naming what failed.
const char* gemm(const GemmArgs& args, cudaStream_t stream);

// Floats of the split-K workspace that gemm needs for this problem (tiles x splits x the tile's rows x
// columns, splits as gemm runs them); 0 when it would not split; -1 for an unknown config.
long split_workspace_floats(int config, int M, int N, int K, int splits);

}  // namespace fp8sm90
