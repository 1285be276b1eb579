// Activation quantization to FP8 (static per-tensor, dynamic per-token, dynamic 1x128 groups): the
// formula of fp8_linear/kernels/quant_triton.py in CUDA, so that FP8Linear's decode path quantizes and runs the
// GEMM in one host call (binding.cpp, linear_fwd). No torch headers.
//
// Static / per-token (quant_rows_kernel): every thread loads all of its elements of a span (NV slots of
// 8, template NV) before it converts or stores any, so a span costs one memory round trip (docs/kernel-log.md,
// act_quant v2). Static rows are spread over ceil(K / span) CTAs (no cross-CTA dependency: small M
// gets many CTAs of one load a thread). Per-token rows of K > 4096 at M <= 512 are split over a
// thread-block cluster of 2, 4 or 8 CTAs (quant_token_cluster_kernel, act_quant v3): each CTA holds
// its part in registers, the CTAs' amaxes meet in distributed shared memory, and each converts its part
// (plan: include/act_quant_plan.h). Other per-token rows stay in one CTA with the row held in registers
// (one read of x: the finite amax, the scale, then the conversion from the registers); rows longer than
// a span (K > 32768 for 16-bit inputs) take an amax pass and a converting pass, span by span.
// Conversion: divide (the IEEE fp32 quotient, computed through one fp64 reciprocal a thread: see
// `scaled`), clamp and convert with cvt.rn.satfinite (round to nearest even; NaN stays NaN, exactly
// what Triton's fp_downcast_rounding="rtne" emits on sm_90). Rows whose
// start and stride are 16-byte aligned with K % 8 == 0 go 8 elements (one 16-byte load, one 8-byte
// store) a slot; other rows element by element (coalesced scalar loads, also all issued first).
// Groups: one warp per 1x128 group, 4 elements per lane.
// Launched with programmatic dependent launch (pdl.h): each CTA lets the next kernel (the GEMM) launch
// at its start, then waits for the previous kernel before it reads x or writes q and the scales.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "act_quant.h"
#include "act_quant_plan.h"
#include "pdl.h"
#include "sm90_ptx.cuh"  // smem_u32 and the mbarrier wrappers

