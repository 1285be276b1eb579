// Torch binding of the sm90 FP8 GEMM. Kept apart from the kernel units: editing a kernel recompiles
// only its .cu file, not this (slow) torch translation unit.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "act_quant.h"
#include "pdl.h"
#include "sm90_api.h"
#include "sm90_grouped_api.h"

// Argument checks of the functions below. Messages are built with std::to_string and string
// appends only, never with an ostream: on the H200 image a check streaming an
// integer through c10::str (std::ostringstream) crashed the process with a segfault, whether it threw
// c10::Error (TORCH_CHECK) or std::runtime_error, while the same checks with string-only messages
// raised normally. (Likely a libstdc++ mismatch between this g++ 13 build and the libstdc++ the
// process loaded first, in the ostream's locale facets.) FP8_CHECK throws std::runtime_error, which
// pybind11 turns into a Python RuntimeError.
inline void fp8_append(std::string& s, const char* v) { s += v; }
inline void fp8_append(std::string& s, const std::string& v) { s += v; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
inline void fp8_append(std::string& s, T v) {
  s += std::to_string(v);
}
template <typename... A>
std::string fp8_msg(const A&... a) {
  std::string s;
  (fp8_append(s, a), ...);
  return s;
}
#define FP8_CHECK(cond, ...) \
  do {                       \
    if (!(cond)) throw std::runtime_error(fp8_msg(__VA_ARGS__)); \
  } while (0)

namespace {

// Message pieces for FP8_CHECK, without ostreams (see above).
std::string dims_str(at::IntArrayRef d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}
const char* dtype_str(at::ScalarType t) { return c10::toString(t); }
std::string dev_str(const at::Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : std::string(t.is_cpu() ? "cpu" : "other");
}

int fmt_code(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::ScalarType::Float8_e4m3fn) return 0;
  if (t.scalar_type() == at::ScalarType::Float8_e5m2) return 1;
  FP8_CHECK(false, name, ": expected float8_e4m3fn or float8_e5m2, got ", dtype_str(t.scalar_type()));
  return -1;
}

// 128 = the activation group width and the weight block height of fine-grained scales (fp8act::kGroupSize).
constexpr int64_t kScaleBlock = fp8act::kGroupSize;

// Leading dimension of M-major 1 x 128 group scales of `rows` rows: rows rounded up to 4 (16-byte
// aligned columns, what the kernel's TMA reads).
int64_t group_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }

// New 1 x 128 group scales [rows, ceil(K/128)] fp32, M-major: strides (1, group_scale_ld(rows)), the
// layout act_quant writes and the sm90 GEMM reads without a copy.
at::Tensor new_group_scales(int64_t rows, int64_t K, const at::TensorOptions& opts) {
  const int64_t kbn = (K + fp8act::kGroupSize - 1) / fp8act::kGroupSize;
  return at::empty({kbn, group_scale_ld(rows)}, opts.dtype(at::kFloat)).narrow(1, 0, rows).t();
}

// Whether `s` ([rows, kbn] fp32) is M-major as the kernel reads it: stride 1 along rows (any, for one
// row), the k-block stride >= rows and a multiple of 4 (any, for one k-block), 16-byte aligned.
bool is_m_major(const at::Tensor& s) {
  const int64_t rows = s.size(0), kbn = s.size(1);
  const bool rows_ok = rows <= 1 || s.stride(0) == 1;
  const bool cols_ok = kbn <= 1 || (s.stride(1) >= rows && s.stride(1) % 4 == 0);
  return rows_ok && cols_ok && reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0;
}

// Fine-grained scales: scale_a 2-D [M, ceil(K/128)] (1 x 128 groups) with scale_b 2-D [ceil(N/128),
// ceil(K/128)] (128 x 128 blocks). Where these shapes coincide with per-tensor / per-row ones (K <= 128
// and N <= 128: [M, 1] and [1, 1]) both readings mean the same product; the per-row path takes those.
bool is_block_scaled(const at::Tensor& scale_a, const at::Tensor& scale_b, int64_t M, int64_t N, int64_t K) {
  const int64_t kbn = (K + kScaleBlock - 1) / kScaleBlock, nbn = (N + kScaleBlock - 1) / kScaleBlock;
  if (scale_a.dim() != 2 || scale_b.dim() != 2) return false;
  if (scale_a.size(0) != M || scale_a.size(1) != kbn || scale_b.size(0) != nbn || scale_b.size(1) != kbn) return false;
  return !(kbn == 1 && nbn == 1);
}

