// Torch binding of the sm90 FP8 GEMM. Kept apart from the kernel units: editing a kernel recompiles
// only its .cu file, not this (slow) torch translation unit.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "sm90_api.h"

namespace {

int fmt_code(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::ScalarType::Float8_e4m3fn) return 0;
  if (t.scalar_type() == at::ScalarType::Float8_e5m2) return 1;
  TORCH_CHECK(false, name, ": expected float8_e4m3fn or float8_e5m2, got ", t.scalar_type());
  return -1;
}

// out = (a @ b.T) * scale_a * scale_b + bias, written into `out` ([M, N], contiguous).
void gemm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
              const c10::optional<at::Tensor>& bias, at::Tensor& out, int64_t config, int64_t flags) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && out.is_cuda(), "sm90_gemm: tensors must be on CUDA");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "sm90_gemm: a [M, K] and b [N, K] expected");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(), "sm90_gemm: contiguous tensors expected");
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "sm90_gemm: out must be [M, N]");
  TORCH_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "sm90_gemm: dims too large");
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_b.scalar_type() == at::kFloat,
              "sm90_gemm: scales must be float32");
  TORCH_CHECK(scale_a.is_contiguous() && scale_b.is_contiguous(), "sm90_gemm: scales must be contiguous");
  TORCH_CHECK(scale_a.numel() == 1 || scale_a.numel() == M, "sm90_gemm: scale_a must be [1] or [M, 1]");
  TORCH_CHECK(scale_b.numel() == 1 || scale_b.numel() == N, "sm90_gemm: scale_b must be [1] or [N, 1]");

  fp8sm90::GemmArgs g{};
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.M = static_cast<int>(M);
  g.N = static_cast<int>(N);
  g.K = static_cast<int>(K);
  g.fmt_a = fmt_code(a, "a");
  g.fmt_b = fmt_code(b, "b");
  g.scale_a = scale_a.data_ptr<float>();
  g.scale_a_row = (scale_a.numel() == M && M > 1) ? 1 : 0;
  g.scale_b = scale_b.data_ptr<float>();
  g.scale_b_row = (scale_b.numel() == N && N > 1) ? 1 : 0;
  g.bias = nullptr;
  g.bias_kind = 0;
  if (bias.has_value() && bias->defined()) {
    const at::Tensor& bt = *bias;
    TORCH_CHECK(bt.is_cuda() && bt.numel() == N && bt.is_contiguous(), "sm90_gemm: bias must be a contiguous [N]");
    g.bias = bt.data_ptr();
    switch (bt.scalar_type()) {
      case at::kFloat: g.bias_kind = 1; break;
      case at::kBFloat16: g.bias_kind = 2; break;
      case at::kHalf: g.bias_kind = 3; break;
      default: TORCH_CHECK(false, "sm90_gemm: bias must be float32, bfloat16 or float16, got ", bt.scalar_type());
    }
  }
  g.out = out.data_ptr();
  switch (out.scalar_type()) {
    case at::kFloat: g.out_kind = 0; break;
    case at::kBFloat16: g.out_kind = 1; break;
    case at::kHalf: g.out_kind = 2; break;
    default: TORCH_CHECK(false, "sm90_gemm: out must be float32, bfloat16 or float16, got ", out.scalar_type());
  }
  g.config = static_cast<int>(config);
  g.force_direct_store = (flags & 1) ? 1 : 0;
  const c10::cuda::CUDAGuard guard(a.device());
  g.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const char* err = fp8sm90::gemm(g, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == nullptr, "sm90_gemm: ", err ? err : "");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm_out", &gemm_out, "FP8 GEMM (sm_90a) into a preallocated output; flags bit 0: direct-store epilogue",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("scale_a"), pybind11::arg("scale_b"),
        pybind11::arg("bias"), pybind11::arg("out"), pybind11::arg("config"), pybind11::arg("flags") = 0);
  m.attr("num_configs") = static_cast<int>(fp8sm90::kNumConfigs);
}
