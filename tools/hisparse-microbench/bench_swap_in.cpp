// Swap-in microbenchmark: batch x hot x row bytes x miss rate at top_k 2048, 32K context, over a
// host pool of 1, 16 or 64 GB (each request's rows in its own contiguous region, regions spread
// over the whole pool). Each iteration restores the hot-buffer tables (so every call sees the
// same miss rate), flushes L2, then times one CUDA-graph replay of the swap-in (resolve + copy).
// Counters: us per call, missed GB/s, fraction of the measured PCIe H2D ceiling, misses per call.
// Names: swap_in/pool_gb:<P>/batch:<B>/hot:<H>/row:<R>/miss:<M>. Families for the tuning:
// swap_in_part, swap_in_diag, swap_in_tune, swap_in_path (the two resolve paths) and
// swap_in_phases (per-phase time inside the resolve block, from the kernel's phase stamps) and
// swap_in_fetch/.../fetch:0|1 (few misses fetched by the resolve block, MissPlan::fetched) and
// swap_in_stride/.../stride:<bytes> (host rows padded to 128-byte lines) and
// swap_in_early/.../early:0|1 (the copy's early hand-off, MissPlan::ready) and
// swap_in_spec/.../spec:0|1 (the copy's speculative gather from the residency bitmap) and
// swap_in_code/.../path:<P>/icache:kept|evicted (the SMs' instruction caches as the last call
// left them, or evicted before each call) and swap_in_enqueue/.../part:host_launch|host_graph
// (the host time of enqueuing one call: CPU time, not GPU time) and
// swap_in_context/.../context:131072/path:<P> (rows past the direct table's 32K tokens).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

constexpr int kTopK = 2048;
constexpr std::int64_t kContext = 32768;  ///< tokens per request unless a case says otherwise
constexpr int kVariants =
    4;  ///< distinct selections cycled through, so L2 never holds a call's misses

/// What one replay of the timed graph runs: the whole swap-in, one of its kernels (the other
/// half runs untimed when needed), or a one-node graph (a 4-byte memset) that shows what graph
/// launch and the timing events cost by themselves. host_launch / host_graph: the host time that
/// enqueuing one whole swap-in takes, through the launcher (kernels::launch_swap_in, as an
/// uncaptured decode step calls it) or as one graph launch (not GPU time).
enum class Part { full, resolve, copy, graph, host_launch, host_graph };

const char* part_name(Part p) {
  switch (p) {
    case Part::full:
      return "full";
    case Part::resolve:
      return "resolve";
    case Part::copy:
      return "copy";
    case Part::graph:
      return "graph";
    case Part::host_launch:
      return "host_launch";
    default:
      return "host_graph";
  }
}

struct SwapInCase {
  int pool_gb;
  int batch;
  int hot;
  std::size_t row_bytes;
  double miss_rate;
  Part part = Part::full;
  /// Bytes between rows of the host pool and the hot buffer; 0: packed (row_bytes). Rows are
  /// copied row_bytes at a time, or the whole stride with copy_stride (the padding travels with
  /// the row, as with HostKvPool's RowPadding::align16 / align64).
  std::size_t stride = 0;
  bool copy_stride = false;
  int sort_misses_from = -1;     ///< SwapInArgs tuning; -1: the library default
  int copy_blocks_per_sm = 0;    ///< 0: the library default
  int copy_rows_per_chunk = -1;  ///< -1: the library default
  bool flush_l2 = true;          ///< false: L2 (and the TLBs) keep what the previous call left
  /// Evict every SM's instruction caches before each call (CodeCacheEvictor), as other kernels'
  /// code would between two layers' swap-ins; false: a replay finds its code where the last left it.
  bool evict_code = false;
  /// The case's resolve path; unset: default_resolve() (the library default unless
  /// HISPARSE_MICROBENCH_RESOLVE names another).
  std::optional<kernels::ResolvePath> resolve = std::nullopt;
  bool fetch_in_resolve = true;  ///< MissPlan::fetched (the library default)
  bool early_handoff = true;     ///< MissPlan::ready (the library default)
  bool speculate = true;         ///< residency bitmap + MissPlan::entry_slot (the library default)
  bool phases = false;  ///< record the resolve kernel's phase stamps (block 0) and report them
  /// long: every row past `hot` (the real case); short: seq_len = hot (the no-I/O path); padding:
  /// no real rows (every row only writes -1).
  enum class Path { long_seq, short_seq, padding } path = Path::long_seq;
  /// Tokens per request (seq_len of the long path); above kResolveDirectTokens (32K) the resolve
  /// takes its general path.
  std::int64_t context = kContext;
};

