// Launch-floor probe: what a one- or two-kernel CUDA graph costs on this GPU before any work, the
// floor under the swap-in's smallest calls (resolve + copy, two nodes, the copy launched with
// programmatic dependent launch). Timed like swap_in: L2 flushed, one graph replay between a pair
// of events.
// Names: launch_floor/nodes:N/pdl:P/blocks:B/writes:W: N kernels of B x 1024 threads, the second
// with programmatic dependent launch when P = 1 and waiting for the first (griddepcontrol);
// the first stores W ints of -1 per block (2048: a swap-in row's padding output at top_k 2048).
// launch_floor_code/threads:T/ops:N/layout:straight|loop|jumps/icache:kept|evicted: one kernel of
// 1 x T threads that runs N multiply-adds as straight-line code, as a compact loop, or with a jump
// over unrun code every 64 (launch_floor_probe.hpp): the cost of fetching code that a kernel runs
// once per call, with the SMs' instruction caches as the last replay left them (kept) or evicted
// before each replay (CodeCacheEvictor), as other kernels' code would between two calls.
// Counter: us per call. No result is checked beyond the kernels' completion: they compute nothing.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "core/memory.hpp"
#include "launch_floor_probe.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

// A launch_floor_code case: the kernel's arguments (sink set when run) and the caches' state.
struct CodeFetchCase {
  CodeFetchArgs args;
  bool evict_code = false;  ///< evict the SMs' instruction caches before each call
};

#if HISPARSE_WITH_CUDA
// One graph of `launch`'s kernels, timed like swap_in: L2 flushed (after evicting the SMs'
// instruction caches when `evict_code`), one replay between events.
template <class Launch>
void time_graph(benchmark::State& state, Launch&& launch, bool evict_code = false) {
  Stream stream(Backend::cuda);
  L2Flusher l2;
  std::optional<CodeCacheEvictor> code_caches;
  if (evict_code) code_caches.emplace();
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, launch);
  graph.launch(stream);  // warm-up
  stream.synchronize();
  const double per_call = time_calls(
      state, timer,
      [&](std::size_t) {
        if (code_caches) code_caches->evict(stream);
        l2.flush(stream);
      },
      [&](std::size_t) { graph.launch(stream); });
  state.counters["us_per_call"] = per_call * 1e6;
}

// `a` is the case; its sink is allocated here.
void run_launch_floor(benchmark::State& state, LaunchFloorArgs a) {
  auto sink = Buffer<std::int32_t>::device(
      static_cast<std::size_t>(a.blocks) *
          static_cast<std::size_t>(std::max(a.writes_per_block, a.threads)),
      Backend::cuda, "launch floor sink");
  a.sink = sink.device_data();
  time_graph(state, [&](cudaStream_t s) { launch_floor_kernels(a, s); });
  state.SetLabel(
      fmt::format("{} kernel(s) of {} x {} threads, empty work", a.nodes, a.blocks, a.threads));
}

void run_code_fetch(benchmark::State& state, CodeFetchCase c) {
  CodeFetchArgs& a = c.args;
  auto sink = Buffer<std::int32_t>::device(static_cast<std::size_t>(a.threads), Backend::cuda,
                                           "code fetch sink");
  a.sink = sink.device_data();
  time_graph(
      state, [&](cudaStream_t s) { launch_code_fetch_kernel(a, s); }, c.evict_code);
  state.SetLabel(fmt::format("1 x {} threads, {} multiply-adds per thread, layout {}, {}",
                             a.threads, a.instructions, code_layout_name(a.layout),
                             c.evict_code ? "instruction caches evicted" : "code left cached"));
}
#endif

void bench_launch_floor(benchmark::State& state, [[maybe_unused]] LaunchFloorArgs c) {
  guarded(state, "launch_floor", [&] { HISPARSE_GPU_ONLY(run_launch_floor(state, c)); });
}

void bench_code_fetch(benchmark::State& state, [[maybe_unused]] CodeFetchCase c) {
  guarded(state, "launch_floor_code", [&] { HISPARSE_GPU_ONLY(run_code_fetch(state, c)); });
}

[[maybe_unused]] const bool registered = [] {
  for (const int nodes : {1, 2})
    for (const bool pdl : {false, true}) {
      if (nodes == 1 && pdl) continue;  // nothing depends on the one kernel
      for (const int blocks : {1, 64})
        for (const int writes : {0, 2048}) {
          LaunchFloorArgs c;  // 1024 threads per block
          c.nodes = nodes;
          c.pdl = pdl;
          c.blocks = blocks;
          c.writes_per_block = writes;
          register_timed(fmt::format("launch_floor/nodes:{}/pdl:{}/blocks:{}/writes:{}", nodes,
                                     pdl ? 1 : 0, blocks, writes),
                         bench_launch_floor, c);
        }
    }
  for (const int threads : {32, 1024})
    for (const int instructions : {0, 1024, 4096})
      for (const CodeLayout layout : {CodeLayout::straight, CodeLayout::loop, CodeLayout::jumps})
        for (const bool evict : {false, true}) {
          if (instructions == 0 && layout != CodeLayout::straight) continue;  // no code either way
          CodeFetchCase c;
          c.args.instructions = instructions;
          c.args.layout = layout;
          c.args.threads = threads;
          c.evict_code = evict;
          register_timed(
              fmt::format("launch_floor_code/threads:{}/ops:{}/layout:{}/icache:{}", threads,
                          instructions, code_layout_name(layout), evict ? "evicted" : "kept"),
              bench_code_fetch, c);
        }
  return true;
}();

}  // namespace
}  // namespace hisparse::microbench
