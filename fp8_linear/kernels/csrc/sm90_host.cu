// Host side of the sm90 FP8 GEMM: tensor maps (through the driver entry point, no -lcuda), operand
// swap for decode configs, and dispatch to the per-format kernel units.
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "sm90_driver.h"
#include "sm90_launch.cuh"

namespace fp8sm90 {

extern template const char* launch_config<0, 0>(const LaunchArgs&, cudaStream_t, bool, bool);
extern template const char* launch_config<0, 1>(const LaunchArgs&, cudaStream_t, bool, bool);
extern template const char* launch_config<1, 0>(const LaunchArgs&, cudaStream_t, bool, bool);
extern template const char* launch_config<1, 1>(const LaunchArgs&, cudaStream_t, bool, bool);

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    } else {
      cudaGetLastError();  // clear
    }
  });
  return fn;
}

const char* ensure_context() {
  thread_local uint64_t ctx_ready = 0;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(ctx_ready & bit)) {
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    ctx_ready |= bit;
  }
  return nullptr;
}

namespace {

// The per-tensor scale of 1 that block-scaled launches give the epilogue (their scales are applied in
// the main loop): a device constant, its address taken once per device.
__device__ float g_one = 1.0f;

// The split-K arrival counters (sm90_epilogue.cuh split_fixup): zero from the module's load, left zero by
// every launch.
__device__ int g_split_flags[kSplitFlags];

// *p = the device address of `symbol` (a __device__ variable of this unit) on the current device, taken
// once per device (cache: one slot per device).
template <typename T, typename S>
const char* symbol_ptr(const S& symbol, std::atomic<T*>* cache, T** p) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  T* v = cache[dev & 63].load(std::memory_order_acquire);
  if (v == nullptr) {
    void* addr = nullptr;
    e = cudaGetSymbolAddress(&addr, symbol);
    if (e != cudaSuccess) return cudaGetErrorString(e);
    v = static_cast<T*>(addr);
    cache[dev & 63].store(v, std::memory_order_release);
  }
  *p = v;
  return nullptr;
}

const char* one_ptr(const float** p) {
  static std::atomic<const float*> cache[64];
  return symbol_ptr(g_one, cache, p);
}

const char* split_flags_ptr(int** p) {
  static std::atomic<int*> cache[64];
  return symbol_ptr(g_split_flags, cache, p);
}

// Split K as gemm runs it: kb_per k-blocks per split, and only as many splits as that leaves non-empty
// (<= want).
void split_plan(int K, int want, int* splits, int* kb_per) {
  const int num_kb = (K + kBK - 1) / kBK;
  *splits = 1;
  *kb_per = num_kb;
  if (want > 1) {
    *kb_per = (num_kb + want - 1) / want;
    *splits = (num_kb + *kb_per - 1) / *kb_per;
  }
}

// Output tiles of a launch (kernel rows over block_m, kernel columns over block_n).
long tile_count(const ConfigInfo& info, int M, int N) {
  const long rows = info.swap_ab ? N : M, cols = info.swap_ab ? M : N;
  return ((rows + info.block_m - 1) / info.block_m) * ((cols + info.block_n - 1) / info.block_n);
}

// Tile raster group height (row-blocks per group, see tile_coords): kGroupM, or the environment
// variable FP8_LINEAR_SM90_GROUP_M (1..4096; read at every launch, for raster experiments in
// benchmarks: e.g. python -m benchmarks.gemm_bench --mode raster). Any value gives the same results, bit for bit: only
// the order in which the persistent CTAs take the tiles changes.
int raster_group_m() {
  const char* v = getenv("FP8_LINEAR_SM90_GROUP_M");
  if (v == nullptr || v[0] == '\0') return kGroupM;
  const int g = atoi(v);
  return g >= 1 && g <= 4096 ? g : kGroupM;
}