#if HISPARSE_WITH_CUDA
void run_swap_in(benchmark::State& state, const SwapInCase& c) {
  const std::size_t pool_bytes = static_cast<std::size_t>(c.pool_gb) << 30;
  const Allocation& pool = cached_pinned_pool(pool_bytes);
  const std::size_t stride = c.stride > 0 ? c.stride : c.row_bytes;
  const std::size_t region = static_cast<std::size_t>(c.context) * stride;
  if (region > pool_bytes)
    throw Error("swap_in benchmark", "pool smaller than one request's region");
  // Spread the requests' regions over the whole pool (overlapping when the pool is small).
  std::size_t request_stride =
      c.batch > 1 ? (pool_bytes - region) / static_cast<std::size_t>(c.batch - 1) : 0;
  request_stride = request_stride / 64 / stride * 64 * stride;

  const auto batch = static_cast<std::size_t>(c.batch);
  const auto hot = static_cast<std::size_t>(c.hot);
  // Slot s holds token s; LRU order 0..hot-1. Hits are resident tokens, misses are tokens in
  // [hot, context - 1), all distinct, drawn at random over the request's region.
  std::vector<std::int32_t> slot_token(batch * hot), lru(batch * hot);
  for (std::size_t b = 0; b < batch; ++b) {
    std::iota(slot_token.begin() + static_cast<std::ptrdiff_t>(b * hot),
              slot_token.begin() + static_cast<std::ptrdiff_t>((b + 1) * hot), 0);
    std::iota(lru.begin() + static_cast<std::ptrdiff_t>(b * hot),
              lru.begin() + static_cast<std::ptrdiff_t>((b + 1) * hot), 0);
  }
  const int misses_per_request = static_cast<int>(std::lround(c.miss_rate * kTopK));
  Rng rng(42);
  std::vector<std::int32_t> variants(kVariants * batch * kTopK);
  for (std::size_t v = 0; v < kVariants; ++v)
    for (std::size_t b = 0; b < batch; ++b) {
      std::int32_t* sel = variants.data() + (v * batch + b) * kTopK;
      std::vector<std::int32_t> hits(hot);
      std::iota(hits.begin(), hits.end(), 0);
      for (int i = 0; i < kTopK - misses_per_request; ++i) {  // partial Fisher-Yates: distinct hits
        std::swap(hits[static_cast<std::size_t>(i)],
                  hits[static_cast<std::size_t>(i) + rng.below(hot - static_cast<std::size_t>(i))]);
        sel[i] = hits[static_cast<std::size_t>(i)];
      }
      std::vector<char> used(static_cast<std::size_t>(c.context), 0);
      for (int i = kTopK - misses_per_request; i < kTopK; ++i) {
        std::int32_t t;
        do {
          t = static_cast<std::int32_t>(hot +
                                        rng.below(static_cast<std::uint64_t>(c.context - 1) - hot));
        } while (used[static_cast<std::size_t>(t)]);
        used[static_cast<std::size_t>(t)] = 1;
        sel[i] = t;
      }
    }

  // Residency bitmap: tokens 0..hot-1 are resident (slot s holds token s).
  const std::size_t words = (static_cast<std::size_t>(c.context) + 31) / 32;
  std::vector<std::uint32_t> resident(batch * words, 0u);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t t = 0; t < hot; ++t) resident[b * words + t / 32] |= 1u << (t % 32);
  auto d_resident0 = device_copy(resident, "residency snapshot");
  auto d_resident = device_copy(resident, "residency bitmap");
  auto d_entry_slot = Buffer<std::int32_t>::device(batch * kTopK, Backend::cuda, "entry slots");
  auto d_slot0 = device_copy(slot_token, "slot table snapshot");
  auto d_lru0 = device_copy(lru, "LRU snapshot");
  auto d_slot = device_copy(slot_token, "slot table");
  auto d_lru = device_copy(lru, "LRU order");
  auto d_variants = device_copy(variants, "selections");
  auto d_sel = Buffer<std::int32_t>::device(batch * kTopK, Backend::cuda, "selection");
  const auto seq_len = static_cast<std::int32_t>(
      c.path == SwapInCase::Path::short_seq ? static_cast<std::int64_t>(c.hot) : c.context);
  auto d_lens = device_copy(std::vector<std::int32_t>(batch, seq_len), "seq_lens");
  auto d_real = device_copy(
      std::vector<std::int32_t>{c.path == SwapInCase::Path::padding ? 0 : c.batch}, "num_real");
  auto d_rows = Buffer<std::uint8_t>::device(batch * (hot + 1) * stride, Backend::cuda, "hot rows");
  auto d_out = Buffer<std::int32_t>::device(batch * kTopK, Backend::cuda, "physical rows");
  auto d_stats = Buffer<std::int32_t>::device(2 * batch, Backend::cuda, "stats");
  auto d_count = Buffer<std::int32_t>::device(batch, Backend::cuda, "plan count");
  auto d_plan_slot = Buffer<std::int32_t>::device(batch * kTopK, Backend::cuda, "plan slot");
  auto d_plan_token = Buffer<std::int32_t>::device(batch * kTopK, Backend::cuda, "plan token");

  kernels::SwapInArgs a;
  a.selected = d_sel.device_data();
  a.seq_lens = d_lens.device_data();
  a.num_real = d_real.device_data();
  a.hot_buffer = {d_slot.device_data(), d_lru.device_data(), d_rows.device_data(), stride};
  a.host_pool = {static_cast<const std::uint8_t*>(pool.device_data()), request_stride, stride};
  a.copy_bytes = c.copy_stride && c.stride > 0 ? c.stride : c.row_bytes;
  a.physical_rows = d_out.device_data();
  a.stats = d_stats.device_data();
  auto d_fetched =
      Buffer<std::int32_t>::device(static_cast<std::size_t>(c.batch), Backend::cuda, "fetched");
  auto d_ready = device_copy(std::vector<std::int32_t>(batch + 1, 0), "ready flags");
  a.plan = {d_count.device_data(),
            d_plan_slot.device_data(),
            d_plan_token.device_data(),
            c.fetch_in_resolve ? d_fetched.device_data() : nullptr,
            c.early_handoff ? d_ready.device_data() : nullptr,
            c.speculate ? d_entry_slot.device_data() : nullptr};
  if (c.speculate) {
    a.hot_buffer.resident = d_resident.device_data();
    a.hot_buffer.resident_words = words;
  }
  a.batch = c.batch;
  a.top_k = kTopK;
  a.hot = c.hot;
  a.sort_misses_from = c.sort_misses_from;
  if (c.copy_blocks_per_sm > 0) a.copy_blocks = c.copy_blocks_per_sm * sm_count();
  a.copy_rows_per_chunk = c.copy_rows_per_chunk;
  a.resolve = c.resolve.value_or(default_resolve());
  // A case on the library's default path knows its rows' length, as HotCache passes its pool
  // capacity; a case that names its path (swap_in_path, swap_in_code, ...) runs exactly that
  // kernel.
  if (!c.resolve) a.max_seq_len = seq_len;
  constexpr int kStamps = kernels::kSwapInPhaseStamps;
  auto d_stamps = Buffer<std::uint64_t>::device(2 * kStamps, Backend::cuda, "phase stamps");
  if (c.phases) a.phase_stamps = d_stamps.device_data();
  kernels::configure_swap_in(kTopK, c.hot);

  Stream stream(Backend::cuda);
  L2Flusher l2;
  std::optional<CodeCacheEvictor> code_caches;
  if (c.evict_code) code_caches.emplace();
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, [&](cudaStream_t s) {
    switch (c.part) {
      case Part::full:
      case Part::host_launch:
      case Part::host_graph:
        kernels::launch_swap_in(a, s);
        break;
      case Part::resolve:
        kernels::launch_swap_in_resolve(a, s);
        break;
      case Part::copy:
        kernels::launch_swap_in_copy(a, s);
        break;
      case Part::graph:
        HISPARSE_CUDA_CHECK(cudaMemsetAsync(a.stats, 0, sizeof(std::int32_t), s));
        break;
    }
  });
  const std::size_t table_bytes = batch * hot * sizeof(std::int32_t);
  auto prepare = [&](std::size_t v) {
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(
        d_sel.device_data(), d_variants.device_data() + v * batch * kTopK,
        batch * kTopK * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream.native()));
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(d_slot.device_data(), d_slot0.device_data(), table_bytes,
                                        cudaMemcpyDeviceToDevice, stream.native()));
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(d_lru.device_data(), d_lru0.device_data(), table_bytes,
                                        cudaMemcpyDeviceToDevice, stream.native()));
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(d_resident.device_data(), d_resident0.device_data(),
                                        resident.size() * sizeof(std::uint32_t),
                                        cudaMemcpyDeviceToDevice, stream.native()));
    // Timing the copy alone: this selection's plan comes from an untimed resolve (which touches
    // no host memory, so the host pages stay as cold as in a full call).
    if (c.part == Part::copy) kernels::launch_swap_in_resolve(a, stream.native());
    if (code_caches) code_caches->evict(stream);
    if (c.flush_l2) l2.flush(stream);
    if (c.phases)
      HISPARSE_CUDA_CHECK(cudaMemsetAsync(d_stamps.device_data(), 0,
                                          2 * kStamps * sizeof(std::uint64_t), stream.native()));
  };

  // Warm-up (the whole swap-in, then one replay), and a check that the call misses exactly what
  // the case asks for.
  prepare(0);
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(d_slot.device_data(), d_slot0.device_data(), table_bytes,
                                      cudaMemcpyDeviceToDevice, stream.native()));
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(d_lru.device_data(), d_lru0.device_data(), table_bytes,
                                      cudaMemcpyDeviceToDevice, stream.native()));
  kernels::launch_swap_in(a, stream.native());
  stream.synchronize();
  std::vector<std::int32_t> counts(batch);
  copy_bytes(counts.data(), d_count.device_data(), batch * sizeof(std::int32_t), Backend::cuda);
  prepare(0);
  graph.launch(stream);
  stream.synchronize();
  const std::int64_t misses = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const std::int64_t expected = c.path == SwapInCase::Path::long_seq
                                    ? static_cast<std::int64_t>(misses_per_request) * c.batch
                                    : 0;
  if (misses != expected) {
    state.SkipWithError(
        fmt::format("expected {} misses per call, got {}", expected, misses).c_str());
    return;
  }

  if (c.part == Part::host_launch || c.part == Part::host_graph) {
    // Host time of the enqueue alone, on an idle stream: the inputs are restored and the stream
    // drained before each call, and the call is drained after the clock stops.
    double total = 0.0;
    std::size_t i = 0;
    for (auto _ : state) {
      prepare(i++ % kVariants);
      stream.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      if (c.part == Part::host_launch)
        kernels::launch_swap_in(a, stream.native());
      else
        graph.launch(stream);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      stream.synchronize();
      state.SetIterationTime(seconds);
      total += seconds;
    }
    state.counters["host_us_per_call"] = total / static_cast<double>(i) * 1e6;
    state.SetLabel("host time to enqueue one swap-in (CPU), not GPU time");
    return;
  }

  // Phase k (1..kStamps-1) runs from stamp k-1 to stamp k: summed ns (global timer) and cycles.
  std::vector<double> phase_ns(kStamps, 0.0), phase_cycles(kStamps, 0.0);
  std::vector<std::uint64_t> stamps(2 * kStamps);
  int phase_calls = 0;
  const double per_call = time_calls(
      state, timer, [&](std::size_t i) { prepare(i % kVariants); },
      [&](std::size_t) { graph.launch(stream); },
      [&](std::size_t) {
        if (!c.phases) return;
        copy_bytes(stamps.data(), d_stamps.device_data(), stamps.size() * sizeof(std::uint64_t),
                   Backend::cuda);
        if (!std::all_of(stamps.begin(), stamps.end(), [](std::uint64_t x) { return x != 0; }))
          return;
        ++phase_calls;
        for (int k = 1; k < kStamps; ++k) {
          phase_ns[k] += static_cast<double>(stamps[k] - stamps[k - 1]);
          phase_cycles[k] += static_cast<double>(stamps[kStamps + k] - stamps[kStamps + k - 1]);
        }
      });
  if (c.phases) {
    if (phase_calls == 0) {
      state.SkipWithError("no call recorded all phase stamps (block 0 took a short path)");
      return;
    }
    double all_ns = 0.0, all_cycles = 0.0;
    for (int k = 1; k < kStamps; ++k) {
      const std::string name = fmt::format("ph{}_{}", k, kernels::swap_in_phase_name(k));
      state.counters[name + "_us"] = phase_ns[k] / phase_calls * 1e-3;
      state.counters[name + "_kcyc"] = phase_cycles[k] / phase_calls * 1e-3;
      all_ns += phase_ns[k];
      all_cycles += phase_cycles[k];
    }
    state.counters["ph_all_us"] = all_ns / phase_calls * 1e-3;
    state.counters["ph_all_kcyc"] = all_cycles / phase_calls * 1e-3;
  }
  const double missed_bytes = static_cast<double>(misses) * static_cast<double>(c.row_bytes);
  const double gbps = missed_bytes / per_call / 1e9;
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["missed_GBps"] = gbps;
  state.counters["pcie_fraction"] = gbps / pcie_h2d_gbps();
  state.counters["misses"] = static_cast<double>(misses);
  state.counters["pool_GB"] = c.pool_gb;
  state.SetLabel(fmt::format("pool {} GiB, request regions {} MiB apart, PCIe ceiling {:.1f} GB/s",
                             c.pool_gb, request_stride >> 20, pcie_h2d_gbps()));
}
#endif

