// Host side of the grouped (mixture-of-experts) sm90 FP8 GEMM (include/sm90_grouped.cuh): the tensor
// maps (weights 3-D {K, N, E}, tokens 2-D {K, M}, block-scaled tokens' scales 2-D {M, ceil(K/128)}), the
// persistent grid and the kernel instances (4 tile widths x 4 format pairs x plain / block scales).
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>

#include "sm90_driver.h"
#include "sm90_grouped.cuh"

namespace fp8sm90 {
namespace {

// A K-contiguous fp8 operand of `rank` 2 ({K, rows}) or 3 ({K, rows, experts}); strides in bytes of
// dims 1.. ; box 128 (K) x box_rows (x 1); 128-byte swizzle; out-of-bounds reads are zeros.
const char* encode_fp8(CUtensorMap* map, const void* ptr, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                       int box_rows, const char* what) {
  auto fn = encode_fn();
  if (fn == nullptr) return "cuTensorMapEncodeTiled not found through cudaGetDriverEntryPointByVersion";
  cuuint32_t box[3] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows), 1};
  cuuint32_t estr[3] = {1, 1, 1};
  CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(ptr), dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return nullptr;
  thread_local char msg[256];
  snprintf(msg, sizeof(msg), "grouped: cuTensorMapEncodeTiled failed (CUresult %d) for the %s (ptr %p)",
           static_cast<int>(r), what, ptr);
  return msg;
}

// The M-major block scales of the tokens, scale_x [M, kbn] (element [m, kb] at kb * ld + m): fp32 map
// {M, kbn}, box box_rows x 1 (one k-block's scales of a token tile from the 16-byte aligned row before
// it: grouped_sx_box), no swizzle; tokens past M read as zero.
const char* encode_scales(CUtensorMap* map, const float* ptr, int M, int kbn, long ld, int box_rows) {
  auto fn = encode_fn();
  if (fn == nullptr) return "cuTensorMapEncodeTiled not found through cudaGetDriverEntryPointByVersion";
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(kbn)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 4};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t estr[2] = {1, 1};
  CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(ptr), dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return nullptr;
  thread_local char msg[256];
  snprintf(msg, sizeof(msg), "grouped: cuTensorMapEncodeTiled failed (CUresult %d) for scale_x: ptr %p M %d kb %d ld %ld",
           static_cast<int>(r), static_cast<const void*>(ptr), M, kbn, ld);
  return msg;
}

struct GroupedLaunch {
  CUtensorMap tma_w, tma_x, tma_sx;  // tma_sx: block scales only (zeros otherwise, never read)
  GroupedParams p;
  int ctas;
};

