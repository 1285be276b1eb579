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
          int BM = kBM, int CL = 1>
const char* launch_one(const LaunchArgs& la, cudaStream_t stream) {
  using C = TileCfg<BN, SWAP, BLK, BM>;
  auto kernel = &fp8_gemm_sm90_kernel<BN, SWAP, NACC, FA, FB, DBL, SPLIT, BLK, BM, CL>;
  // CL-CTA clusters (the decode tiles that multicast the weight tile): at most this many co-resident,
  // asked once per instance and device (cudaOccupancyMaxActiveClusters; a larger grid is still correct,
  // its clusters run in turn)
  static std::atomic<int> max_clusters[64];
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
  cudaLaunchAttribute attrs[2];
  cfg.attrs = attrs;
  cfg.numAttrs = fp8pdl::launch_attrs(attrs);
  const int prefetch = fp8pdl::prefetch_kblocks();
  const int prefetch_kb = cfg.numAttrs == 0 ? 0 : prefetch < 0 ? C::kStages : prefetch;
  if constexpr (CL > 1) {
    cudaLaunchAttribute& c = attrs[cfg.numAttrs++];
    c.id = cudaLaunchAttributeClusterDimension;
    c.val.clusterDim.x = CL;
    c.val.clusterDim.y = 1;
    c.val.clusterDim.z = 1;
  }
  if (!(done_mask.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    int active = la.num_sms / CL;
    if constexpr (CL > 1) {
      cfg.gridDim = dim3(la.num_sms / CL * CL, 1, 1);
      int q = 0;
      if (cudaOccupancyMaxActiveClusters(&q, kernel, &cfg) == cudaSuccess && q > 0) active = q < active ? q : active;
      else cudaGetLastError();
    }
    max_clusters[dev & 63].store(active, std::memory_order_relaxed);
    if (const char* v = getenv("FP8_LINEAR_SM90_VERBOSE"); v != nullptr && v[0] == '1') {
      fprintf(stderr, "fp8_linear sm90: BM=%d BN=%d swap=%d nacc=%d dbl=%d split=%d blk=%d cluster=%d stages=%d smem=%d: "
              "grid up to %d CTAs\n", BM, BN, int(SWAP), NACC, int(DBL), int(SPLIT), int(BLK), CL, C::kStages, C::kSmem,
              active * CL);
    }
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  // Persistent grid: at most one CTA per SM (work items are walked in a loop); with clusters, at most the
  // co-resident clusters, each taking a row block x a group of CL token tiles per item.
  const int groups = ((la.rows_b + BN - 1) / BN + CL - 1) / CL;
  const int tiles = ((la.rows_a + BM - 1) / BM) * groups * (SPLIT ? la.ep.splits : 1);
  const int slots = CL > 1 ? max_clusters[dev & 63].load(std::memory_order_relaxed) : la.num_sms;
  int ctas = tiles < slots ? tiles : slots;
  if (la.even_waves && ctas > 0) {
    const int waves = (tiles + ctas - 1) / ctas;
    ctas = (tiles + waves - 1) / waves;
  }
  cfg.gridDim = dim3(ctas * CL, 1, 1);
  e = cudaLaunchKernelEx(&cfg, kernel, la.tma_a, la.tma_b, la.tma_out, la.rows_a, la.rows_b, la.K, la.ep,
                         prefetch_kb);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace fp8sm90

#include "sm90_configs.cuh"  // launch_config<FA, FB> and config_info: the configs' instances