void bench_swap_in(benchmark::State& state, [[maybe_unused]] SwapInCase c) {
  guarded(state, "swap_in", [&] { HISPARSE_GPU_ONLY(run_swap_in(state, c)); });
}

void register_case(const std::string& name, const SwapInCase& c) {
  register_timed(name, bench_swap_in, c);
}

std::string case_name(const char* family, const SwapInCase& c) {
  return fmt::format("{}/pool_gb:{}/batch:{}/hot:{}/row:{}/miss:{}", family, c.pool_gb, c.batch,
                     c.hot, c.row_bytes, c.miss_rate);
}

bool register_swap_in() {
  for (int pool_gb : {1, 16, 64})  // outermost: one pinned pool alive at a time
    for (std::size_t row : {656, 584, 1152})
      for (int hot : {4096, 2048, 8192})
        for (int batch : {1, 8, 16, 32, 64, 100, 128})
          for (double miss : {0.001, 0.2, 1.0}) {
            const SwapInCase c{pool_gb, batch, hot, row, miss};
            register_case(case_name("swap_in", c), c);
          }
  // Where the time goes (16 GB pool, 656-B rows, hot 4096): each kernel alone and a one-node
  // graph.
  for (int batch : {1, 64})
    for (double miss : {0.001, 0.2, 1.0})
      for (Part part : {Part::full, Part::resolve, Part::copy, Part::graph}) {
        if (part == Part::graph && miss != 0.001) continue;
        SwapInCase c{16, batch, 4096, 656, miss};
        c.part = part;
        register_case(case_name("swap_in_part", c) + fmt::format("/part:{}", part_name(part)), c);
      }
  // What a swap-in call costs the host: the launcher (an uncaptured decode step's per-layer call)
  // against one graph launch.
  for (int batch : {1, 64})
    for (Part part : {Part::host_launch, Part::host_graph}) {
      SwapInCase c{16, batch, 4096, 656, 0.001};
      c.part = part;
      register_case(case_name("swap_in_enqueue", c) + fmt::format("/part:{}", part_name(part)), c);
    }
  // Where the resolve's time goes at few misses: without the L2 flush, on the short-sequence
  // path (no hash, no tables) and on padding rows only (launch, first loads, -1 writes).
  using Path = SwapInCase::Path;
  for (int batch : {1, 64})
    for (Path path : {Path::long_seq, Path::short_seq, Path::padding})
      for (bool flush : {true, false})
        for (Part part : {Part::resolve, Part::copy, Part::full}) {
          if (path != Path::long_seq && part != Part::resolve) continue;
          SwapInCase c{16, batch, 4096, 656, 0.001};
          c.part = part;
          c.path = path;
          c.flush_l2 = flush;
          const char* path_name = path == Path::long_seq    ? "long"
                                  : path == Path::short_seq ? "short"
                                                            : "padding";
          register_case(
              case_name("swap_in_diag", c) + fmt::format("/part:{}/path:{}/flush:{}",
                                                         part_name(part), path_name, flush ? 1 : 0),
              c);
        }
  // The resolve paths (ResolvePath::hash: the kernel of calls 1-3; direct: token-indexed table,
  // hit words without atomics, one-tile rows on the lean path; direct_compact: direct with the
  // lean path of one slot count in a kernel of its own and the general code called;
  // direct_general: direct without the lean path), the whole swap-in and the resolve alone.
  using kernels::ResolvePath;
  const auto path_name = kernels::resolve_path_name;
  for (int batch : {1, 64, 100})
    for (int hot : {4096, 8192})
      for (double miss : {0.001, 0.2, 1.0})
        for (Part part : {Part::full, Part::resolve})
          for (ResolvePath resolve : kernels::kResolvePaths) {
            SwapInCase c{16, batch, hot, 656, miss};
            c.part = part;
            c.resolve = resolve;
            register_case(case_name("swap_in_path", c) +
                              fmt::format("/part:{}/path:{}", part_name(part), path_name(resolve)),
                          c);
          }
  // Rows longer than the direct table (32K tokens) take the resolve's general path: inlined in
  // swap_in_resolve, a called function in the compact kernel (direct_compact), whose cost on
  // long rows decides whether the compact kernel can be the default. The resolve alone and the
  // whole call, at 32K (the lean path) and 128K tokens.
  for (std::int64_t context : {std::int64_t{32768}, std::int64_t{131072}})
    for (int batch : {1, 64})
      for (double miss : {0.001, 0.2})
        for (Part part : {Part::full, Part::resolve})
          for (ResolvePath resolve : {ResolvePath::direct, ResolvePath::direct_compact}) {
            SwapInCase c{16, batch, 4096, 656, miss};
            c.context = context;
            c.part = part;
            c.resolve = resolve;
            register_case(case_name("swap_in_context", c) +
                              fmt::format("/context:{}/part:{}/path:{}", c.context, part_name(part),
                                          path_name(resolve)),
                          c);
          }
  // Where the time goes inside the resolve block: phase stamps of block 0 (adds one barrier per
  // phase; the counters ph<k>_<phase>_us / _kcyc are means over the calls).
  for (int batch : {1, 64})
    for (double miss : {0.001, 0.2})
      for (ResolvePath resolve : kernels::kResolvePaths)
        for (int hot : {4096, 8192}) {
          SwapInCase c{16, batch, hot, 656, miss};
          c.part = Part::resolve;
          c.resolve = resolve;
          c.phases = true;
          register_case(
              case_name("swap_in_phases", c) + fmt::format("/path:{}", path_name(resolve)), c);
        }
  // Few misses fetched by the resolve block itself (MissPlan::fetched) or all by the copy kernel.
  for (int batch : {1, 64})
    for (double miss : {0.001, 0.01, 0.2, 1.0})
      for (bool fetch : {false, true}) {
        SwapInCase c{16, batch, 4096, 656, miss};
        c.speculate = false;  // the speculative gather turns the resolve's fetch off
        c.fetch_in_resolve = fetch;
        register_case(case_name("swap_in_fetch", c) + fmt::format("/fetch:{}", fetch ? 1 : 0), c);
      }
  // Host rows padded to whole 128-byte lines (656 -> 768 B; still 656 B copied per row): the
  // GPU's reads of host memory then start on a line.
  for (int batch : {1, 64, 100})
    for (double miss : {0.001, 0.2, 1.0})
      for (std::size_t stride : {std::size_t{656}, std::size_t{768}}) {
        SwapInCase c{16, batch, 4096, 656, miss};
        c.stride = stride;
        register_case(case_name("swap_in_stride", c) + fmt::format("/stride:{}", stride), c);
      }
  // 584-B rows (not a multiple of 16 B, so copied with 8-B loads) against the same rows padded to
  // 592 B and copied whole with 16-B loads (RowPadding::align16).
  for (int batch : {1, 64, 100})
    for (double miss : {0.001, 0.2, 1.0})
      for (bool padded : {false, true}) {
        SwapInCase c{16, batch, 4096, 584, miss};
        c.stride = padded ? 592 : 584;
        c.copy_stride = padded;
        register_case(case_name("swap_in_stride", c) +
                          fmt::format("/stride:{}/copy:{}", c.stride, padded ? 592 : 584),
                      c);
      }
  // The copy kernel started with the resolve, gathering each row once its misses are numbered
  // (MissPlan::ready), or waiting for the whole resolve grid.
  for (int batch : {1, 4, 7, 8, 16, 64, 100})
    for (double miss : {0.001, 0.01, 0.2, 1.0})
      for (bool early : {false, true}) {
        SwapInCase c{16, batch, 4096, 656, miss};
        c.speculate = false;  // the plain early hand-off (swap_in_spec compares the two)
        c.early_handoff = early;
        register_case(case_name("swap_in_early", c) + fmt::format("/early:{}", early ? 1 : 0), c);
      }
  // The copy kernel loading the rows the residency bitmap calls not resident as soon as it starts
  // (spec:1, the default with the early hand-off) or after the resolve has listed the misses.
  for (int batch : {1, 4, 7})
    for (double miss : {0.001, 0.01, 0.2, 1.0})
      for (bool spec : {false, true}) {
        SwapInCase c{16, batch, 4096, 656, miss};
        c.speculate = spec;
        register_case(case_name("swap_in_spec", c) + fmt::format("/spec:{}", spec ? 1 : 0), c);
      }
  // The resolve's code cold in the SMs' instruction caches (evicted before each call, as other
  // kernels' code would between two layers' swap-ins) or as the last replay left it, on the
  // inlined and the compact resolve kernels.
  for (int batch : {1, 64})
    for (double miss : {0.001, 0.2, 1.0})
      for (ResolvePath resolve : {ResolvePath::direct, ResolvePath::direct_compact})
        for (bool evict : {false, true}) {
          SwapInCase c{16, batch, 4096, 656, miss};
          c.resolve = resolve;
          c.evict_code = evict;
          register_case(
              case_name("swap_in_code", c) +
                  fmt::format("/path:{}/icache:{}", path_name(resolve), evict ? "evicted" : "kept"),
              c);
        }
  // Copy tuning: plan grouped by host address (sort:1) or not, copy blocks per SM, rows per chunk
  // (0: the size that gives each block at most one chunk; else a fixed size).
  auto tune = [](int batch, double miss, int sort, int per_sm, int rows) {
    SwapInCase c{16, batch, 4096, 656, miss};
    c.speculate = false;  // the miss-plan copy's chunking (the speculative gather has none)
    c.sort_misses_from = sort;
    c.copy_blocks_per_sm = per_sm;
    c.copy_rows_per_chunk = rows;
    register_case(case_name("swap_in_tune", c) + fmt::format("/sort:{}/blocks_per_sm:{}/"
                                                             "rows_per_chunk:{}",
                                                             sort, per_sm, rows),
                  c);
  };
  // Large batches: grouping, and many small chunks in waves (fixed sizes need the grouped plan).
  for (int batch : {64, 100})
    for (double miss : {0.2, 1.0})
      for (int per_sm : {4, 8, 16, 24, 32}) {
        tune(batch, miss, 0, per_sm, 0);
        for (int rows : {0, 2, 4, 8, 16}) tune(batch, miss, 1, per_sm, rows);
      }
  // Few misses at batch 64: how much of the call is the copy grid itself (its blocks start, read
  // the counts and leave).
  for (double miss : {0.001, 0.01})
    for (int per_sm : {1, 2, 4, 8, 16, 24, 32})
      for (int rows : {0, 2}) tune(64, miss, 1, per_sm, rows);
  // One request (410 or 2048 rows): the grid and the chunk size, ungrouped.
  for (double miss : {0.2, 1.0})
    for (int per_sm : {1, 2, 4, 8, 16, 32})
      for (int rows : {0, 2, 4, 8, 16}) tune(1, miss, 0, per_sm, rows);
  return true;
}

[[maybe_unused]] const bool registered = register_swap_in();

}  // namespace
}  // namespace hisparse::microbench