namespace fp8act {
namespace {
using fp8sm90::fence_mbar_init;
using fp8sm90::mbar_arrive_expect_tx;
using fp8sm90::mbar_init;
using fp8sm90::smem_u32;

constexpr int kGroupWarps = 4;    // warps (= groups in flight) per group CTA
constexpr int64_t kMaxGridY = 65535;
// Row kernels (static / per-token): slots of kVec elements a thread holds in registers (template NV).
constexpr int kMaxSlotsVec16 = 16;  // 16-bit inputs: 16 16-byte loads, 64 registers (a row of K <= 32768 in one CTA)
constexpr int kMaxSlotsVec32 = 4;   // fp32 inputs: 4 x 32 bytes, 32 registers (K <= 8192)
constexpr int kScalarSlots = 4;     // scalar path (K % 8 != 0 or unaligned rows): 32 elements a thread
constexpr int kRowCtasPerSm = 2;  // register cap of the row kernels (launch bounds): 2 CTAs of 256 threads an SM

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// |v| if finite, else 0 (inf / NaN do not count towards the amax).
__device__ __forceinline__ float finite_abs(float v) {
  const float a = fabsf(v);
  return a < __int_as_float(0x7f800000) ? a : 0.f;
}

// clamp(v / scale, -m, m), NaN through, v / scale rounded as the IEEE fp32 division (__fdiv_rn) would,
// computed as RN32(RN64(v * RN64(1 / scale))) with the reciprocal once a thread: __fdiv_rn is, per
// element, MUFU.RCP, five dependent FFMAs and a slow-path check in its own branch region (~90 cycles of
// latency an element, docs/kernel-log.md act_quant v3); here two conversions and one DMUL, independent
// across elements. Exact: for fp32 a, b the relative error of the double product is below 2^-52, and
// a / b is never within 2^-49 (relative) of a midpoint of fp32 numbers unless it is one: a / b = m with
// m = M 2^e (M odd, 25 bits in the normal range) needs a's odd part A = M x b's odd part >= 2^24 > A.
// So both round to the same fp32 for |a / b| >= 2^-126; below, in the fp32 subnormals, they may differ
// by one subnormal step at an exact tie, and both convert to +-0 in e4m3 / e5m2 (smallest subnormals
// 2^-9 / 2^-16). Zeros, infinities and NaN (canonical) follow IEEE the same way in both.
struct Scaler {
  double rinv;  // RN64(1 / scale)
  float m;      // fmt_max
};
__device__ __forceinline__ Scaler make_scaler(float scale, float m) { return Scaler{1.0 / static_cast<double>(scale), m}; }
__device__ __forceinline__ float scaled(float v, const Scaler& s) {
  const float y = __double2float_rn(__dmul_rn(static_cast<double>(v), s.rinv));
  return isnan(y) ? y : fminf(fmaxf(y, -s.m), s.m);
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

// The slots of one thread in the span [k0, k1) of a row, each kVec elements, all loaded before the
// first is used (so a thread's loads are in flight together: one memory round trip per span, not one
// per 8 elements). Thread t of an nt-thread CTA owns, in slot j:
//   vector path: the kVec consecutive elements from k0 + kVec (j nt + t) (one 16-byte load; two for fp32);
//   scalar path: element i at k0 + (j kVec + i) nt + t (coalesced 2- or 4-byte loads).
// Elements at or past k1 are not loaded and read as 0 (no effect on an amax of |x| >= 0).
template <typename T, bool VEC, int NV>
struct Slots {
  static constexpr int kLoadsPerSlot = VEC ? int(sizeof(T)) / 2 : kVec;  // 16-byte words, or elements
  using Raw = typename std::conditional<VEC, uint4, float>::type;
  Raw raw[NV * kLoadsPerSlot];

  // Items of this thread in a span of `len` elements (slots on the vector path, elements on the scalar
  // path, nt apart): item n is there when n * nt < rem(len).
  static __device__ __forceinline__ int rem(int len) { return (VEC ? len / kVec : len) - int(threadIdx.x); }

  __device__ __forceinline__ void load(const T* xr, int64_t k0, int len) {
    const int t = threadIdx.x, nt = blockDim.x, r = rem(len);
    if constexpr (VEC) {
      const uint4* p = reinterpret_cast<const uint4*>(xr + k0) + t * kLoadsPerSlot;
#pragma unroll
      for (int j = 0; j < NV; ++j)
#pragma unroll
        for (int w = 0; w < kLoadsPerSlot; ++w)
          raw[j * kLoadsPerSlot + w] = j * nt < r ? __ldg(p + (j * nt) * kLoadsPerSlot + w) : make_uint4(0, 0, 0, 0);
    } else {
      const T* p = xr + k0 + t;
#pragma unroll
      for (int i = 0; i < NV * kVec; ++i) raw[i] = i * nt < r ? to_f32(p[i * nt]) : 0.f;
    }
  }

  // Slot j as fp32.
  __device__ __forceinline__ void unpack(int j, float (&v)[kVec]) const {
    if constexpr (!VEC) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = raw[j * kVec + i];
    } else if constexpr (sizeof(T) == 4) {
      const uint4 a = raw[2 * j], b = raw[2 * j + 1];
      v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y); v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);
      v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y); v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);
    } else {
      const T* e = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = to_f32(e[i]);
    }
  }

  // This thread's finite amax over its slots. 16-bit vectors: on the bits, two lanes a word (|x| is
  // x & 0x7fff, finite below the infinity pattern, and non-negative IEEE values order as their bits), then
  // converted: the same value as the fp32 max, without fp32 copies of the slots that would stay live until
  // store() (they cost registers).
  __device__ __forceinline__ float amax() const {
    if constexpr (VEC && sizeof(T) == 2) {
      constexpr unsigned kInf2 = std::is_same<T, __half>::value ? 0x7c007c00u : 0x7f807f80u;
      unsigned a2 = 0;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const unsigned w[4] = {raw[j].x, raw[j].y, raw[j].z, raw[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const unsigned mag = w[i] & 0x7fff7fffu;
          a2 = __vmaxu2(a2, mag & __vcmpltu2(mag, kInf2));
        }
      }
      const unsigned short bits = static_cast<unsigned short>(max(a2 & 0xffffu, a2 >> 16));
      if constexpr (std::is_same<T, __half>::value) {
        return __half2float(__ushort_as_half(bits));
      } else {
        return __bfloat162float(__ushort_as_bfloat16(bits));
      }
    } else {
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        float v[kVec];
        unpack(j, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) a = fmaxf(a, finite_abs(v[i]));
      }
      return a;
    }
  }

  // q[k] = fp8(clamp(x[k] / scale, -m, m)) for this thread's elements of the span at k0.
  template <int FMT>
  __device__ __forceinline__ void store(uint8_t* qr, int64_t k0, int len, float scale, float m) const {
    const int t = threadIdx.x, nt = blockDim.x, r = rem(len);
    const Scaler sc = make_scaler(scale, m);
    if constexpr (VEC) {
      uint2* p = reinterpret_cast<uint2*>(qr + k0) + t;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        if (j * nt < r) {
          float v[kVec];
          unpack(j, v);
          uint16_t b[kVec / 2];
#pragma unroll
          for (int i = 0; i < kVec / 2; ++i) b[i] = cvt2<FMT>(scaled(v[2 * i], sc), scaled(v[2 * i + 1], sc));
          uint2 packed;
          packed.x = uint32_t(b[0]) | (uint32_t(b[1]) << 16);
          packed.y = uint32_t(b[2]) | (uint32_t(b[3]) << 16);
          p[j * nt] = packed;
        }
      }
    } else {
      uint8_t* p = qr + k0 + t;
#pragma unroll
      for (int i = 0; i < NV * kVec; ++i)
        if (i * nt < r) p[i * nt] = static_cast<uint8_t>(cvt2<FMT>(scaled(raw[i], sc), 0.f) & 0xff);
    }
  }
};