// out = (a @ b.T) * scale_a * scale_b + bias, written into `out` ([M, N], contiguous); with fine-grained
// scales (is_block_scaled) out[m, n] = sum over k-blocks kb of (a @ b.T restricted to kb) * scale_a[m, kb] *
// scale_b[n / 128, kb], + bias.
void gemm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
              const c10::optional<at::Tensor>& bias, at::Tensor& out, int64_t config, int64_t flags,
              int64_t splits = 1) {
  FP8_CHECK(a.is_cuda() && b.is_cuda() && out.is_cuda(), "sm90_gemm: tensors must be on CUDA");
  FP8_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "sm90_gemm: a [M, K] and b [N, K] expected");
  FP8_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(), "sm90_gemm: contiguous tensors expected");
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  FP8_CHECK(out.size(0) == M && out.size(1) == N, "sm90_gemm: out must be [M, N]");
  FP8_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "sm90_gemm: dims too large");
  FP8_CHECK(scale_a.scalar_type() == at::kFloat && scale_b.scalar_type() == at::kFloat,
              "sm90_gemm: scales must be float32");
  const bool block = is_block_scaled(scale_a, scale_b, M, N, K);
  const int64_t kbn = (K + kScaleBlock - 1) / kScaleBlock;
  FP8_CHECK(block || kbn == 1 || !(scale_a.dim() == 2 && scale_a.size(0) == M && scale_a.size(1) == kbn),
            "sm90_gemm: a 1x128 scale_a [M, ceil(K/128)] = ", dims_str(scale_a.sizes()),
            " needs a 128x128 scale_b [ceil(N/128), ceil(K/128)], got ", dims_str(scale_b.sizes()));
  FP8_CHECK(block || scale_a.numel() == 1 || scale_a.numel() == M,
            "sm90_gemm: scale_a must be [1], [M, 1] or (with a block scale_b) [M, ceil(K/128)], got ",
            dims_str(scale_a.sizes()));
  FP8_CHECK(block || scale_b.numel() == 1 || scale_b.numel() == N,
            "sm90_gemm: scale_b must be [1], [N, 1] or (with a group scale_a) [ceil(N/128), ceil(K/128)], got ",
            dims_str(scale_b.sizes()));
  FP8_CHECK(scale_a.device() == a.device() && scale_b.device() == a.device(), "sm90_gemm: scales must be on ",
            dev_str(a), ", got ", dev_str(scale_a), " and ", dev_str(scale_b));
  FP8_CHECK((block || scale_a.is_contiguous()) && scale_b.is_contiguous(),
            "sm90_gemm: scales must be contiguous (a 1x128 scale_a may have any strides)");

  fp8sm90::GemmArgs g{};
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.M = static_cast<int>(M);
  g.N = static_cast<int>(N);
  g.K = static_cast<int>(K);
  g.fmt_a = fmt_code(a, "a");
  g.fmt_b = fmt_code(b, "b");
  // Block scale_a is read M-major (the layout act_quant writes); any other layout is copied into it.
  const at::Tensor sa_m = !block || is_m_major(scale_a) ? scale_a : new_group_scales(M, K, scale_a.options()).copy_(scale_a);
  g.scale_a = sa_m.data_ptr<float>();
  g.scale_a_ld = block && sa_m.size(1) > 1 ? sa_m.stride(1) : group_scale_ld(M);
  g.scale_a_row = (scale_a.numel() == M && M > 1) ? 1 : 0;
  g.scale_b = scale_b.data_ptr<float>();
  g.scale_b_row = (scale_b.numel() == N && N > 1) ? 1 : 0;
  g.scale_block = block ? 1 : 0;
  g.bias = nullptr;
  g.bias_kind = 0;
  if (bias.has_value() && bias->defined()) {
    const at::Tensor& bt = *bias;
    FP8_CHECK(bt.is_cuda() && bt.numel() == N && bt.is_contiguous(), "sm90_gemm: bias must be a contiguous [N]");
    g.bias = bt.data_ptr();
    switch (bt.scalar_type()) {
      case at::kFloat: g.bias_kind = 1; break;
      case at::kBFloat16: g.bias_kind = 2; break;
      case at::kHalf: g.bias_kind = 3; break;
      default: FP8_CHECK(false, "sm90_gemm: bias must be float32, bfloat16 or float16, got ", dtype_str(bt.scalar_type()));
    }
  }
  g.out = out.data_ptr();
  switch (out.scalar_type()) {
    case at::kFloat: g.out_kind = 0; break;
    case at::kBFloat16: g.out_kind = 1; break;
    case at::kHalf: g.out_kind = 2; break;
    default: FP8_CHECK(false, "sm90_gemm: out must be float32, bfloat16 or float16, got ", dtype_str(out.scalar_type()));
  }
  g.config = static_cast<int>(config);
  g.force_direct_store = (flags & 1) ? 1 : 0;
  FP8_CHECK(splits >= 1 && splits <= 64, "sm90_gemm: splits must be 1..64, got ", splits);
  const c10::cuda::CUDAGuard guard(a.device());
  g.splits = static_cast<int>(splits);
  // split K: the raw partials (torch's caching allocator: stream-ordered, and inside a CUDA graph from the
  // graph's pool; the kernel reads only what the same launch wrote, so it needs no clearing)
  at::Tensor workspace;
  const long ws_floats = splits > 1 ? fp8sm90::split_workspace_floats(g.config, g.M, g.N, g.K, g.splits) : 0;
  if (ws_floats > 0) {
    workspace = at::empty({ws_floats}, out.options().dtype(at::kFloat));
    g.workspace = workspace.data_ptr<float>();
    g.workspace_floats = ws_floats;
  }
  g.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const char* err = fp8sm90::gemm(g, at::cuda::getCurrentCUDAStream());
  FP8_CHECK(err == nullptr, "sm90_gemm: ", err ? err : "");
}

