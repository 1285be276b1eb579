// Plain C++ interface of the activation quantization kernels (csrc/act_quant.cu) for the torch
// binding. No torch headers, no device code.
//
// Same formula as fp8_linear/kernels/quant_triton.py and the CPU path (fp8_linear/quantize.py), bit for bit:
//   q = cvt_rne_satfinite(clamp(x_fp32 / scale, -fmt_max, fmt_max))   (IEEE division, NaN stays NaN)
//   dynamic scales: scale = max(amax_finite / fmt_max, min_scale)       (IEEE division; inf/NaN ignored)
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace fp8act {

// Modes; the values match fp8_linear/kernels/quant_triton.py (MODE_STATIC, MODE_TOKEN, MODE_GROUP).
enum Mode { kStatic = 0, kToken = 1, kGroup = 2 };
// Input element kinds.
enum XKind { kF32 = 0, kBF16 = 1, kF16 = 2 };
// Width of the 1x128 activation groups (fp8_linear.formats.GROUP_SIZE).
constexpr int kGroupSize = 128;

struct ActQuantArgs {
  const void* x;       // [rows, K], last dim contiguous, rows `row_stride` elements apart
  int x_kind;          // XKind
  int64_t rows, K, row_stride;
  void* q;             // [rows, K] fp8, contiguous
  int fmt;             // 0 = e4m3 (float8_e4m3fn), 1 = e5m2
  float* scale;        // kStatic: the given [1] (read); kToken: [rows] (written); kGroup: [rows, ceil(K/128)] (written)
  int64_t scale_ld;    // kGroup: M-major, element [row, g] at g * scale_ld + row (scale_ld >= rows)
  int mode;            // Mode
  float fmt_max;       // largest finite value of the format (torch.finfo(...).max)
  float min_scale;     // floor of dynamic scales (fp8_linear.formats.MIN_SCALE)
};

// Launches on `stream`. Returns nullptr on success, else a message naming what failed.
const char* act_quant(const ActQuantArgs& args, cudaStream_t stream);

}  // namespace fp8act