template <int BN, int NACC, int FW, int FX, bool DBL, bool BLK>
const char* launch_grouped(const GroupedLaunch& gl, cudaStream_t stream) {
  using C = GroupedCfg<BN, BLK>;
  auto kernel = &fp8_grouped_sm90_kernel<BN, NACC, FW, FX, DBL, BLK>;
  static std::atomic<uint64_t> done_mask{0};  // cudaFuncSetAttribute once per instance and device
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(done_mask.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(gl.ctas, 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream;
  e = cudaLaunchKernelEx(&cfg, kernel, gl.tma_w, gl.tma_x, gl.tma_sx, gl.p);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Block scales (BLK): BN = 128 runs one accumulator without mainloop_double (registers: sm90_grouped.cuh).
template <int FW, int FX, bool BLK>
const char* launch_tile(const GroupedLaunch& gl, int block_n, cudaStream_t stream) {
  switch (block_n) {
    case 16: return launch_grouped<16, 4, FW, FX, false, BLK>(gl, stream);
    case 32: return launch_grouped<32, 4, FW, FX, false, BLK>(gl, stream);
    case 64: return launch_grouped<64, 4, FW, FX, false, BLK>(gl, stream);
    case 128: return launch_grouped<128, 1, FW, FX, !BLK, BLK>(gl, stream);
    default: return "grouped: block_n must be 16, 32, 64 or 128";
  }
}

template <int FW, int FX>
const char* launch_fmt(const GroupedLaunch& gl, int block_n, bool blk, cudaStream_t stream) {
  return blk ? launch_tile<FW, FX, true>(gl, block_n, stream) : launch_tile<FW, FX, false>(gl, block_n, stream);
}

}  // namespace

const char* grouped_gemm(const GroupedArgs& g, cudaStream_t stream) {
  if (g.M <= 0 || g.N <= 0 || g.K <= 0 || g.E <= 0) return "grouped: empty problem";
  if (g.E > kGroupedMaxExperts) return "grouped: more experts than kGroupedMaxExperts";
  if (g.K % 16 != 0) return "grouped: K must be a multiple of 16";
  if (g.w_expert_stride % 16 != 0) return "grouped: the experts' weight stride must be a multiple of 16 bytes";
  if ((reinterpret_cast<uintptr_t>(g.x) | reinterpret_cast<uintptr_t>(g.w)) % 16 != 0)
    return "grouped: operand pointers must be 16-byte aligned";
  if (const char* e = ensure_context()) return e;  // the driver call below needs a current context
  // CUtensorMap needs 64-byte alignment: heap (C++17 aligned new), not the stack
  std::unique_ptr<GroupedLaunch> holder(new GroupedLaunch{});
  GroupedLaunch& gl = *holder;
  {
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(g.K), static_cast<cuuint64_t>(g.N),
                                static_cast<cuuint64_t>(g.E)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(g.K), static_cast<cuuint64_t>(g.w_expert_stride)};
    if (const char* e = encode_fp8(&gl.tma_w, g.w, 3, dims, strides, kBM, "weights")) return e;
  }
  {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(g.K), static_cast<cuuint64_t>(g.M)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(g.K)};
    if (const char* e = encode_fp8(&gl.tma_x, g.x, 2, dims, strides, g.block_n, "tokens")) return e;
  }
  GroupedParams& p = gl.p;
  p.offsets = g.offsets;
  p.offsets_64 = g.offsets_64;
  p.M = g.M;
  p.N = g.N;
  p.K = g.K;
  p.E = g.E;
  p.sx = g.scale_x;
  p.sx_row = g.scale_x_row;
  p.sw = g.scale_w;
  p.sw_row = g.scale_w_row;
  p.bias = g.bias;
  p.bias_kind = g.bias ? g.bias_kind : 0;
  p.out = g.out;
  p.out_kind = g.out_kind;
  const long kbn = (g.K + kBK - 1) / kBK;
  p.kbn = static_cast<int>(kbn);
  const bool blk = g.scale_block != 0;
  if (blk) {
    if (static_cast<long>(g.M) * kbn >= (1L << 31) || static_cast<long>(g.E) * ((g.N + kBM - 1) / kBM) * kbn >= (1L << 31))
      return "grouped: block scales: M x ceil(K/128) and E x ceil(N/128) x ceil(K/128) must be below 2^31";
    if (g.scale_x_ld < g.M || g.scale_x_ld % 4 != 0 || reinterpret_cast<uintptr_t>(g.scale_x) % 16 != 0)
      return "grouped: block scales: scale_x must be M-major with a leading dimension >= M, a multiple of 4, 16-byte aligned";
    if (const char* e = encode_scales(&gl.tma_sx, g.scale_x, g.M, p.kbn, g.scale_x_ld, grouped_sx_box(g.block_n)))
      return e;
  }
  // an upper bound of the work items without reading the offsets: every expert with tokens adds at most
  // one partial token block
  const long num_nb = (g.N + kBM - 1) / kBM;
  const long bound = ((g.M + g.block_n - 1) / g.block_n + (g.E < g.M ? g.E : g.M)) * num_nb;
  const int sms = g.num_sms > 0 ? g.num_sms : 132;
  gl.ctas = bound < sms ? static_cast<int>(bound) : sms;
  const int fw = g.fmt_w, fx = g.fmt_x;
  if (fw == 0 && fx == 0) return launch_fmt<0, 0>(gl, g.block_n, blk, stream);
  if (fw == 0 && fx == 1) return launch_fmt<0, 1>(gl, g.block_n, blk, stream);
  if (fw == 1 && fx == 0) return launch_fmt<1, 0>(gl, g.block_n, blk, stream);
  if (fw == 1 && fx == 1) return launch_fmt<1, 1>(gl, g.block_n, blk, stream);
  return "grouped: unknown fp8 format code";
}

}  // namespace fp8sm90
