// Host side of the sm90 GEMM kernels: the launch of one config (persistent grid, cluster attribute,
// dynamic shared memory), the dispatch from a config id to its kernel instance, and the config table
// (kernels/configs.py must match it).
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

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

// The kernel of a config: OVL selects the cross-tile pipelined consumers (config 9), which exist only for
// the non-swapped, single-CTA, two-accumulator case.
template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL, bool OVL, bool CARRY, bool SPLIT, bool BLK>
constexpr auto kernel_of() {
  if constexpr (OVL) {
    static_assert(!SWAP && NACC == 1 && CL == 1 && DBL && !CARRY && !BLK,
                  "OVL is config 7's layout with the pipeline across tiles");
    return &fp8_gemm_sm90_overlap_kernel<BN, FA, FB>;
  } else {
    return &fp8_gemm_sm90_kernel<BN, SWAP, NACC, CL, FA, FB, DBL, CARRY, SPLIT, BLK>;
  }
}

template <int BN, bool SWAP, int NACC, int CL, int FA, int FB, bool DBL = false, bool OVL = false,
          bool CARRY = false, bool SPLIT = false, bool BLK = false>
const char* launch_one(const LaunchArgs& la, cudaStream_t stream) {
  using C = TileCfg<BN, SWAP, BLK>;
  if constexpr (OVL) {
    // consumer_stream issues a tile's second k-block early: a one-k-block tile (K <= 128) runs config 7's
    // kernel instead (nothing to overlap there anyway).
    if (la.K <= kBK) return launch_one<BN, SWAP, NACC, CL, FA, FB, DBL, false>(la, stream);
  }
  if constexpr (CARRY) {
    // consumer_carry keeps each tile's first k-block in the first accumulator: an even number of
    // k-blocks per tile only; otherwise the base config's kernel (the same numbers, bit for bit).
    if (((la.K + kBK - 1) / kBK) % 2 != 0) return launch_one<BN, SWAP, NACC, CL, FA, FB, DBL, false, false>(la, stream);
  }
  auto kernel = kernel_of<BN, SWAP, NACC, CL, FA, FB, DBL, OVL, CARRY, SPLIT, BLK>();
  // Once per instance and device (not on every launch: later calls, CUDA graph capture included, see
  // only the launch).
  static std::atomic<uint64_t> done_mask{0};
  static std::atomic<int> max_clusters[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = CL > 1 ? 1 : 0;  // plain launch for single-CTA configs
  if (!(done_mask.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    // Persistent grid: one CTA per SM. For clusters the occupancy query is only reported (verbose):
    // a grid larger than what is co-resident is still correct (tiles are walked in a loop).
    const int n = la.num_sms / CL;
    int active = -1;
    if (CL > 1) {
      cfg.gridDim = dim3(la.num_sms / CL * CL, 1, 1);
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) != cudaSuccess) {
        active = -1;
        cudaGetLastError();
      }
    }
    max_clusters[dev & 63].store(n, std::memory_order_relaxed);
    if (const char* v = getenv("FP8_LINEAR_SM90_VERBOSE"); v != nullptr && v[0] == '1') {
      fprintf(stderr,
              "fp8_linear sm90: BN=%d swap=%d nacc=%d cluster=%d dbl=%d ovl=%d carry=%d split=%d blk=%d stages=%d "
              "smem=%d: grid up to %d clusters (occupancy query: %d)\n",
              BN, int(SWAP), NACC, CL, int(DBL), int(OVL), int(CARRY), int(SPLIT), int(BLK), C::kStages, C::kSmem, n,
              active);
    }
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int num_m = (la.rows_a + kBM - 1) / kBM;
  const int tiles = ((num_m + CL - 1) / CL) * ((la.rows_b + BN - 1) / BN) * (SPLIT ? la.ep.splits : 1);
  const int maxc = max_clusters[dev & 63].load(std::memory_order_relaxed);
  int clusters = tiles < maxc ? tiles : maxc;
  if (la.even_waves && clusters > 0) {
    const int waves = (tiles + clusters - 1) / clusters;
    clusters = (tiles + waves - 1) / waves;
  }
  cfg.gridDim = dim3(clusters * CL, 1, 1);
  e = cudaLaunchKernelEx(&cfg, kernel, la.tma_a, la.tma_b, la.tma_out, la.rows_a, la.rows_b, la.K, la.ep);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// The BLK instances (fine-grained scales): the configs that the selection can give a block-scaled
// launch (kernels/configs.py KernelConfig.block_scales), with split K where the config splits. Not
// config 10: its consumers at 240 registers have no room for the factors (nvcc 13.0: 76-176 bytes of
// spills with them loaded early or late, docs/kernel-log.md "Block scales").
template <int FA, int FB>
const char* launch_blk(const LaunchArgs& la, cudaStream_t stream, bool split) {
  constexpr bool B = true;  // BLK
  switch (la.config) {
    case 1: return split ? launch_one<16, true, 4, 1, FA, FB, false, false, false, true, B>(la, stream)
                         : launch_one<16, true, 4, 1, FA, FB, false, false, false, false, B>(la, stream);
    case 2: return split ? launch_one<32, true, 4, 1, FA, FB, false, false, false, true, B>(la, stream)
                         : launch_one<32, true, 4, 1, FA, FB, false, false, false, false, B>(la, stream);
    case 3: return split ? launch_one<64, true, 4, 1, FA, FB, false, false, false, true, B>(la, stream)
                         : launch_one<64, true, 4, 1, FA, FB, false, false, false, false, B>(la, stream);
    case 6: return launch_one<192, false, 1, 1, FA, FB, false, false, false, false, B>(la, stream);
    case 7: return split ? launch_one<128, false, 1, 1, FA, FB, true, false, false, true, B>(la, stream)
                         : launch_one<128, false, 1, 1, FA, FB, true, false, false, false, B>(la, stream);
    default: return "block scales are not supported by this config (only 1, 2, 3, 6, 7)";
  }
}

// Config table: see sm90_api.h / kernels/configs.py.
template <int FA, int FB>
const char* launch_fmt(const LaunchArgs& la, cudaStream_t stream) {
  // split K (ep.splits > 1; the host allows it only for config_splits_k): the SPLIT kernel instances
  const bool split = la.ep.splits > 1;
  if (la.blk) return launch_blk<FA, FB>(la, stream, split);
  switch (la.config) {
    case 0: return launch_one<128, false, 1, 1, FA, FB>(la, stream);
    case 1: return split ? launch_one<16, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<16, true, 4, 1, FA, FB>(la, stream);
    case 2: return split ? launch_one<32, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<32, true, 4, 1, FA, FB>(la, stream);
    case 3: return split ? launch_one<64, true, 4, 1, FA, FB, false, false, false, true>(la, stream)
                         : launch_one<64, true, 4, 1, FA, FB>(la, stream);
    case 4: return launch_one<128, false, 2, 1, FA, FB>(la, stream);
    case 5: return launch_one<128, false, 1, 2, FA, FB>(la, stream);
    case 6: return launch_one<192, false, 1, 1, FA, FB>(la, stream);
    case 7: return split ? launch_one<128, false, 1, 1, FA, FB, true, false, false, true>(la, stream)
                         : launch_one<128, false, 1, 1, FA, FB, true>(la, stream);
    case 8: return launch_one<128, false, 1, 2, FA, FB, true>(la, stream);
    case 9: return launch_one<128, false, 1, 1, FA, FB, true, true>(la, stream);
    case 10: return split ? launch_one<144, false, 1, 1, FA, FB, true, false, false, true>(la, stream)
                          : launch_one<144, false, 1, 1, FA, FB, true>(la, stream);
    case 11: return launch_one<144, false, 1, 2, FA, FB, true>(la, stream);
    case 12: return launch_one<128, false, 1, 1, FA, FB, true, false, true>(la, stream);
    case 13: return launch_one<144, false, 1, 1, FA, FB, true, false, true>(la, stream);
    case 14: return launch_one<128, true, 1, 1, FA, FB, true>(la, stream);
    case 15: return launch_one<144, true, 1, 1, FA, FB, true>(la, stream);
    default: return "unknown kernel config";
  }
}

// Configs with BLK kernel instances (kernels/configs.py: KernelConfig.block_scales; launch_blk).
inline bool config_block_scales(int config) {
  return config == 1 || config == 2 || config == 3 || config == 6 || config == 7;
}

// Configs with split-K kernel instances (kernels/configs.py: KernelConfig.split_k).
inline bool config_splits_k(int config) {
  static const bool kSplitK[kNumConfigs] = {false, true, true, true, false, false, false,
                                            true, false, false, true, false, false, false, false, false};
  return kSplitK[config];
}

// Tile width, operand order and cluster size of each config (host side).
inline void config_shape(int config, int& bn, bool& swap, int& cluster) {
  static const int kBN[kNumConfigs] = {128, 16, 32, 64, 128, 128, 192, 128, 128, 128, 144, 144, 128, 144, 128, 144};
  static const bool kSwap[kNumConfigs] = {false, true, true, true, false, false, false,
                                          false, false, false, false, false, false, false, true, true};
  static const int kCluster[kNumConfigs] = {1, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1, 1, 1, 1};
  bn = kBN[config];
  swap = kSwap[config];
  cluster = kCluster[config];
}

}  // namespace fp8sm90
