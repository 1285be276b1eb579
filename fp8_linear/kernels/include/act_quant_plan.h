// Launch plan of the static / per-token row kernels of csrc/act_quant.cu (quant_rows_kernel and
// quant_token_cluster_kernel): threads per CTA, slots per thread, CTAs per row and, per-token, whether
// a row is split over a thread-block cluster. Plain C++ (host only, no CUDA headers), so that
// tests/kernels/test_act_quant_plan.py compiles it with the host compiler and checks the kernels'
// index map over every plan (docs/kernel-log.md, act_quant v2 and v3).
#pragma once
#include <cstdint>

namespace fp8act {

constexpr int kVec = 8;           // elements per vector step (16 bytes of bf16/fp16)
constexpr int kMaxThreads = 256;  // threads per CTA of quant_rows_kernel
constexpr int kWarp = 32;
// Static mode: CTAs (rows x spans) up to which a row is spread over more CTAs rather than more slots.
constexpr int64_t kStaticCtaTarget = 1024;

// Per-token rows over a cluster (quant_token_cluster_kernel): the CTAs of one cluster split the row,
// each finds its span's amax, the cluster exchanges them through distributed shared memory and every
// CTA converts its span from registers with the row's scale.
// Default of the cluster path (false: every per-token row in one CTA, as act_quant v2); the
// environment variable FP8_LINEAR_ACT_CLUSTER = 0 / 1 / 2 overrides it for the process (csrc/act_quant.cu,
// token_cluster_mode: off, on with the st.async exchange, on with the cluster-barrier exchange).
constexpr bool kTokenClusterEnabled = true;
// Largest cluster: 8 CTAs is the portable limit on sm_90 (16 needs the non-portable attribute and is
// not guaranteed to fit one GPC while other kernels hold SMs). Cluster sizes are powers of two.
constexpr int kMaxCluster = 8;
// 8-element units a cluster CTA takes before the row is split over more CTAs: 256 threads x one slot,
// the static path's span. One CTA a row costs each of its threads a chain of ceil(K / 2048) slots of
// conversions (each slot 8 divisions, two fp32 <-> fp64 conversions each at 16 a clock an SM: ~128
// cycles a warp); a cluster cuts it to one slot (up to K = 65536), at the price of the amax exchange
// (~0.35 us predicted, docs/kernel-log.md act_quant v3).
constexpr int64_t kClusterUnitsPerCta = 256;
// Units up to which a per-token row stays in one CTA: one CTA a row holds them in at most 2 slots a
// thread (K <= 4096), whose chain (~2 x 128 cycles a warp, 2 warps an SM sub-partition: ~0.26 us)
// costs less than the exchange; from 3 slots on the cluster is predicted cheaper. The environment
// variable FP8_LINEAR_ACT_CLUSTER_MIN_K (an experiment switch, read once; csrc/act_quant.cu) overrides
// it as a K (units = K / 8).
constexpr int64_t kClusterMinUnits = 2 * kClusterUnitsPerCta;
// Threads of a cluster CTA: the hardware limit of a CTA (one slot of 8 elements a thread up to
// K = 8 CTAs x 1024 x 8 = 65536; two slots up to 131072; longer rows take the one-CTA two-pass path).
constexpr int kClusterMaxThreads = 1024;
constexpr int kClusterMaxSlots = 2;
// rows x cluster CTAs up to which per-token rows are split: about one wave of the cluster kernel (132
// SMs x 8 CTAs of 256 threads at <= 32 registers = 1056); the cluster halves until rows x cluster fits.
// At M > 512 (even a 2-CTA cluster is past it) one CTA a row is kept: more than 264 CTAs, which fill
// every SM at the one-CTA kernel's 2 an SM.
constexpr int64_t kTokenClusterCtaMax = 1024;

// Launch shape of a row kernel.
struct RowPlan {
  int threads;     // threads per CTA (a multiple of kWarp)
  int slots;       // slots of kVec elements a thread (template NV)
  int64_t spans;   // CTAs per row (gridDim.y); static and cluster plans
  bool resident;   // per-token one-CTA plans: the row fits one span (registers); else two passes
  int cluster;     // per-token: CTAs of the cluster that splits a row (1: one CTA a row)
  int64_t span;    // elements of a row one CTA covers (the last CTA of a row may have fewer)
};

inline int round_threads(int64_t work, int cap) {
  int64_t t = ((work + kWarp - 1) / kWarp) * kWarp;
  if (t < kWarp) t = kWarp;
  if (t > cap) t = cap;
  return static_cast<int>(t);
}

// The cluster split of a per-token row of `units` 8-element units over `rows` rows, or cluster = 1
// (units <= min_units). Cluster: the smallest power of two whose CTAs take at most kClusterUnitsPerCta
// units each (at most kMaxCluster), halved while rows x cluster > kTokenClusterCtaMax; threads and
// slots: the fewest slots (1, 2) whose units per CTA fit kClusterMaxThreads threads.
inline RowPlan plan_token_cluster(int64_t rows, int64_t units, int64_t min_units = kClusterMinUnits) {
  RowPlan p{0, 1, 1, true, 1, 0};
  if (units <= min_units) return p;
  int c = 1;
  while (c < kMaxCluster && c * kClusterUnitsPerCta < units) c *= 2;
  while (c > 1 && rows * c > kTokenClusterCtaMax) c /= 2;
  if (c < 2) return p;
  const int64_t per_cta = (units + c - 1) / c;
  while (p.slots < kClusterMaxSlots && (per_cta + p.slots - 1) / p.slots > kClusterMaxThreads) p.slots *= 2;
  if ((per_cta + p.slots - 1) / p.slots > kClusterMaxThreads) return RowPlan{0, 1, 1, true, 1, 0};
  p.threads = round_threads((per_cta + p.slots - 1) / p.slots, kClusterMaxThreads);
  p.cluster = c;
  p.spans = c;
  p.span = per_cta * kVec;
  return p;
}

// Threads as v1 (kVec elements each, at most kMaxThreads). Static: the fewest slots a thread
// (1, 2, 4, ...) whose grid of rows x spans stays within kStaticCtaTarget CTAs, or that holds the row
// in one span (small M: a row spread over many CTAs, one load each; large M: one CTA a row, its
// loads batched). Per-token, vector path: a cluster where plan_token_cluster gives one; else the fewest
// slots that hold the row in one span (resident), else the most (two passes). `max_nv` is the largest
// slot count of the one-CTA kernels (the register budget of the input type; the scalar path's count).
// `vec`: K % 8 == 0 and 16-byte aligned rows (the kernels' vector path); `cluster_ok`: the cluster path on;
// `cluster_min_units`: plan_token_cluster's min_units.
inline RowPlan plan_rows(int64_t rows, int64_t K, bool per_token, bool vec, int max_nv,
                         bool cluster_ok = kTokenClusterEnabled, int64_t cluster_min_units = kClusterMinUnits) {
  const int64_t units = (K + kVec - 1) / kVec;
  if (per_token && vec && cluster_ok) {
    const RowPlan c = plan_token_cluster(rows, units, cluster_min_units);
    if (c.cluster > 1) return c;
  }
  RowPlan p{round_threads(units, kMaxThreads), 1, 1, true, 1, 0};
  const int64_t per_thread = (units + p.threads - 1) / p.threads;  // slots that hold the row in one span
  if (!vec) {
    p.slots = max_nv;
  } else if (!per_token) {
    for (;; p.slots *= 2) {
      const int64_t spans = (units + int64_t(p.threads) * p.slots - 1) / (int64_t(p.threads) * p.slots);
      if (p.slots >= per_thread || p.slots >= max_nv || rows * spans <= kStaticCtaTarget) break;
    }
  } else {
    while (p.slots < per_thread && p.slots < max_nv) p.slots *= 2;
  }
  p.span = int64_t(p.threads) * kVec * p.slots;
  if (!per_token) {
    p.spans = (K + p.span - 1) / p.span;
  } else {
    p.resident = K <= p.span;
  }
  return p;
}

}  // namespace fp8act
