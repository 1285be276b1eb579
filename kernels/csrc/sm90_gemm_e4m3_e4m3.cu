// Kernel instances for kernel-operand formats A=e4m3, B=e4m3 (one translation unit per pair so that
// ninja compiles the four in parallel).
#include "sm90_launch.cuh"

namespace fp8sm90 {
template const char* launch_fmt<0, 0>(const LaunchArgs&, cudaStream_t);
}  // namespace fp8sm90
