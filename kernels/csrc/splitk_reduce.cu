// Split-K reduction of the sm90 FP8 GEMM: out[m, n] = cast(sum_s ws[s, m, n] + bias[n]).
// The GEMM wrote each split's partial sum, already scaled by scale_a * scale_b, as fp32 into the
// workspace ws [splits, M, N] (EpiParams::splits); the bias is added here, once. The splits are summed
// in order 0, 1, ..., so results are bitwise repeatable; `+ 0.f` without a bias keeps the GEMM
// epilogue's signed-zero behaviour (x * s + 0), so a zero bias and no bias give the same bits.
// Launched with programmatic dependent launch (pdl.h): it lets the next kernel launch at once and
// waits for the GEMM before its first read of the workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "pdl.h"
#include "sm90_api.h"

namespace fp8sm90 {
namespace {

constexpr int kReduceThreads = 256;
constexpr int kReduceMaxBlocks = 132 * 8;  // enough blocks to cover every SM several times

__device__ __forceinline__ float bias_at(const void* p, int kind, long n) {
  if (kind == 1) return static_cast<const float*>(p)[n];
  if (kind == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[n]);
  if (kind == 3) return __half2float(static_cast<const __half*>(p)[n]);
  return 0.f;
}

__global__ void __launch_bounds__(kReduceThreads) splitk_reduce_kernel(const float* __restrict__ ws, int splits, int M,
                                                                       int N, const void* bias, int bias_kind,
                                                                       void* out, int out_kind) {
  fp8pdl::pdl_launch_dependents();
  fp8pdl::pdl_wait();  // the workspace is the GEMM's output, `out` may be a buffer it still reads
  const long total = static_cast<long>(M) * N;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    float v = ws[i];
    for (int s = 1; s < splits; ++s) v += ws[s * total + i];
    v += bias_at(bias, bias_kind, i % N);
    if (out_kind == 0) static_cast<float*>(out)[i] = v;
    else if (out_kind == 1) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    else static_cast<__half*>(out)[i] = __float2half_rn(v);
  }
}

}  // namespace

const char* splitk_reduce(const float* ws, int splits, int M, int N, const void* bias, int bias_kind, void* out,
                          int out_kind, cudaStream_t stream) {
  const long total = static_cast<long>(M) * N;
  long blocks = (total + kReduceThreads - 1) / kReduceThreads;
  if (blocks > kReduceMaxBlocks) blocks = kReduceMaxBlocks;
  cudaError_t e = fp8pdl::launch(splitk_reduce_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads),
                                 stream, ws, splits, M, N, bias, bias_kind, out, out_kind);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace fp8sm90
