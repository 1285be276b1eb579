// The process-wide switches of programmatic dependent launch (include/pdl.h): FP8_LINEAR_PDL and
// FP8_LINEAR_PDL_PREFETCH, read once, overridable at run time. Host code only.
#include <atomic>
#include <cstdlib>

#include "pdl.h"

namespace fp8pdl {
namespace {

// "The kernel's stage count" as a prefetch depth.
constexpr int kPrefetchStages = -1;
// Default depth: none. On an H200 the prefetch cost 0.9-2.0 us per Llama-3-8B decoder layer at M = 1
// and 16 (python -m benchmarks.chain_bench, 2026-12-01: pdl 105.6 us against pdl-nopf 104.5 at M = 1).
constexpr int kPrefetchDefault = 0;
// Largest accepted prefetch depth in k-blocks (the stage ring holds at most 8).
constexpr int kPrefetchMax = 64;

int env_enabled() {
  const char* v = std::getenv("FP8_LINEAR_PDL");
  return (v != nullptr && v[0] == '0' && v[1] == '\0') ? 0 : 1;
}

int clamp_prefetch(long n) { return n < kPrefetchStages ? kPrefetchStages : n > kPrefetchMax ? kPrefetchMax : int(n); }

int env_prefetch() {
  const char* v = std::getenv("FP8_LINEAR_PDL_PREFETCH");
  if (v == nullptr || v[0] == '\0') return kPrefetchDefault;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0') ? clamp_prefetch(n) : kPrefetchDefault;
}

std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{env_enabled()};  // thread-safe one-time initialisation
  return flag;
}

std::atomic<int>& prefetch_value() {
  static std::atomic<int> value{env_prefetch()};
  return value;
}

}  // namespace

bool enabled() { return enabled_flag().load(std::memory_order_relaxed) != 0; }
void set_enabled(bool on) { enabled_flag().store(on ? 1 : 0, std::memory_order_relaxed); }
int prefetch_kblocks() { return prefetch_value().load(std::memory_order_relaxed); }
void set_prefetch_kblocks(int n) { prefetch_value().store(clamp_prefetch(n), std::memory_order_relaxed); }

}  // namespace fp8pdl