// Static (scale given) or per-token (scale computed, written to s[row]) quantization: CTA
// (blockIdx.x, blockIdx.y) handles span blockIdx.y of row blockIdx.x, a span being blockDim.x * kVec * NV
// elements.
// - static: any number of spans per row (gridDim.y of them), each loaded, converted and stored once;
// - per-token, RESIDENT: one span holds the whole row (gridDim.y = 1): loaded once into registers,
//   amax, scale, then converted from the registers;
// - per-token, not RESIDENT (rows longer than a span): an amax pass and a converting pass over the
//   row's spans (gridDim.y = 1), each span's loads in flight together.
template <typename T, int FMT, int MODE, bool VEC, int NV, bool RESIDENT>
__global__ void __launch_bounds__(kMaxThreads, kRowCtasPerSm) quant_rows_kernel(const T* __restrict__ x, uint8_t* __restrict__ q,
                                                                 float* __restrict__ s, int64_t K, int64_t stride,
                                                                 float m, float min_scale) {
  fp8pdl::pdl_launch_dependents();
  fp8pdl::pdl_wait();  // x may be the previous kernel's output; q and s buffers it may still read
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride;
  uint8_t* qr = q + row * K;
  const int span = blockDim.x * kVec * NV;  // host: K < 2**31
  Slots<T, VEC, NV> v;
  if constexpr (MODE == kStatic) {
    const int64_t k0 = int64_t(blockIdx.y) * span;
    const int len = static_cast<int>(K - k0 < span ? K - k0 : span);
    v.load(xr, k0, len);
    const float scale = __ldg(s);
    v.template store<FMT>(qr, k0, len, scale, m);
  } else if constexpr (RESIDENT) {
    v.load(xr, 0, static_cast<int>(K));
    const float scale = fmaxf(__fdiv_rn(block_max(v.amax()), m), min_scale);
    if (threadIdx.x == 0) s[row] = scale;
    v.template store<FMT>(qr, 0, static_cast<int>(K), scale, m);
  } else {
    float amax = 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += span) {
      v.load(xr, k0, static_cast<int>(K - k0 < span ? K - k0 : span));
      amax = fmaxf(amax, v.amax());
    }
    const float scale = fmaxf(__fdiv_rn(block_max(amax), m), min_scale);
    if (threadIdx.x == 0) s[row] = scale;
    for (int64_t k0 = 0; k0 < K; k0 += span) {
      const int len = static_cast<int>(K - k0 < span ? K - k0 : span);
      v.load(xr, k0, len);
      v.template store<FMT>(qr, k0, len, scale, m);
    }
  }
}