// Grid size rule (FP8_LINEAR_SM90_EVEN_WAVES=1; read at every launch, for benchmarks): the fewest CTAs
// that still finish in the same number of waves, so that every CTA takes the same number of
// tiles and the SMs left over stay idle (under the card's power cap, fewer busy SMs may keep a higher
// clock). Off by default. Any grid gives the same results, bit for bit (each tile is one CTA's work).
int even_waves() {
  const char* v = getenv("FP8_LINEAR_SM90_EVEN_WAVES");
  return v != nullptr && v[0] == '1';
}

// Encode a 2-D tiled map: `inner` x `outer` elements, rows `row_bytes` apart, box `box_inner` x
// `box_outer`, no interleave, element strides 1, out-of-bounds elements read as zero. Returns a message
// when the encoder is missing or `map` is misaligned; otherwise nullptr with the driver's answer in *res.
const char* encode_2d(CUtensorMap* map, CUtensorMapDataType dt, const void* ptr, cuuint64_t inner, cuuint64_t outer,
                      cuuint64_t row_bytes, cuuint32_t box_inner, cuuint32_t box_outer, CUtensorMapSwizzle swizzle,
                      CUtensorMapL2promotion l2, CUresult* res) {
  auto fn = encode_fn();
  if (fn == nullptr) return "cuTensorMapEncodeTiled not found through cudaGetDriverEntryPointByVersion";
  if (reinterpret_cast<uintptr_t>(map) % 64 != 0) return "tensor map storage is not 64-byte aligned";
  cuuint64_t dims[2] = {inner, outer};
  cuuint64_t strides[1] = {row_bytes};  // bytes, dim 1
  cuuint32_t box[2] = {box_inner, box_outer};
  cuuint32_t estr[2] = {1, 1};
  *res = fn(map, dt, 2, const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return nullptr;
}

// 2-D map over a [rows, K] K-contiguous fp8 matrix; box = 128 (K) x box_rows, 128-byte swizzle,
// out-of-bounds elements read as zero.
const char* make_map(CUtensorMap* map, const void* ptr, int rows, int K, int box_rows) {
  CUresult r = CUDA_SUCCESS;
  if (const char* e = encode_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, ptr, K, rows, K, kBK, box_rows,
                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, &r))
    return e;
  if (r == CUDA_SUCCESS) return nullptr;
  thread_local char msg[256];
  snprintf(msg, sizeof(msg), "cuTensorMapEncodeTiled failed (CUresult %d) for an operand: ptr %p rows %d K %d box_rows %d",
           static_cast<int>(r), ptr, rows, K, box_rows);
  return msg;
}

// Map over the M-major 1 x 128 activation scales (fp32, element [m, kb] at kb * ld + m): box = `box_rows`
// consecutive m of one k-block (a tile's activation rows), no swizzle, rows past M read as zero.
const char* make_scale_map(CUtensorMap* map, const float* ptr, int M, int kbn, long ld, int box_rows) {
  CUresult r = CUDA_SUCCESS;
  if (const char* e = encode_2d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, ptr, M, kbn, static_cast<cuuint64_t>(ld) * 4,
                                box_rows, 1, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, &r))
    return e;
  if (r == CUDA_SUCCESS) return nullptr;
  thread_local char msg[256];
  snprintf(msg, sizeof(msg), "cuTensorMapEncodeTiled failed (CUresult %d) for scale_a: ptr %p M %d kb %d ld %ld box %d",
           static_cast<int>(r), static_cast<const void*>(ptr), M, kbn, ld, box_rows);
  return msg;
}

