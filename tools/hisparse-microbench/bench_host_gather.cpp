// Host gather microbenchmark: the PCIe efficiency of the two ways an SM reads mapped pinned
// memory (kernels/common/host_gather.hpp), on the row patterns the project moves:
//   scattered: 64 requests x 410 rows (the swap-in at batch 64 / 20% miss), each request's rows
//              random and ascending within its own 32K-row region, regions spread over the pool;
//   one_request: 2048 rows of one request (batch 1 / 100% miss);
//   contiguous: consecutive rows (a plane run, or the copy-engine ceiling's pattern);
//   rare_b64 / rare_b1: 2 rows in each of 64 requests / of one request (the misses of a swap-in at
//              batch 64 / batch 1 and 0.1% miss): the host-read floor under those latency targets,
//              a call that already knows its rows.
// Names: host_gather/method:<sm_loads|bulk_async>/row:<bytes>/stride:<bytes>/pattern:<p>/
// blocks_per_sm:<g>; the stride is the packed row or the row rounded up to 128-byte lines.
// Counters: us per call, GB/s, fraction of the measured PCIe H2D ceiling (cudaMemcpy).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/common/host_gather.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

enum class Pattern { scattered, one_request, contiguous, rare_b64, rare_b1 };

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::scattered:
      return "scattered";
    case Pattern::one_request:
      return "one_request";
    case Pattern::rare_b64:
      return "rare_b64";
    case Pattern::rare_b1:
      return "rare_b1";
    default:
      return "contiguous";
  }
}

struct GatherCase {
  kernels::HostReadMethod method;
  std::size_t row_bytes;
  std::size_t stride;  ///< bytes between source rows (>= row_bytes): packed, or lines aligned
  Pattern pattern;
  int blocks_per_sm;  ///< 0: the method's default
};

constexpr int kPoolGb = 16;
constexpr std::int64_t kRegionRows = 32768;

std::string case_name(const GatherCase& c) {
  return fmt::format("host_gather/method:{}/row:{}/stride:{}/pattern:{}/blocks_per_sm:{}",
                     kernels::host_read_method_name(c.method), c.row_bytes, c.stride,
                     pattern_name(c.pattern), c.blocks_per_sm);
}

#if HISPARSE_WITH_CUDA
struct RequestRows {
  int requests, per_request;
};
/// How many requests a scattered pattern spreads its rows over, and how many rows each.
RequestRows request_rows(Pattern p) {
  switch (p) {
    case Pattern::scattered:
      return {64, 410};
    case Pattern::rare_b64:
      return {64, 2};
    case Pattern::rare_b1:
      return {1, 2};
    default:
      return {1, 2048};
  }
}

/// Source rows (in units of row_bytes from the pool's start) of one call.
std::vector<std::int32_t> source_rows(const GatherCase& c, std::size_t pool_bytes,
                                      std::uint64_t seed) {
  const auto pool_rows = static_cast<std::int64_t>(pool_bytes / c.stride);
  std::vector<std::int32_t> rows;
  if (c.pattern == Pattern::contiguous) {
    const auto n = static_cast<std::int64_t>((std::size_t{32} << 20) / c.stride);
    for (std::int64_t i = 0; i < n; ++i) rows.push_back(static_cast<std::int32_t>(i));
    return rows;
  }
  const auto [requests, per_request] = request_rows(c.pattern);
  const std::int64_t region_gap = pool_rows / requests;
  Rng rng(seed);
  for (int r = 0; r < requests; ++r) {
    std::vector<std::int32_t> mine;
    while (static_cast<int>(mine.size()) < per_request) {
      const auto t = static_cast<std::int32_t>(r * region_gap + rng.below(kRegionRows));
      if (std::find(mine.begin(), mine.end(), t) == mine.end()) mine.push_back(t);
    }
    std::sort(mine.begin(), mine.end());
    rows.insert(rows.end(), mine.begin(), mine.end());
  }
  return rows;
}