// Thread-block cluster primitives (sm_90): the split arrive / wait of the cluster barrier (arrive
// .release orders this thread's earlier shared::cluster stores before the peers' wait .acquire; in SASS
// a MEMBAR.ALL.GPU), the cluster's size and this CTA's rank, a peer CTA's shared-memory address of a
// variable of this CTA (mapa), and a one-shot mbarrier that the peers' st.async stores complete (init,
// the expected bytes, the parity-0 wait with cluster-scope acquire as in the st.async example of
// libcudacxx's PTX docs; no fence on the sending side: the mbarrier carries the stores' completion).
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned cluster_ctas() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned peer_addr(const void* local, unsigned peer) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(local)), "r"(peer));
  return remote;
}
// One thread, before the cluster barrier's arrive that the peers wait on before their first st.async.
__device__ __forceinline__ void mbar_init_expect(uint64_t* bar, unsigned bytes) {
  mbar_init(bar, 1);
  fence_mbar_init();
  mbar_arrive_expect_tx(bar, bytes);
}
__device__ __forceinline__ void mbar_wait_phase0(uint64_t* bar) {
  asm volatile(
      "{\n.reg .pred done;\nAQ_WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra AQ_WAIT_%=;\n}" ::"r"(smem_u32(bar))
      : "memory");
}

// Per-token rows split over a cluster (act_quant_plan.h, plan_token_cluster): CTA (blockIdx.x,
// blockIdx.y) of a (1, spans, 1) cluster holds the `span` elements of row blockIdx.x from
// blockIdx.y * span (fewer in the last) in registers, NV slots a thread (vector path only). The row's
// amax: each CTA's block max goes into slot [rank] of every CTA's `peer_amax` (distributed shared
// memory); every CTA then takes the max of the cluster's slots (a max: the same value in every CTA, in
// any order), computes the scale as quant_rows_kernel does and converts its span. Cluster CTA 0 writes
// s[row]. A cluster barrier phase (arrive at the start, wait before the remote stores) makes sure every
// peer has started (and, ASYNC, initialised its mbarrier) before its shared memory is written. Then:
// - ASYNC: st.async stores, each completing 4 bytes of the receiver's mbarrier, which expects 4 x spans;
//   a CTA reads its slots once its mbarrier's phase completes;
// - else: plain shared::cluster stores and a second cluster barrier phase (release / acquire).
// Either way a CTA has received every peer's store before it goes on, so none exits while another still
// writes its shared memory.
template <typename T, int FMT, int NV, bool ASYNC>
__global__ void __launch_bounds__(kClusterMaxThreads, 1) quant_token_cluster_kernel(const T* __restrict__ x, uint8_t* __restrict__ q,
                                                                                   float* __restrict__ s, int64_t K, int64_t stride,
                                                                                   int64_t span, float m, float min_scale) {
  __shared__ float part[kClusterMaxThreads / kWarp];
  __shared__ float peer_amax[kMaxCluster];
  __shared__ uint64_t peer_bar;
  const int nc = static_cast<int>(cluster_ctas());
  if constexpr (ASYNC) {
    if (threadIdx.x == 0) mbar_init_expect(&peer_bar, 4u * nc);
  }
  cluster_arrive_relaxed();  // this CTA runs: peers may write its peer_amax after their wait
  fp8pdl::pdl_launch_dependents();
  fp8pdl::pdl_wait();  // as in quant_rows_kernel
  const int64_t row = blockIdx.x;
  const int64_t k0 = int64_t(blockIdx.y) * span;
  const int len = static_cast<int>(K - k0 < span ? (K > k0 ? K - k0 : 0) : span);
  Slots<T, true, NV> v;
  v.load(x + row * stride, k0, len);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float w = warp_max(v.amax());
  if (lane == 0) part[warp] = w;
  __syncthreads();
  cluster_wait_acquire();  // every CTA of the cluster has started
  if (warp == 0) {
    const int nw = blockDim.x / kWarp;
    const float b = warp_max(lane < nw ? part[lane] : 0.f);
    if (lane < nc) {
      const unsigned slot = peer_addr(&peer_amax[cluster_rank()], lane);
      if constexpr (ASYNC) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(slot),
                     "r"(__float_as_uint(b)), "r"(peer_addr(&peer_bar, lane))
                     : "memory");
      } else {
        asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(slot), "f"(b) : "memory");
      }
    }
  }
  if constexpr (ASYNC) {
    mbar_wait_phase0(&peer_bar);  // every CTA's block max is in peer_amax
  } else {
    cluster_arrive_release();
    cluster_wait_acquire();  // every CTA's block max is in peer_amax
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxCluster; ++i)
    if (i < nc) amax = fmaxf(amax, peer_amax[i]);
  const float scale = fmaxf(__fdiv_rn(amax, m), min_scale);
  if (blockIdx.y == 0 && threadIdx.x == 0) s[row] = scale;
  v.template store<FMT>(q + row * K, k0, len, scale, m);
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
    const Scaler sc = make_scaler(scale, m);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t k = g * kGroupSize + i * kWarp + lane;
      if (k < K) qr[k] = static_cast<uint8_t>(cvt2<FMT>(scaled(v[i], sc), 0.f) & 0xff);
    }
  }
}

