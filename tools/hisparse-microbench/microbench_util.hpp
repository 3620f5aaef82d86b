// Helpers shared by the microbenchmarks: a CUDA-event timer, the measured PCIe ceiling, a
// CUDA-graph capture of a launch sequence, an L2 flush, a cached pinned host pool, and the
// iteration count.
#pragma once

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/ceilings.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_graph.hpp"
#include "core/device.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "launch_floor_probe.hpp"

namespace hisparse::microbench {

/// Runs one benchmark case's body: skipped with a message naming `what` when there is no usable
/// GPU, and with the error's message when the body throws.
template <class F>
void guarded(benchmark::State& state, const char* what, F&& body) {
  std::string why;
  if (!cuda_available(&why)) {
    state.SkipWithError(fmt::format("{} needs a GPU: {}", what, why).c_str());
    return;
  }
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// A GPU benchmark's call inside guarded(): the call on CUDA builds; nothing on CPU-only builds,
/// where the run_* functions do not exist and guarded() skips the case before its body runs.
#if HISPARSE_WITH_CUDA
#define HISPARSE_GPU_ONLY(call) call
#else
#define HISPARSE_GPU_ONLY(call) ((void)0)
#endif

/// The resolve path of the swap-in cases whose name does not give one (`path:` cases keep
/// theirs): HISPARSE_MICROBENCH_RESOLVE, a ResolvePath name, or the library default (direct).
/// So the targets can be measured on another path without a rebuild; the run's context records
/// the override (hisparse_swap_in_resolve). Throws Error naming the variable for an unknown name.
inline kernels::ResolvePath default_resolve() {
  const char* env = std::getenv("HISPARSE_MICROBENCH_RESOLVE");
  if (env == nullptr || *env == '\0') return kernels::ResolvePath::direct;
  if (const auto path = kernels::resolve_path_named(env)) return *path;
  std::vector<std::string_view> names;
  for (const auto path : kernels::kResolvePaths)
    names.emplace_back(kernels::resolve_path_name(path));
  throw Error("HISPARSE_MICROBENCH_RESOLVE", fmt::format("unknown resolve path '{}'", env),
              fmt::format("use one of {}, or unset it", fmt::join(names, ", ")));
}

/// The first-call check of a kernel benchmark: true when `got` is within `bound` of `want` (its
/// CPU twin's result) relative to the result's scale (max |want|, at least 1); else the case is
/// skipped with a message naming `what` and the error, and no timing is reported.
inline bool matches_twin(benchmark::State& state, const std::vector<float>& got,
                         const std::vector<float>& want, double bound, const char* what) {
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  if (got.size() == want.size() && worst <= bound * scale) return true;
  state.SkipWithError(fmt::format("{}: off the CPU twin by {:.3g} of its scale (bound {:.3g})",
                                  what, worst / scale, bound)
                          .c_str());
  return false;
}

/// Iterations per benchmark: HISPARSE_MICROBENCH_ITERS (default 50). Each iteration is one timed
/// call preceded by an untimed state reset and L2 flush.
inline int iterations() {
  const char* env = std::getenv("HISPARSE_MICROBENCH_ITERS");
  const int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : 50;
}

/// Registers a case timed by the GPU (manual time from CUDA events), reported in microseconds,
/// with iterations() iterations. `args` are RegisterBenchmark's: the function, then its extras.
template <class... Args>
auto* register_timed(const std::string& name, Args&&... args) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(args)...)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(iterations());
}

/// One stream's synthetic Fathom planes: random plane words and fp16 scales in [0.5, 2), the same
/// in every Fathom benchmark (the scan's cost does not depend on the values).
inline void random_planes(std::vector<std::uint64_t>& words, std::vector<std::uint16_t>& scales) {
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = random_bits(7, i);
  for (std::size_t i = 0; i < scales.size(); ++i)
    scales[i] = float_to_f16(0.5f + 1.5f * random_uniform(8, i));
}

#if HISPARSE_WITH_CUDA
/// Streaming multiprocessors of the current device.
inline int sm_count() {
  static const int sms = Device::cuda().properties().multiprocessors;
  return sms;
}

/// Times GPU work on a stream with a pair of events.
class GpuTimer {
 public:
  explicit GpuTimer(const Stream& stream)
      : stream_(stream), start_(Backend::cuda), stop_(Backend::cuda) {}
  void start() { start_.record(stream_); }
  /// Records the stop event, waits, and returns seconds.
  double stop_seconds() {
    stop_.record(stream_);
    stop_.synchronize();
    return Event::elapsed_ms(start_, stop_) * 1e-3;
  }

 private:
  const Stream& stream_;
  Event start_, stop_;
};

