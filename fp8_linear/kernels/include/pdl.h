// Programmatic dependent launch (PDL) of the extension's kernels: the GEMM, the activation quantization
// and the split-K reduction (docs/kernel-log.md v28). Host: the process-wide switch and the launch
// attribute. Device (nvcc only): the two griddepcontrol instructions.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel
// before it on the stream is still running: as soon as every CTA of that kernel has executed
// griddepcontrol.launch_dependents (pdl_launch_dependents) or exited. It therefore runs
// griddepcontrol.wait (pdl_wait: returns once the previous kernel has completed and its memory
// operations are visible) in every thread before that thread's first global-memory read or write that
// could touch a predecessor's buffers: its inputs and scales, and also its outputs and workspace (the
// caching allocator hands a freed buffer to the next kernel on the stream). Before the wait only work
// that touches no such memory: barrier init, tensor-map prefetch, register reconfiguration, and L2
// prefetches of the weight tiles (L2 is the point of coherence: a prefetched line that a predecessor
// still writes is updated there, never read stale). Launched without the attribute, the wait returns at
// once. Kernels of torch, Triton or the grouped GEMM never trigger: ours after theirs start at their end.
#pragma once
#include <cuda_runtime_api.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

namespace fp8pdl {

// Whether our kernels launch with the PDL attribute: on unless the environment variable FP8_LINEAR_PDL
// is "0" (read once per process, at the first launch); set_enabled overrides it (tests and benchmarks
// flip it at run time: a CUDA graph keeps the setting it was captured with).
bool enabled();
void set_enabled(bool on);

// K-blocks of its first work item's weight tile that each GEMM CTA prefetches into L2 before its wait,
// in PDL launches only: -1 = the kernel's stage count, 0 = none (the default: measured slower), n = min(n, the item's
// k-blocks). FP8_LINEAR_PDL_PREFETCH (read once per process); set_prefetch_kblocks overrides it.
int prefetch_kblocks();
void set_prefetch_kblocks(int n);

// The PDL launch attribute of one of our launches into attr[0]: returns the attribute count for
// cudaLaunchConfig_t::numAttrs (1 when PDL is on, else 0).
inline unsigned int launch_attrs(cudaLaunchAttribute* attr) {
  if (!enabled()) return 0;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  return 1;
}

#ifdef __CUDACC__
// Launch `kernel` on `stream` with the PDL attribute when it is on (pdl.h's kernels: the activation
// quantization; the GEMM's launch_one also sets its prefetch depth).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[1];
  cfg.attrs = attrs;
  cfg.numAttrs = launch_attrs(attrs);
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Wait until the previous kernel on the stream has completed and its writes are visible (no-op in a
// launch without the PDL attribute). The "memory" clobber keeps the compiler from hoisting loads above it.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Let the next kernel on the stream launch (once every CTA of this grid has called it or exited); one
// thread per CTA suffices, repeats are no-ops. It orders no memory: the dependent still waits.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif

}  // namespace fp8pdl