// Largest slot count (template NV) of a row kernel: the register budget of its slots.
template <typename T, bool VEC>
constexpr int max_slots() {
  return !VEC ? kScalarSlots : sizeof(T) == 4 ? kMaxSlotsVec32 : kMaxSlotsVec16;
}

// The per-token cluster path: FP8_LINEAR_ACT_CLUSTER = 0 (off: one CTA a row, act_quant v2), 1 (on, the
// st.async / mbarrier exchange) or 2 (on, the exchange by a second cluster barrier); unset or another
// value: on with st.async where kTokenClusterEnabled, else off. Read once per process.
enum ClusterMode { kClusterOff = 0, kClusterAsync = 1, kClusterBarrier = 2 };
int token_cluster_mode() {
  static const int mode = [] {
    const char* v = std::getenv("FP8_LINEAR_ACT_CLUSTER");
    if (v != nullptr && v[0] >= '0' && v[0] <= '2' && v[1] == '\0') return v[0] - '0';
    return kTokenClusterEnabled ? int(kClusterAsync) : int(kClusterOff);
  }();
  return mode;
}

// plan_token_cluster's min_units: kClusterMinUnits unless FP8_LINEAR_ACT_CLUSTER_MIN_K is a number (a K:
// rows of K <= it stay in one CTA a row; an experiment switch for benchmarks). Read once per process.
int64_t cluster_min_units() {
  static const int64_t units = [] {
    const char* v = std::getenv("FP8_LINEAR_ACT_CLUSTER_MIN_K");
    if (v == nullptr || v[0] == '\0') return kClusterMinUnits;
    char* end = nullptr;
    const long long k = std::strtoll(v, &end, 10);
    return (end != nullptr && *end == '\0' && k >= 0) ? int64_t(k / kVec) : kClusterMinUnits;
  }();
  return units;
}

// Whether the current device can hold the largest cluster plan (kMaxCluster CTAs of kClusterMaxThreads
// threads of the kernel with the most registers) at once: cudaOccupancyMaxActiveClusters >= 1. Asked once
// a device; where it cannot (a GPU partition with small GPCs), per-token rows keep one CTA a row.
bool cluster_fits() {
  static std::atomic<uint64_t> asked{0}, fits{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(asked.load(std::memory_order_acquire) & bit)) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, kMaxCluster, 1);
    cfg.blockDim = dim3(kClusterMaxThreads, 1, 1);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = kMaxCluster;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, quant_token_cluster_kernel<float, 0, kClusterMaxSlots, true>, &cfg);
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (e == cudaSuccess && clusters > 0) fits.fetch_or(bit, std::memory_order_acq_rel);
    asked.fetch_or(bit, std::memory_order_acq_rel);
  }
  return (fits.load(std::memory_order_acquire) & bit) != 0;
}

// A per-token cluster plan: grid (rows, cluster) in clusters of (1, cluster, 1), with the PDL attribute
// when it is on (pdl.h); the exchange of token_cluster_mode().
template <typename T, int FMT, int NV>
const char* launch_token_cluster(const ActQuantArgs& a, const RowPlan& p, cudaStream_t stream) {
  if (p.cluster < 2 || p.cluster > kMaxCluster || p.spans != p.cluster || p.threads > kClusterMaxThreads)
    return "act_quant: internal error (cluster plan out of range)";
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.rows), static_cast<unsigned>(p.cluster));
  cfg.blockDim = dim3(p.threads);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  cfg.attrs = attrs;
  cfg.numAttrs = fp8pdl::launch_attrs(attrs);
  attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
  attrs[cfg.numAttrs].val.clusterDim.x = 1;
  attrs[cfg.numAttrs].val.clusterDim.y = static_cast<unsigned>(p.cluster);
  attrs[cfg.numAttrs].val.clusterDim.z = 1;
  ++cfg.numAttrs;
  const cudaError_t e = cudaLaunchKernelEx(&cfg,
                                           token_cluster_mode() == kClusterBarrier ? quant_token_cluster_kernel<T, FMT, NV, false>
                                                                          : quant_token_cluster_kernel<T, FMT, NV, true>,
                                           static_cast<const T*>(a.x),
                                           static_cast<uint8_t*>(a.q), a.scale, a.K, a.row_stride, p.span, a.fmt_max,
                                           a.min_scale);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T, int FMT, bool VEC, int NV>
