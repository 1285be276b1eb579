// Activation quantization to FP8 (static per-tensor, dynamic per-token, dynamic 1x128 groups): the
// formula of kernels/quant_triton.py in CUDA, so that FP8Linear's decode path quantizes and runs the
// GEMM in one host call (binding.cpp, linear_fwd). No torch headers.
//
// One CTA per row (static / per-token): a pass for the row's finite amax (per-token only), then a
// pass that divides (IEEE, __fdiv_rn), clamps and converts with cvt.rn.satfinite (round to nearest
// even; NaN stays NaN, exactly what Triton's fp_downcast_rounding="rtne" emits on sm_90). Rows whose
// start and stride are 16-byte aligned with K % 8 == 0 go 8 elements (one 8-byte store) at a time.
// Groups: one warp per 1x128 group, 4 elements per lane.
// Launched with programmatic dependent launch (pdl.h): each CTA lets the next kernel (the GEMM) launch
// at its start, then waits for the previous kernel before it reads x or writes q and the scales.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "act_quant.h"
#include "pdl.h"

namespace fp8act {
namespace {

constexpr int kVec = 8;           // elements per vector step (16 bytes of bf16/fp16)
constexpr int kMaxThreads = 256;  // threads per row CTA
constexpr int kWarp = 32;
constexpr int kGroupWarps = 4;    // warps (= groups in flight) per group CTA

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// |v| if finite, else 0 (inf / NaN do not count towards the amax).
__device__ __forceinline__ float finite_abs(float v) {
  const float a = fabsf(v);
  return a < __int_as_float(0x7f800000) ? a : 0.f;
}

// clamp(v / scale, -m, m) with IEEE division; NaN passes through.
__device__ __forceinline__ float scaled(float v, float scale, float m) {
  const float y = __fdiv_rn(v, scale);
  return isnan(y) ? y : fminf(fmaxf(y, -m), m);
}

// Two values to two FP8 bytes: `lo` in the low byte. cvt's first source goes to the high byte.
template <int FMT>
__device__ __forceinline__ uint16_t cvt2(float lo, float hi) {
  uint16_t r;
  if constexpr (FMT == 0) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// 8 consecutive elements (16-byte aligned) as fp32.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[kVec]) {
  static_assert(sizeof(T) == 2, "16-bit types");
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = to_f32(e[i]);
}
template <>
__device__ __forceinline__ void load8<float>(const float* p, float (&v)[kVec]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max over the CTA (values are >= 0 and never NaN); every thread gets the result.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[kMaxThreads / kWarp];
  __shared__ float total;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x / kWarp;
    float w = lane < nw ? part[lane] : 0.f;
    w = warp_max(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

// Static (scale given) or per-token (scale computed, written to s[row]) quantization of one row.
template <typename T, int FMT, int MODE, bool VEC>
__global__ void __launch_bounds__(kMaxThreads) quant_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ q,
                                                                 float* __restrict__ s, int64_t K, int64_t stride,
                                                                 float m, float min_scale) {
  fp8pdl::pdl_launch_dependents();
  fp8pdl::pdl_wait();  // x may be the previous kernel's output; q and s buffers it may still read
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride;
  uint8_t* qr = q + row * K;
  float scale;
  if constexpr (MODE == kStatic) {
    scale = __ldg(s);
  } else {
    float amax = 0.f;
    if constexpr (VEC) {
      for (int64_t c = threadIdx.x; c < K / kVec; c += blockDim.x) {
        float v[kVec];
        load8(xr + c * kVec, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, finite_abs(v[i]));
      }
    } else {
      for (int64_t k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, finite_abs(to_f32(xr[k])));
    }
    scale = fmaxf(__fdiv_rn(block_max(amax), m), min_scale);
    if (threadIdx.x == 0) s[row] = scale;
  }
  if constexpr (VEC) {
    for (int64_t c = threadIdx.x; c < K / kVec; c += blockDim.x) {
      float v[kVec];
      load8(xr + c * kVec, v);
      uint16_t b[kVec / 2];
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) b[i] = cvt2<FMT>(scaled(v[2 * i], scale, m), scaled(v[2 * i + 1], scale, m));
      uint2 packed;
      packed.x = uint32_t(b[0]) | (uint32_t(b[1]) << 16);
      packed.y = uint32_t(b[2]) | (uint32_t(b[3]) << 16);
      *reinterpret_cast<uint2*>(qr + c * kVec) = packed;
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
      qr[k] = static_cast<uint8_t>(cvt2<FMT>(scaled(to_f32(xr[k]), scale, m), 0.f) & 0xff);
  }
}

// Dynamic 1x128 groups: one warp per group, scales [rows, ceil(K/128)] M-major (element [row, g] at
// g * ld + row: the layout the sm90 GEMM reads by TMA).
template <typename T, int FMT>
__global__ void __launch_bounds__(kGroupWarps * kWarp) quant_groups_kernel(const T* __restrict__ x,
                                                                           uint8_t* __restrict__ q,
                                                                           float* __restrict__ s, int64_t ld,
                                                                           int64_t K, int64_t stride, float m,
                                                                           float min_scale) {
  fp8pdl::pdl_launch_dependents();
  fp8pdl::pdl_wait();  // as in quant_rows_kernel
  constexpr int kPerLane = kGroupSize / kWarp;
  const int64_t row = blockIdx.x;
  const int64_t groups = (K + kGroupSize - 1) / kGroupSize;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + row * stride;
  uint8_t* qr = q + row * K;
  for (int64_t g = blockIdx.y * kGroupWarps + threadIdx.x / kWarp; g < groups; g += int64_t(gridDim.y) * kGroupWarps) {
    float v[kPerLane];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t k = g * kGroupSize + i * kWarp + lane;
      v[i] = k < K ? to_f32(xr[k]) : 0.f;
      amax = fmaxf(amax, finite_abs(v[i]));
    }
    const float scale = fmaxf(__fdiv_rn(warp_max(amax), m), min_scale);
    if (lane == 0) s[g * ld + row] = scale;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t k = g * kGroupSize + i * kWarp + lane;
      if (k < K) qr[k] = static_cast<uint8_t>(cvt2<FMT>(scaled(v[i], scale, m), 0.f) & 0xff);
    }
  }
}

int round_threads(int64_t work) {
  int64_t t = ((work + kWarp - 1) / kWarp) * kWarp;
  if (t < kWarp) t = kWarp;
  if (t > kMaxThreads) t = kMaxThreads;
  return static_cast<int>(t);
}

template <typename T, int FMT>
const char* launch_typed(const ActQuantArgs& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  uint8_t* q = static_cast<uint8_t*>(a.q);
  if (a.mode == kGroup) {
    const int64_t groups = (a.K + kGroupSize - 1) / kGroupSize;
    const int64_t gy = (groups + kGroupWarps - 1) / kGroupWarps;
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(gy < 65535 ? gy : 65535));
    const cudaError_t e = fp8pdl::launch(quant_groups_kernel<T, FMT>, grid, dim3(kGroupWarps * kWarp), stream, x, q,
                                         a.scale, a.scale_ld, a.K, a.row_stride, a.fmt_max, a.min_scale);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  } else {
    const bool vec = a.K % kVec == 0 && (reinterpret_cast<uintptr_t>(a.x) % 16) == 0 &&
                     (a.row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(a.q) % 8) == 0;
    const int threads = round_threads(vec ? a.K / kVec : a.K);
    const unsigned grid = static_cast<unsigned>(a.rows);
    auto kernel = a.mode == kStatic
                      ? (vec ? quant_rows_kernel<T, FMT, kStatic, true> : quant_rows_kernel<T, FMT, kStatic, false>)
                      : (vec ? quant_rows_kernel<T, FMT, kToken, true> : quant_rows_kernel<T, FMT, kToken, false>);
    const cudaError_t e = fp8pdl::launch(kernel, dim3(grid), dim3(threads), stream, x, q, a.scale, a.K, a.row_stride,
                                         a.fmt_max, a.min_scale);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
const char* launch_fmt(const ActQuantArgs& a, cudaStream_t stream) {
  if (a.fmt == 0) return launch_typed<T, 0>(a, stream);
  if (a.fmt == 1) return launch_typed<T, 1>(a, stream);
  return "act_quant: unknown fp8 format code (expected 0 = e4m3 or 1 = e5m2)";
}

}  // namespace

const char* act_quant(const ActQuantArgs& a, cudaStream_t stream) {
  if (a.mode != kStatic && a.mode != kToken && a.mode != kGroup) return "act_quant: unknown mode (expected 0, 1 or 2)";
  if (a.rows < 0 || a.K < 0) return "act_quant: negative size";
  if (a.rows == 0 || a.K == 0) return nullptr;
  if (a.rows > 0x7fffffff) return "act_quant: more than 2**31 - 1 rows";
  if (a.scale == nullptr) return "act_quant: scale pointer is null";
  switch (a.x_kind) {
    case kF32: return launch_fmt<float>(a, stream);
    case kBF16: return launch_fmt<__nv_bfloat16>(a, stream);
    case kF16: return launch_fmt<__half>(a, stream);
    default: return "act_quant: unknown input kind (expected 0 = fp32, 1 = bf16, 2 = fp16)";
  }
}

}  // namespace fp8act
