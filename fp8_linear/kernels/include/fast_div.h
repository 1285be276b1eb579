// Division by a divisor fixed for a launch (the tile raster's group sizes, the split-K factor) without
// the integer division's ~30 dependent instructions (I2F, MUFU.RCP, F2I and their corrections): the
// host computes a multiplier once (make_fast_div), the kernel divides with one multiply-high, one add
// and one shift (fast_div). Round-up method (Granlund & Montgomery 1994; Hacker's Delight 10-8):
// s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1, q = (mulhi(n, m) + n) >> s, exact for
// 0 <= n < 2^31 and 1 <= d < 2^31 (mulhi(n, m) <= n, so the sum does not overflow 32 bits).
// Plain C++ outside nvcc, so that the CPU tests check it (tests/kernels/test_fast_div.py).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP8_FAST_DIV_HD __host__ __device__
#else
#define FP8_FAST_DIV_HD
#endif

namespace fp8sm90 {

struct FastDiv {
  int d;       // the divisor
  uint32_t m;  // multiplier
  uint32_t s;  // shift
};

// Host side (once per launch). d must be in [1, 2^31).
inline FastDiv make_fast_div(int d) {
  uint32_t s = 0;
  while ((uint64_t{1} << s) < static_cast<uint64_t>(d)) ++s;
  const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << s) - static_cast<uint64_t>(d))) / static_cast<uint64_t>(d) + 1;
  return FastDiv{d, static_cast<uint32_t>(m), s};
}

// n / f.d for 0 <= n < 2^31.
FP8_FAST_DIV_HD inline int fast_div(int n, const FastDiv& f) {
  const uint32_t un = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
  const uint32_t hi = __umulhi(un, f.m);
#else
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(un) * f.m) >> 32);
#endif
  return static_cast<int>((hi + un) >> f.s);
}

}  // namespace fp8sm90
