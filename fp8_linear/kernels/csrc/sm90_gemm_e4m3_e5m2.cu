// Kernel instances for kernel-operand formats A=e4m3, B=e5m2 (one translation unit per pair so that
// ninja compiles the four in parallel).
#include "sm90_launch.cuh"

namespace fp8sm90 {
template const char* launch_config<0, 1>(const LaunchArgs&, cudaStream_t, bool, bool);
}  // namespace fp8sm90