const char* launch_rows(const ActQuantArgs& a, const RowPlan& p, cudaStream_t stream) {
  if constexpr (NV > max_slots<T, VEC>() || (!VEC && NV != kScalarSlots)) {
    return "act_quant: internal error (row plan with an unsupported slot count)";
  } else {
    if (p.cluster > 1) {
      if constexpr (VEC && NV <= kClusterMaxSlots) {
        if (a.mode == kToken) return launch_token_cluster<T, FMT, NV>(a, p, stream);
      }
      return "act_quant: internal error (cluster plan outside the per-token vector path)";
    }
    void (*kernel)(const T*, uint8_t*, float*, int64_t, int64_t, float, float) =
        a.mode == kStatic ? quant_rows_kernel<T, FMT, kStatic, VEC, NV, true> : quant_rows_kernel<T, FMT, kToken, VEC, NV, true>;
    if constexpr (NV == max_slots<T, VEC>()) {
      if (a.mode == kToken && !p.resident) kernel = quant_rows_kernel<T, FMT, kToken, VEC, NV, false>;
    }
    if (p.spans > kMaxGridY) return "act_quant: rows too long for the static row kernel's grid";
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(p.spans));
    const cudaError_t e = fp8pdl::launch(kernel, grid, dim3(p.threads), stream, static_cast<const T*>(a.x),
                                         static_cast<uint8_t*>(a.q), a.scale, a.K, a.row_stride, a.fmt_max, a.min_scale);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
}

template <typename T, int FMT, bool VEC>
const char* launch_rows_nv(const ActQuantArgs& a, const RowPlan& p, cudaStream_t stream) {
  switch (p.slots) {
    case 1: return launch_rows<T, FMT, VEC, 1>(a, p, stream);
    case 2: return launch_rows<T, FMT, VEC, 2>(a, p, stream);
    case 4: return launch_rows<T, FMT, VEC, 4>(a, p, stream);
    case 8: return launch_rows<T, FMT, VEC, 8>(a, p, stream);
    case 16: return launch_rows<T, FMT, VEC, 16>(a, p, stream);
    default: return "act_quant: internal error (row plan with an unsupported slot count)";
  }
}

template <typename T, int FMT>
const char* launch_typed(const ActQuantArgs& a, cudaStream_t stream) {
  if (a.mode == kGroup) {
    const int64_t groups = (a.K + kGroupSize - 1) / kGroupSize;
    const int64_t gy = (groups + kGroupWarps - 1) / kGroupWarps;
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(gy < kMaxGridY ? gy : kMaxGridY));
    const cudaError_t e = fp8pdl::launch(quant_groups_kernel<T, FMT>, grid, dim3(kGroupWarps * kWarp), stream,
                                         static_cast<const T*>(a.x), static_cast<uint8_t*>(a.q), a.scale, a.scale_ld,
                                         a.K, a.row_stride, a.fmt_max, a.min_scale);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  } else {
    const bool vec = a.K % kVec == 0 && (reinterpret_cast<uintptr_t>(a.x) % 16) == 0 &&
                     (a.row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(a.q) % 8) == 0;
    const bool cluster_ok = a.mode == kToken && vec && token_cluster_mode() != kClusterOff && cluster_fits();
    const RowPlan p = plan_rows(a.rows, a.K, a.mode == kToken, vec, vec ? max_slots<T, true>() : max_slots<T, false>(),
                                cluster_ok, cluster_min_units());
    const char* err = vec ? launch_rows_nv<T, FMT, true>(a, p, stream) : launch_rows_nv<T, FMT, false>(a, p, stream);
    if (err != nullptr) return err;
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
  if (a.K > 0x7fffffff) return "act_quant: rows longer than 2**31 - 1 elements";
  if (a.scale == nullptr) return "act_quant: scale pointer is null";
  switch (a.x_kind) {
    case kF32: return launch_fmt<float>(a, stream);
    case kBF16: return launch_fmt<__nv_bfloat16>(a, stream);
    case kF16: return launch_fmt<__half>(a, stream);
    default: return "act_quant: unknown input kind (expected 0 = fp32, 1 = bf16, 2 = fp16)";
  }
}

}  // namespace fp8act