void run_gather(benchmark::State& state, const GatherCase& c) {
  const std::size_t pool_bytes = static_cast<std::size_t>(kPoolGb) << 30;
  const Allocation& pool = cached_pinned_pool(pool_bytes);
  if (pool_bytes / c.stride > 0x7fffffffu)
    throw Error("host_gather", "pool rows overflow int32", "use larger rows");
  Stream stream(Backend::cuda);
  GpuTimer timer(stream);
  L2Flusher l2;
  // Four row lists cycled through, so that no call finds its rows' translations warm.
  constexpr int kVariants = 4;
  std::vector<Buffer<std::int32_t>> lists;
  std::int64_t rows = 0;
  for (int v = 0; v < kVariants; ++v) {
    const auto host = source_rows(c, pool_bytes, 11 + static_cast<std::uint64_t>(v));
    rows = static_cast<std::int64_t>(host.size());
    lists.push_back(Buffer<std::int32_t>::device(host.size(), Backend::cuda, "row list"));
    copy_bytes(lists.back().device_data(), host.data(), host.size() * 4, Backend::cuda);
  }
  auto dst = Buffer<std::uint8_t>::device(static_cast<std::size_t>(rows) * c.row_bytes,
                                          Backend::cuda, "gathered rows");
  kernels::HostGatherArgs a;
  a.src = static_cast<const std::uint8_t*>(pool.device_data());
  a.src_stride = c.stride;
  a.dst = dst.device_data();
  a.dst_stride = c.row_bytes;
  a.row_bytes = c.row_bytes;
  a.rows = rows;
  const int blocks = c.blocks_per_sm > 0 ? c.blocks_per_sm * sm_count() : 0;
  std::vector<std::unique_ptr<CapturedGraph>> graphs;
  for (int v = 0; v < kVariants; ++v) {
    a.src_rows = lists[static_cast<std::size_t>(v)].device_data();
    kernels::launch_host_gather(a, c.method, blocks, stream.native());  // sets attributes
    graphs.push_back(std::make_unique<CapturedGraph>(
        stream, [&](cudaStream_t s) { kernels::launch_host_gather(a, c.method, blocks, s); }));
  }
  stream.synchronize();
  const double per_call = time_calls(
      state, timer, [&](std::size_t) { l2.flush(stream); },
      [&](std::size_t i) { graphs[i % kVariants]->launch(stream); });
  const double gbps = static_cast<double>(rows) * static_cast<double>(c.row_bytes) / per_call / 1e9;
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["GBps"] = gbps;
  state.counters["pcie_fraction"] = gbps / pcie_h2d_gbps();
  state.counters["rows"] = static_cast<double>(rows);
  state.SetLabel(fmt::format("{} GiB pinned pool, PCIe ceiling {:.1f} GB/s (copy engine)", kPoolGb,
                             pcie_h2d_gbps()));
}
#endif

void bench_gather(benchmark::State& state, [[maybe_unused]] GatherCase c) {
  guarded(state, "host_gather", [&] { HISPARSE_GPU_ONLY(run_gather(state, c)); });
}

[[maybe_unused]] const bool registered = [] {
  for (const auto method : {kernels::HostReadMethod::sm_loads, kernels::HostReadMethod::bulk_async})
    for (const std::size_t row : {std::size_t{656}, std::size_t{1152}, std::size_t{4096}}) {
      // Packed rows, and for SM loads (the faster method) rows padded to whole 128-byte lines.
      std::vector<std::size_t> strides{row};
      if (row % 128 != 0 && method == kernels::HostReadMethod::sm_loads)
        strides.push_back((row + 127) / 128 * 128);
      for (const std::size_t stride : strides)
        for (const auto pattern : {Pattern::scattered, Pattern::one_request, Pattern::contiguous})
          for (const int per_sm : {0, 8, 32}) {
            const GatherCase c{method, row, stride, pattern, per_sm};
            register_timed(case_name(c), bench_gather, c);
          }
    }
  // The latency floor of the 0.1% swap-in targets: packed 656-B rows, SM loads, default grid.
  for (const auto pattern : {Pattern::rare_b64, Pattern::rare_b1}) {
    const GatherCase c{kernels::HostReadMethod::sm_loads, 656, 656, pattern, 0};
    register_timed(case_name(c), bench_gather, c);
  }
  return true;
}();

}  // namespace
}  // namespace hisparse::microbench
