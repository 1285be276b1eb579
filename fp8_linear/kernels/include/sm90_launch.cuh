// Host side of the sm90 GEMM kernels: the launch of one kernel instance (persistent grid, dynamic
// shared memory, programmatic dependent launch) and the dispatch from a config id to its instances
// (sm90_configs.cuh, generated from fp8_linear/kernels/configs.py).
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#include "pdl.h"
#include "sm90_api.h"
#include "sm90_gemm.cuh"

namespace fp8sm90 {

struct LaunchArgs {
  CUtensorMap tma_a, tma_b, tma_out;
  int rows_a, rows_b, K;
  EpiParams ep;
  int config;
  int num_sms;
  int even_waves;  // 1: the fewest CTAs for the same number of waves (sm90_host.cu, even_waves)
  int blk;         // 1: fine-grained scales (ep.blk_sa / blk_sb): the BLK kernel instances
};

template <int BN, bool SWAP, int NACC, int FA, int FB, bool DBL = false, bool SPLIT = false, bool BLK = false,
          int BM = kBM>
const char* launch_one(const LaunchArgs& la, cudaStream_t stream) {
  using C = TileCfg<BN, SWAP, BLK, BM>;
  auto kernel = &fp8_gemm_sm90_kernel<BN, SWAP, NACC, FA, FB, DBL, SPLIT, BLK, BM>;
  // Once per instance and device (not on every launch: later calls, CUDA graph capture included, see
  // only the launch).
  static std::atomic<uint64_t> done_mask{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(C::kThreads, 1, 1);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream;
  // Programmatic dependent launch (pdl.h): the weight's first k-blocks are prefetched into L2 only
  // there, where the kernel's wait lets the prefetch overlap the previous kernel.
  cudaLaunchAttribute attrs[1];
  cfg.attrs = attrs;
  cfg.numAttrs = fp8pdl::launch_attrs(attrs);
  const int prefetch = fp8pdl::prefetch_kblocks();
  const int prefetch_kb = cfg.numAttrs == 0 ? 0 : prefetch < 0 ? C::kStages : prefetch;
  if (!(done_mask.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    if (const char* v = getenv("FP8_LINEAR_SM90_VERBOSE"); v != nullptr && v[0] == '1') {
      fprintf(stderr, "fp8_linear sm90: BM=%d BN=%d swap=%d nacc=%d dbl=%d split=%d blk=%d stages=%d smem=%d: grid up to %d CTAs\n",
              BM, BN, int(SWAP), NACC, int(DBL), int(SPLIT), int(BLK), C::kStages, C::kSmem, la.num_sms);
    }
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  // Persistent grid: at most one CTA per SM (tiles are walked in a loop).
  const int tiles = ((la.rows_a + BM - 1) / BM) * ((la.rows_b + BN - 1) / BN) * (SPLIT ? la.ep.splits : 1);
  int ctas = tiles < la.num_sms ? tiles : la.num_sms;
  if (la.even_waves && ctas > 0) {
    const int waves = (tiles + ctas - 1) / ctas;
    ctas = (tiles + waves - 1) / waves;
  }
  cfg.gridDim = dim3(ctas, 1, 1);
  e = cudaLaunchKernelEx(&cfg, kernel, la.tma_a, la.tma_b, la.tma_out, la.rows_a, la.rows_b, la.K, la.ep,
                         prefetch_kb);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace fp8sm90

#include "sm90_configs.cuh"  // launch_config<FA, FB> and config_info: the configs' instances
