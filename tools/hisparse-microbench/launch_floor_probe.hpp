// Device half of the launch-floor probe (bench_launch_floor.cpp): kernels that do nothing but
// what a swap-in's smallest call cannot avoid, to time the floor of a one- or two-kernel graph.
#pragma once

#include <cstdint>

#if HISPARSE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hisparse::microbench {

/// One graph's launches: `nodes` kernels (1 or 2) of `blocks` x `threads`, each thread of the
/// first storing `writes_per_block / threads` ints of -1 (the padding rows of a swap-in's
/// output) into `sink`; the second kernel, like the swap-in's copy, launched with programmatic
/// dependent launch when `pdl` and waiting for the first (griddepcontrol) before one store.
/// Also the benchmark's case (its names list every field but `sink`).
struct LaunchFloorArgs {
  int nodes = 1;
  bool pdl = false;
  int blocks = 1;
  int threads = 1024;
  int writes_per_block = 0;
  std::int32_t* sink = nullptr;  ///< blocks x max(writes_per_block, threads) ints
};
#if HISPARSE_WITH_CUDA
void launch_floor_kernels(const LaunchFloorArgs& a, cudaStream_t stream);
#endif

/// How launch_code_fetch_kernel lays out its code.
enum class CodeLayout {
  straight,  ///< straight-line code, 16 bytes per step
  loop,      ///< a loop over a 64-step body
  jumps,     ///< straight-line code that jumps over a 64-step block after every 64 steps
};

/// The layout's name in benchmark names: "straight", "loop" or "jumps".
[[nodiscard]] constexpr const char* code_layout_name(CodeLayout layout) noexcept {
  switch (layout) {
    case CodeLayout::loop:
      return "loop";
    case CodeLayout::jumps:
      return "jumps";
    case CodeLayout::straight:
      break;
  }
  return "straight";
}

/// A one-kernel graph whose block executes `instructions` integer multiply-adds (8 independent
/// register chains) before one store per thread, laid out as `layout` says: the same issue work
/// as straight-line code, as a compact loop, or with a taken branch every 64 steps. The
/// differences are what cold instruction fetch costs a kernel that runs its code once per call,
/// as the swap-in's resolve does. `sink` holds `threads` ints.
struct CodeFetchArgs {
  int instructions = 1024;  ///< 0, 1024 or 4096 (the compiled instances)
  CodeLayout layout = CodeLayout::straight;
  int threads = 32;
  std::int32_t* sink = nullptr;
};
#if HISPARSE_WITH_CUDA
void launch_code_fetch_kernel(const CodeFetchArgs& a, cudaStream_t stream);

/// `blocks` blocks of one warp, each running kCodeEvictionBytes of straight-line code, more than
/// an SM's instruction caches hold: with a few blocks per SM, every SM's instruction caches lose
/// what they held (CodeCacheEvictor). `sink` holds 32 ints (block 0's results).
void launch_code_cache_eviction(int blocks, std::int32_t* sink, cudaStream_t stream);
#endif
/// SASS bytes each block of launch_code_cache_eviction runs (16 B per multiply-add).
inline constexpr int kCodeEvictionBytes = 16 * 16384;

}  // namespace hisparse::microbench