int act_kind(const at::Tensor& x, const char* name) {
  switch (x.scalar_type()) {
    case at::kFloat: return fp8act::kF32;
    case at::kBFloat16: return fp8act::kBF16;
    case at::kHalf: return fp8act::kF16;
    default: FP8_CHECK(false, name, ": expected float32, bfloat16 or float16, got ", dtype_str(x.scalar_type()));
  }
  return -1;
}

// Quantize x [rows, K] (last dim contiguous, any row stride) into the preallocated contiguous fp8 `q`
// [rows, K]; `scale` is read (static, [1]) or written (token [rows, 1] contiguous, group
// [rows, ceil(K/128)] M-major: is_m_major, e.g. new_group_scales).
void act_quant_into(const at::Tensor& x, at::Tensor& q, at::Tensor& scale, int64_t mode, double fmt_max,
                    double min_scale) {
  FP8_CHECK(x.is_cuda() && q.device() == x.device() && scale.device() == x.device(),
              "act_quant: x, q and scale must be on one CUDA device, got ", dev_str(x), ", ", dev_str(q), " and ",
              dev_str(scale));
  FP8_CHECK(x.dim() == 2, "act_quant: x must be 2-D [rows, K], got ", x.dim(), " dims");
  FP8_CHECK(x.size(1) <= 1 || x.stride(1) == 1, "act_quant: x must have a contiguous last dim, got strides ",
              dims_str(x.strides()));
  FP8_CHECK(q.is_contiguous() && q.sizes() == x.sizes(), "act_quant: q must be a contiguous ", dims_str(x.sizes()));
  const int64_t rows = x.size(0), K = x.size(1);
  const int64_t want = mode == fp8act::kStatic ? 1 : mode == fp8act::kToken ? rows
                                                     : rows * ((K + fp8act::kGroupSize - 1) / fp8act::kGroupSize);
  FP8_CHECK(scale.numel() == want, "act_quant: scale must have ", want, " elements for mode ", mode, ", got ",
              scale.numel());
  if (mode == fp8act::kGroup) {
    FP8_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 2 && scale.size(0) == rows && is_m_major(scale),
              "act_quant: group scales must be float32 [rows, ceil(K/128)], M-major (strides (1, ld), ld >= rows, "
              "a multiple of 4), got ", dims_str(scale.sizes()), " strides ", dims_str(scale.strides()));
  } else {
    FP8_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "act_quant: scale must be contiguous float32");
  }
  fp8act::ActQuantArgs a{};
  a.x = x.data_ptr();
  a.x_kind = act_kind(x, "x");
  a.rows = rows;
  a.K = K;
  a.row_stride = rows > 1 ? x.stride(0) : K;
  a.q = q.data_ptr();
  a.fmt = fmt_code(q, "q");
  a.scale = scale.data_ptr<float>();
  a.scale_ld = mode == fp8act::kGroup && scale.size(1) > 1 ? scale.stride(1) : group_scale_ld(rows);
  a.mode = static_cast<int>(mode);
  a.fmt_max = static_cast<float>(fmt_max);
  a.min_scale = static_cast<float>(min_scale);
  const char* err = fp8act::act_quant(a, at::cuda::getCurrentCUDAStream(x.device().index()));
  FP8_CHECK(err == nullptr, "act_quant: ", err ? err : "");
}