// Output map for the TMA-store epilogue over [M, N] row-major of `out_kind`, box `box_cols` x `box_rows`
// (64 rows; the swapped configs' transposed tiles: BN rows):
// the staged blocks use box_cols = one 128-byte swizzle row (32 fp32 / 64 16-bit elements) with the
// 128-byte swizzle; the tile strip (the last bn % 64 columns of a tile, see staged_cols in
// sm90_tile.cuh) uses box_cols = bn % 64 without swizzle (the strip is staged row-major).
const char* make_out_map(CUtensorMap* map, void* ptr, int M, int N, int out_kind, int box_cols, int box_rows,
                         CUtensorMapSwizzle swizzle, const char* what) {
  const int esize = out_kind == 0 ? 4 : 2;
  const CUtensorMapDataType dt = out_kind == 0   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : out_kind == 1 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUresult r = CUDA_SUCCESS;
  if (const char* e = encode_2d(map, dt, ptr, N, M, static_cast<cuuint64_t>(N) * esize, box_cols, box_rows, swizzle,
                                CU_TENSOR_MAP_L2_PROMOTION_NONE, &r))
    return e;
  if (r == CUDA_SUCCESS) return nullptr;
  thread_local char msg[256];
  snprintf(msg, sizeof(msg), "cuTensorMapEncodeTiled failed (CUresult %d) for the %s: ptr %p M %d N %d kind %d box %d",
           static_cast<int>(r), what, ptr, M, N, out_kind, box_cols);
  return msg;
}

}  // namespace