/// The timing loop of a benchmark: per iteration `before(i)` runs untimed (state reset, L2 flush),
/// `call(i)` is timed with `timer` and becomes the iteration's manual time, and `after(i)` runs
/// untimed once the call is done. Returns the mean seconds per call.
template <class Before, class Call, class After>
double time_calls(benchmark::State& state, GpuTimer& timer, Before&& before, Call&& call,
                  After&& after) {
  double total = 0.0;
  std::size_t i = 0;
  for (auto _ : state) {
    before(i);
    timer.start();
    call(i);
    const double seconds = timer.stop_seconds();
    state.SetIterationTime(seconds);
    total += seconds;
    after(i);
    ++i;
  }
  return state.iterations() > 0 ? total / static_cast<double>(state.iterations()) : 0.0;
}
template <class Before, class Call>
double time_calls(benchmark::State& state, GpuTimer& timer, Before&& before, Call&& call) {
  return time_calls(state, timer, before, call, [](std::size_t) {});
}

/// Pinned host -> device cudaMemcpy bandwidth (GB/s), measured once per process (256 MiB copies).
inline double pcie_h2d_gbps() {
  static const double gbps = measure_ceilings(Device::cuda(), std::size_t{256} << 20, 5).h2d_gbps;
  return gbps;
}
/// HBM ceiling: device-to-device copy, bytes read + written (GB/s), measured once per process.
inline double hbm_copy_gbps() {
  static const double gbps =
      measure_ceilings(Device::cuda(), std::size_t{256} << 20, 5).hbm_copy_gbps;
  return gbps;
}

/// A device buffer holding a copy of `host`.
template <class T>
Buffer<T> device_copy(const std::vector<T>& host, const char* label) {
  auto b = Buffer<T>::device(host.size(), Backend::cuda, label);
  copy_bytes(b.device_data(), host.data(), host.size() * sizeof(T), Backend::cuda);
  return b;
}

/// A captured launch sequence, replayed with one cudaGraphLaunch.
class CapturedGraph : public CudaGraph {
 public:
  CapturedGraph(const Stream& stream, const std::function<void(cudaStream_t)>& launches)
      : CudaGraph(
            stream, [&] { launches(stream.native()); }, "microbenchmark") {}
};

/// Evicts the L2 by writing twice its size (call before a timed region, outside it).
class L2Flusher {
 public:
  L2Flusher() {
    const auto props = Device::cuda().properties();
    buffer_ = Allocation::device(2 * std::max<std::size_t>(props.l2_bytes, std::size_t{1} << 20),
                                 Backend::cuda, "L2 flush buffer");
  }
  void flush(const Stream& stream) {
    HISPARSE_CUDA_CHECK(
        cudaMemsetAsync(buffer_.device_data(), ++value_ & 0xff, buffer_.bytes(), stream.native()));
  }

 private:
  Allocation buffer_;
  int value_ = 0;
};

/// The usual kernel timing: `launches` captured once in a CUDA graph, then per iteration L2
/// flushed (untimed) and the graph replayed (timed). Returns the mean seconds per call.
inline double time_graph_after_l2_flush(benchmark::State& state, const Stream& stream,
                                        const std::function<void(cudaStream_t)>& launches) {
  L2Flusher l2;
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, launches);
  return time_calls(
      state, timer, [&](std::size_t) { l2.flush(stream); },
      [&](std::size_t) { graph.launch(stream); });
}

/// Evicts every SM's instruction caches, which the L2 flush does not reach (call before a timed
/// region, outside it, then flush L2: the eviction's own code leaves L2 too). A kernel timed after
/// it fetches its code as it would after other kernels ran on the SMs, as between a decode step's
/// layers; without it a replayed kernel finds its code where its previous replay left it.
class CodeCacheEvictor {
 public:
  CodeCacheEvictor()
      : sink_(Buffer<std::int32_t>::device(32, Backend::cuda, "code eviction sink")),
        blocks_(kBlocksPerSm * std::max(1, Device::cuda().properties().multiprocessors)) {}
  void evict(const Stream& stream) {
    launch_code_cache_eviction(blocks_, sink_.device_data(), stream.native());
  }

 private:
  // Several blocks per SM, so that the block scheduler leaves no SM out.
  static constexpr int kBlocksPerSm = 8;
  Buffer<std::int32_t> sink_;
  int blocks_;
};
#endif

/// One pinned (mapped) host pool kept across benchmarks: asking for another size frees the old
/// pool first, so a 64 GB pool never coexists with a 16 GB one. Throws Error when pinning fails.
inline const Allocation& cached_pinned_pool(std::size_t bytes) {
  static std::unique_ptr<Allocation> pool;
  if (!pool || pool->bytes() != bytes) {
    pool.reset();
    pool = std::make_unique<Allocation>(
        Allocation::pinned(bytes, Backend::cuda, "microbench host KV pool"));
  }
  return *pool;
}

}  // namespace hisparse::microbench