// (q, scale) = quantize(x) to `fp8` (0 = e4m3, 1 = e5m2); `scale` is the static [1] scale (mode 0)
// or None (dynamic modes: new [rows, 1] / [rows, ceil(K/128)] scales are returned).
std::tuple<at::Tensor, at::Tensor> act_quant(const at::Tensor& x, int64_t fp8, int64_t mode,
                                              const c10::optional<at::Tensor>& scale, double fmt_max,
                                              double min_scale) {
  FP8_CHECK(fp8 == 0 || fp8 == 1, "act_quant: fp8 must be 0 (e4m3) or 1 (e5m2), got ", fp8);
  FP8_CHECK(x.dim() == 2, "act_quant: x must be 2-D [rows, K], got ", x.dim(), " dims");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto qdtype = fp8 == 0 ? at::ScalarType::Float8_e4m3fn : at::ScalarType::Float8_e5m2;
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(qdtype));
  at::Tensor s;
  const int64_t rows = x.size(0), K = x.size(1);
  if (mode == fp8act::kStatic) {
    FP8_CHECK(scale.has_value() && scale->defined(), "act_quant: mode 0 (static) needs a [1] scale, got None");
    s = *scale;
  } else if (mode == fp8act::kToken) {
    s = at::empty({rows, 1}, x.options().dtype(at::kFloat));
  } else {
    s = new_group_scales(rows, K, x.options());
  }
  act_quant_into(x, q, s, mode, fmt_max, min_scale);
  return {q, s};
}

// FP8Linear forward in one host call: quantize x [..., K] (flattened to [M, K] as x.reshape(-1, K);
// static per-tensor `input_scale`, per-token when act_mode == 1, 1x128 groups when act_mode == 2, which
// goes with a block-scaled weight_scale [ceil(N/128), ceil(K/128)]) to weight's FP8 format, then
// out [M, N] = (q @ weight.T) * scale_a * weight_scale + bias in x's dtype (the gemm_out call),
// returned as [..., N].
at::Tensor linear_fwd(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& input_scale,
                      const at::Tensor& weight_scale, const c10::optional<at::Tensor>& bias, int64_t act_mode,
                      int64_t config, double fmt_max, double min_scale, int64_t splits) {
  FP8_CHECK(act_mode == fp8act::kStatic || act_mode == fp8act::kToken || act_mode == fp8act::kGroup,
              "linear_fwd: act_mode must be 0 (static), 1 (per-token) or 2 (1x128 groups, with a block-scaled "
              "weight_scale [ceil(N/128), ceil(K/128)]), got ", act_mode);
  FP8_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "linear_fwd: x [..., K] and weight [N, K] expected, got ", dims_str(x.sizes()), " and ", dims_str(weight.sizes()));
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t K = weight.size(1), N = weight.size(0);
  const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, K});
  const int64_t M = x2.size(0);
  at::Tensor q = at::empty({M, K}, x.options().dtype(weight.scalar_type()));
  at::Tensor sa;
  if (act_mode == fp8act::kStatic) {
    FP8_CHECK(input_scale.has_value() && input_scale->defined(), "linear_fwd: static act_mode needs input_scale");
    sa = *input_scale;
  } else if (act_mode == fp8act::kToken) {
    sa = at::empty({M, 1}, x.options().dtype(at::kFloat));
  } else {
    sa = new_group_scales(M, K, x.options());
  }
  act_quant_into(x2, q, sa, act_mode, fmt_max, min_scale);
  at::Tensor out = at::empty({M, N}, x.options());
  gemm_out(q, weight, sa, weight_scale, bias, out, config, 0, splits);
  if (x.dim() == 2) return out;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return out.view(shape);
}