const char* gemm(const GemmArgs& g, cudaStream_t stream) {
  ConfigInfo info{};
  if (!config_info(g.config, info)) return "unknown kernel config id (fp8_linear/kernels/configs.py CONFIGS)";
  if (g.M <= 0 || g.N <= 0 || g.K <= 0) return "empty problem";
  if (g.K % 16 != 0) return "K must be a multiple of 16";
  if (const char* e = ensure_context()) return e;
  if ((reinterpret_cast<uintptr_t>(g.a) | reinterpret_cast<uintptr_t>(g.b)) % 16 != 0)
    return "operand pointers must be 16-byte aligned";
  const int bn = info.block_n;
  const int bm = info.block_m;  // the tile's rows on the kernel's A side (64 or 128: the A map's box)
  const bool swap = info.swap_ab;

  // Heap-allocated (C++17 aligned new): CUtensorMap needs 64-byte alignment, which a thread's stack
  // frame does not always give.
  std::unique_ptr<LaunchArgs> holder(new LaunchArgs{});
  LaunchArgs& la = *holder;
  la.config = g.config;
  la.num_sms = g.num_sms > 0 ? g.num_sms : 132;
  la.K = g.K;
  la.ep.out = g.out;
  la.ep.sa = g.scale_a;
  la.ep.sb = g.scale_b;
  la.ep.sa_row = g.scale_a_row;
  la.ep.sb_row = g.scale_b_row;
  la.ep.bias = g.bias;
  la.ep.bias_kind = g.bias ? g.bias_kind : 0;
  la.ep.out_kind = g.out_kind;
  la.ep.M = g.M;
  la.ep.N = g.N;
  la.blk = g.scale_block ? 1 : 0;
  if (la.blk) {
    if (!info.block_scales) return "block scales are not supported by this config (fp8_linear/kernels/configs.py block_scales)";
    const long kbn = (g.K + kBK - 1) / kBK;
    if (static_cast<long>(g.M) * kbn >= (1L << 31) || static_cast<long>((g.N + kBK - 1) / kBK) * kbn >= (1L << 31))
      return "block scales: M x ceil(K/128) and ceil(N/128) x ceil(K/128) must be below 2^31";
    if (g.scale_a_ld < g.M || g.scale_a_ld % 4 != 0 || reinterpret_cast<uintptr_t>(g.scale_a) % 16 != 0)
      return "block scales: scale_a must be M-major with a leading dimension >= M, a multiple of 4, 16-byte aligned";
    if (const char* e = make_scale_map(&la.ep.tma_sa, g.scale_a, g.M, static_cast<int>(kbn), g.scale_a_ld,
                                       swap ? bn : kBM))
      return e;
    la.ep.blk_sb = g.scale_b;
    la.ep.blk_kb = static_cast<int>(kbn);
    const float* one = nullptr;
    if (const char* e = one_ptr(&one)) return e;
    la.ep.sa = la.ep.sb = one;  // the epilogue's scales: 1 (the factors are in the main loop's sums)
    la.ep.sa_row = la.ep.sb_row = 0;
  }
  la.ep.group_m = raster_group_m();
  la.even_waves = even_waves();
  if (g.splits > 1 && !info.split_k) return "split K is not supported by this config (fp8_linear/kernels/configs.py split_k)";
  split_plan(g.K, g.splits, &la.ep.splits, &la.ep.kb_per_split);
  const bool split = la.ep.splits > 1;
  if (split) {
    // raw partials in the workspace, the counters of tiles x consumer warpgroups (split_fixup)
    if (tile_count(info, g.M, g.N) * (bm / 64) > kSplitFlags)
      return "split K: more output tiles than split-K counters (sm90_epilogue.cuh kSplitFlags)";
    if (g.workspace == nullptr || g.workspace_floats < split_workspace_floats(g.config, g.M, g.N, g.K, g.splits))
      return "split K needs a workspace of split_workspace_floats floats";
    la.ep.split_ws = g.workspace;
    if (const char* e = split_flags_ptr(&la.ep.split_flags)) return e;
  }

  const void* ka = swap ? g.b : g.a;
  const void* kb = swap ? g.a : g.b;
  la.rows_a = swap ? g.N : g.M;
  la.rows_b = swap ? g.M : g.N;
  {  // the tile walk's divisors (tile_coords, split_tile), as in the kernels
    const int num_mp = (la.rows_a + bm - 1) / bm;
    const int num_n = (la.rows_b + bn - 1) / bn;
    const int gm = la.ep.group_m;
    la.ep.div_per_group = make_fast_div(gm * num_n);
    la.ep.div_group = make_fast_div(gm);
    la.ep.div_last = make_fast_div(num_mp % gm == 0 ? gm : num_mp % gm);
    la.ep.div_splits = make_fast_div(la.ep.splits);
  }
  const int fa = swap ? g.fmt_b : g.fmt_a;
  const int fb = swap ? g.fmt_a : g.fmt_b;
  if (const char* e = make_map(&la.tma_a, ka, la.rows_a, g.K, bm)) return e;
  if (const char* e = make_map(&la.tma_b, kb, la.rows_b, g.K, bn)) return e;
  const int esize = g.out_kind == 0 ? 4 : 2;
  // TMA stores: the non-swapped configs, and the swapped large-M ones (configs 14, 15) for 16-bit outputs
  // (transposed staging, see stage_tile_16bit_swap); other swapped launches store directly.
  const bool swap_tma = swap && swap_tma_width(bn) && g.out_kind != 0;
  la.ep.tma_store = ((!swap || swap_tma) && (static_cast<long>(g.N) * esize) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(g.out) % 16 == 0 && g.force_direct_store == 0)
                        ? 1
                        : 0;
  if (la.ep.tma_store) {
    if (const char* e = make_out_map(&la.tma_out, g.out, g.M, g.N, g.out_kind, 128 / esize, swap ? bn : 64,
                                     CU_TENSOR_MAP_SWIZZLE_128B, "output"))
      return e;
    if (bn % 64 != 0 && !swap) {
      if (const char* e = make_out_map(&la.ep.tma_strip, g.out, g.M, g.N, g.out_kind, bn % 64, 64,
                                       CU_TENSOR_MAP_SWIZZLE_NONE, "output strip"))
        return e;
    }
  }

  const char* err = "unknown fp8 format code";
  const bool blk = la.blk != 0;
  if (fa == 0 && fb == 0) err = launch_config<0, 0>(la, stream, split, blk);
  else if (fa == 0 && fb == 1) err = launch_config<0, 1>(la, stream, split, blk);
  else if (fa == 1 && fb == 0) err = launch_config<1, 0>(la, stream, split, blk);
  else if (fa == 1 && fb == 1) err = launch_config<1, 1>(la, stream, split, blk);
  return err;
}

long split_workspace_floats(int config, int M, int N, int K, int splits) {
  ConfigInfo info{};
  if (!config_info(config, info)) return -1;
  int s = 1, kb_per = 0;
  split_plan(K, splits, &s, &kb_per);
  if (s <= 1 || !info.split_k) return 0;
  return tile_count(info, M, N) * s * info.block_m * info.block_n;
}

}  // namespace fp8sm90