// Grouped (mixture-of-experts) GEMM into `out` [M, N] (include/sm90_grouped_api.h): x [M, K] tokens sorted by
// expert, w [E, N, K] (each expert K-contiguous), offsets [E] int32 / int64 cumulative row ends (device),
// scale_x [1] / [M, 1], scale_w [E] / [E, N], bias [E, N] or None; block_n: the token tile (16/32/64/128).
// Block scales: scale_x [M, ceil(K/128)] (1 x 128 groups; read M-major, any other layout is copied into
// it) with scale_w [E, ceil(N/128), ceil(K/128)] contiguous (128 x 128 blocks per expert).
void grouped_gemm_out(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale_x, const at::Tensor& scale_w,
                      const at::Tensor& offsets, const c10::optional<at::Tensor>& bias, at::Tensor& out,
                      int64_t block_n) {
  FP8_CHECK(x.is_cuda() && w.device() == x.device() && out.device() == x.device() && offsets.device() == x.device() &&
                scale_x.device() == x.device() && scale_w.device() == x.device(),
            "grouped_gemm: every tensor must be on ", dev_str(x));
  FP8_CHECK(x.dim() == 2 && w.dim() == 3 && w.size(2) == x.size(1), "grouped_gemm: x [M, K] and w [E, N, K] expected, got ",
            dims_str(x.sizes()), " and ", dims_str(w.sizes()));
  const int64_t M = x.size(0), E = w.size(0), N = w.size(1), K = x.size(1);
  FP8_CHECK(x.is_contiguous() && out.is_contiguous() && w.stride(2) == 1 && (N == 1 || w.stride(1) == K),
            "grouped_gemm: x, out contiguous and w's experts K-contiguous expected");
  FP8_CHECK(out.size(0) == M && out.size(1) == N, "grouped_gemm: out must be [M, N]");
  FP8_CHECK(offsets.numel() == E && offsets.is_contiguous() &&
                (offsets.scalar_type() == at::kInt || offsets.scalar_type() == at::kLong),
            "grouped_gemm: offsets must be a contiguous int32 / int64 [E]");
  const int64_t kbn = (K + kScaleBlock - 1) / kScaleBlock, nbn = (N + kScaleBlock - 1) / kScaleBlock;
  const bool block = scale_w.dim() == 3 && scale_w.size(0) == E && scale_w.size(1) == nbn && scale_w.size(2) == kbn &&
                     scale_x.dim() == 2 && scale_x.size(0) == M && scale_x.size(1) == kbn && !(kbn == 1 && nbn == 1);
  FP8_CHECK(scale_x.scalar_type() == at::kFloat && scale_w.scalar_type() == at::kFloat &&
                (block || scale_x.is_contiguous()) && scale_w.is_contiguous(),
            "grouped_gemm: scales must be contiguous float32 (1x128 group scale_x: any strides)");
  FP8_CHECK(block || scale_x.numel() == 1 || scale_x.numel() == M,
            "grouped_gemm: scale_x must be [1], [M, 1] or (with a block scale_w) [M, ceil(K/128)], got ",
            dims_str(scale_x.sizes()));
  FP8_CHECK(block || scale_w.numel() == E || scale_w.numel() == E * N,
            "grouped_gemm: scale_w must be [E], [E, N] or (with a group scale_x) [E, ceil(N/128), ceil(K/128)], got ",
            dims_str(scale_w.sizes()));
  FP8_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "grouped_gemm: dims too large");
  fp8sm90::GroupedArgs g{};
  g.x = x.data_ptr();
  g.w = w.data_ptr();
  g.w_expert_stride = E > 1 ? w.stride(0) : N * K;
  g.M = static_cast<int>(M);
  g.N = static_cast<int>(N);
  g.K = static_cast<int>(K);
  g.E = static_cast<int>(E);
  g.fmt_x = fmt_code(x, "x");
  g.fmt_w = fmt_code(w, "w");
  g.offsets = offsets.data_ptr();
  g.offsets_64 = offsets.scalar_type() == at::kLong ? 1 : 0;
  // a block scale_x is read M-major (the layout act_quant writes); any other layout is copied into it
  const at::Tensor sx = !block || is_m_major(scale_x) ? scale_x : new_group_scales(M, K, scale_x.options()).copy_(scale_x);
  g.scale_x = sx.data_ptr<float>();
  g.scale_x_row = (!block && scale_x.numel() == M && M > 1) ? 1 : 0;
  g.scale_x_ld = block && kbn > 1 ? sx.stride(1) : group_scale_ld(M);
  g.scale_w = scale_w.data_ptr<float>();
  g.scale_w_row = (!block && scale_w.numel() == E * N && N > 1) ? 1 : 0;
  g.scale_block = block ? 1 : 0;
  if (bias.has_value() && bias->defined()) {
    FP8_CHECK(bias->device() == x.device() && bias->numel() == E * N && bias->is_contiguous(),
              "grouped_gemm: bias must be a contiguous [E, N]");
    g.bias = bias->data_ptr();
    switch (bias->scalar_type()) {
      case at::kFloat: g.bias_kind = 1; break;
      case at::kBFloat16: g.bias_kind = 2; break;
      case at::kHalf: g.bias_kind = 3; break;
      default: FP8_CHECK(false, "grouped_gemm: bias must be float32, bfloat16 or float16");
    }
  }
  g.out = out.data_ptr();
  switch (out.scalar_type()) {
    case at::kFloat: g.out_kind = 0; break;
    case at::kBFloat16: g.out_kind = 1; break;
    case at::kHalf: g.out_kind = 2; break;
    default: FP8_CHECK(false, "grouped_gemm: out must be float32, bfloat16 or float16");
  }
  g.block_n = static_cast<int>(block_n);
  const c10::cuda::CUDAGuard guard(x.device());
  g.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const char* err = fp8sm90::grouped_gemm(g, at::cuda::getCurrentCUDAStream());
  FP8_CHECK(err == nullptr, "grouped_gemm: ", err ? err : "");
}

}  // namespace

namespace {

// Programmatic dependent launch of the GEMM and the activation quantization (pdl.h):
// on / off for later launches (a CUDA graph keeps what it was captured with), and optionally the GEMM's
// L2 prefetch depth in k-blocks (-1: the kernel's stage count, 0: none). Returns the previous state.
std::tuple<bool, int64_t> set_pdl(bool enabled, const c10::optional<int64_t>& prefetch_kblocks) {
  const std::tuple<bool, int64_t> old{fp8pdl::enabled(), fp8pdl::prefetch_kblocks()};
  fp8pdl::set_enabled(enabled);
  if (prefetch_kblocks.has_value()) fp8pdl::set_prefetch_kblocks(static_cast<int>(*prefetch_kblocks));
  return old;
}

std::tuple<bool, int64_t> pdl_state() { return {fp8pdl::enabled(), fp8pdl::prefetch_kblocks()}; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm_out", &gemm_out, "FP8 GEMM (sm_90a) into a preallocated output; flags bit 0: direct-store epilogue; splits > 1: split K",
        pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("scale_a"), pybind11::arg("scale_b"),
        pybind11::arg("bias"), pybind11::arg("out"), pybind11::arg("config"), pybind11::arg("flags") = 0, pybind11::arg("splits") = 1);
  m.def("act_quant", &act_quant, "Activation quantization (mode 0 static [1] scale, 1 per-token, 2 1x128 groups)",
        pybind11::arg("x"), pybind11::arg("fp8"), pybind11::arg("mode"), pybind11::arg("scale"),
        pybind11::arg("fmt_max"), pybind11::arg("min_scale"));
  m.def("linear_fwd", &linear_fwd, "FP8Linear forward: activation quantization + sm90 GEMM in one call",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("input_scale"), pybind11::arg("weight_scale"),
        pybind11::arg("bias"), pybind11::arg("act_mode"), pybind11::arg("config"), pybind11::arg("fmt_max"),
        pybind11::arg("min_scale"), pybind11::arg("splits") = 1);
  m.def("set_pdl", &set_pdl, "Programmatic dependent launch on / off (and the GEMM's L2 prefetch depth); returns the previous (enabled, prefetch_kblocks)",
        pybind11::arg("enabled"), pybind11::arg("prefetch_kblocks") = pybind11::none());
  m.def("pdl_state", &pdl_state, "(enabled, prefetch_kblocks) of programmatic dependent launch (FP8_LINEAR_PDL, FP8_LINEAR_PDL_PREFETCH)");
  m.def("grouped_gemm_out", &grouped_gemm_out, "Grouped (mixture-of-experts) FP8 GEMM (sm_90a) into a preallocated output",
        pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("scale_x"), pybind11::arg("scale_w"),
        pybind11::arg("offsets"), pybind11::arg("bias"), pybind11::arg("out"), pybind11::arg("block_n"));
}
