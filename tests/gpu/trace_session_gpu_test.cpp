// TraceSession on a real GPU: iota kernels and host->device copies inside NVTX phase ranges are
// recorded by CUPTI, linked to their launches, attributed to phases and steps, and written as a
// Perfetto-readable trace.json. Also measures what tracing costs per launch.
//
// Set HISPARSE_TRACE_OUT=<dir> to keep the trace.json and the raw records (text form, usable as a
// CPU fixture) of RecordsKernelsCopiesAndNvtxRanges.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/common/iota.hpp"
#include "support/gpu.hpp"
#include "trace/chrome_trace_writer.hpp"
#include "trace/nvtx.hpp"
#include "trace/record_text.hpp"
#include "trace/timeline.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::trace {
namespace {

// NVTX reads NVTX_INJECTION64_PATH at its first call: set it before main() runs any range.
const std::string g_injection = prepare_nvtx_injection();

TEST(TraceSessionGpu, RecordsKernelsCopiesAndNvtxRanges) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  ASSERT_EQ(g_injection, "") << "NVTX injection into CUPTI was not set up";
  constexpr std::size_t n = std::size_t{1} << 20;
  constexpr int steps = 3;
  auto device = Buffer<float>::device(n, Backend::cuda, "iota out");
  auto pinned = Buffer<float>::pinned(n, Backend::cuda, "copy source");
  Stream stream(Backend::cuda);
  kernels::launch_iota({device.device_data(), n, 0.0f, 1.0f},
                       stream.native());  // context and module warm
  stream.synchronize();

  TraceSession session({.label = "gpu test"});
  ASSERT_TRUE(session.active()) << session.message();
  EXPECT_EQ(session.message(), "");
  for (int step = 0; step < steps; ++step) {
    HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, step);
    {
      HISPARSE_PHASE_RANGE(Phase::attention);
      kernels::launch_iota({device.device_data(), n, 1.0f, 2.0f}, stream.native());
      kernels::launch_iota({device.device_data(), n / 2, 3.0f, 4.0f}, stream.native());
    }
    {
      HISPARSE_RANGE("fetch rows", Phase::fetch);
      HISPARSE_CUDA_CHECK(cudaMemcpyAsync(device.device_data(), pinned.device_data(),
                                          pinned.bytes(), cudaMemcpyHostToDevice, stream.native()));
    }
  }
  stream.synchronize();
  auto records = session.stop();
  EXPECT_EQ(records.label, "gpu test");
  EXPECT_EQ(records.dropped_records, 0u);
  ASSERT_EQ(records.clock.size(), 2u);

  // Raw records.
  ASSERT_EQ(records.kernels.size(), 2u * steps);
  std::set<std::uint32_t> streams;
  for (const auto& k : records.kernels) {
    EXPECT_NE(k.name.find("iota_kernel"), std::string::npos) << k.name;
    EXPECT_EQ(k.block, (std::array<std::int32_t, 3>{256, 1, 1}));
    EXPECT_GT(k.registers_per_thread, 0);
    EXPECT_GT(k.end, k.start);
    streams.insert(k.stream);
  }
  EXPECT_EQ(records.kernels[0].grid[0], 4096);  // min(ceil(n / 256), 4096)
  EXPECT_EQ(records.kernels[1].grid[0], 2048);
  ASSERT_EQ(records.memcpys.size(), static_cast<std::size_t>(steps));
  for (const auto& m : records.memcpys) {
    EXPECT_EQ(m.bytes, pinned.bytes());
    EXPECT_EQ(m.kind, CopyKind::htod);
    EXPECT_EQ(m.src, MemorySpace::pinned);
    EXPECT_EQ(m.dst, MemorySpace::device);
    streams.insert(m.stream);
  }
  EXPECT_EQ(streams.size(), 1u) << "everything ran on one stream";
  ASSERT_FALSE(records.devices.empty());
  cudaDeviceProp props{};
  HISPARSE_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  EXPECT_EQ(records.devices[0].name, props.name);

  if (const char* out = std::getenv("HISPARSE_TRACE_OUT"))
    write_records_text(records, std::filesystem::path(out) / "gpu_test.records");

  // Timeline: NVTX ranges paired, activities linked and attributed.
  const Timeline timeline(std::move(records));
  EXPECT_EQ(timeline.stats().unmatched_end_markers, 0u);
  EXPECT_EQ(timeline.stats().unterminated_ranges, 0u);
  EXPECT_EQ(timeline.stats().unlaunched_activities, 0u);
  std::multiset<std::string> names;
  for (const auto& r : timeline.ranges())
    if (r.domain == "hisparse") names.insert(r.name);
  EXPECT_EQ(names.count("step"), static_cast<std::size_t>(steps))
      << "no NVTX marker records: injection failed?";
  EXPECT_EQ(names.count("attention"), static_cast<std::size_t>(steps));
  EXPECT_EQ(names.count("fetch rows"), static_cast<std::size_t>(steps));
  for (const auto& a : timeline.activities()) {
    ASSERT_GE(a.launch, 0);
    const auto& call = timeline.records().runtime_calls[static_cast<std::size_t>(a.launch)];
    // Clock alignment on real data: the GPU cannot start work before the host asked for it.
    EXPECT_GE(a.start_ns, timeline.host_ns(call.start)) << call.name;
    EXPECT_EQ(a.phase, a.kind == ActivityKind::kernel ? Phase::attention : Phase::fetch)
        << call.name;
    EXPECT_GE(a.step, 0);
    EXPECT_LT(a.step, steps);
  }
  const auto breakdown = phase_breakdown(timeline);
  ASSERT_EQ(breakdown.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(breakdown[s].step, s);
    EXPECT_EQ(breakdown[s].kernels, 2u);
    EXPECT_EQ(breakdown[s].copies, 1u);
    EXPECT_GT(breakdown[s].phase_ms.at("attention"), 0.0);
    EXPECT_GT(breakdown[s].phase_ms.at("fetch"), 0.0);
    EXPECT_GE(breakdown[s].wall_ms, 0.0);
  }

  // trace.json: kernels and copies on the stream's track, ranges on the host thread, flows.
  ChromeTraceWriter writer;
  writer.add(timeline);
  const auto doc = nlohmann::json::parse(writer.str());
  std::size_t kernels = 0, copies = 0, ranges = 0, flows = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (!e.contains("cat")) continue;
    if (e.at("cat") == "kernel") {
      ++kernels;
      EXPECT_EQ(e.at("tid"), *streams.begin());
      EXPECT_EQ(e.at("args").at("block"), "[256,1,1]");
    }
    if (e.at("cat") == "memcpy") {
      ++copies;
      EXPECT_EQ(e.at("tid"), *streams.begin());
      EXPECT_GT(e.at("args").at("GB/s").get<double>(), 1.0);
    }
    if (e.at("cat") == "nvtx" && e.at("ph") == "X") {
      ++ranges;
      EXPECT_EQ(e.at("pid"), 100);
    }
    if (e.at("cat") == "launch" && e.at("ph") == "s") ++flows;
  }
  EXPECT_EQ(kernels, 2u * steps);
  EXPECT_EQ(copies, static_cast<std::size_t>(steps));
  EXPECT_EQ(ranges, 3u * steps);
  EXPECT_EQ(flows, 3u * steps);
  if (const char* out = std::getenv("HISPARSE_TRACE_OUT"))
    writer.write(std::filesystem::path(out) / "trace.json");
#endif
}

#if HISPARSE_WITH_CUDA
/// Host time of `steps` steps of `launches` small kernels each, synchronising after each step.
double time_steps(Stream& stream, float* out, int steps, int launches) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, s);
    for (int l = 0; l < launches; ++l) {
      HISPARSE_PHASE_RANGE(Phase::attention);
      kernels::launch_iota({out, 4096, 0.0f, 1.0f}, stream.native());
    }
    stream.synchronize();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
#endif

// What tracing costs: the same launch-bound loop untraced and traced (CUPTI + NVTX injection),
// plus the time to stop, build the timeline and write the JSON. Reported, loosely bounded.
TEST(TraceSessionGpu, OverheadOfTracing) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  constexpr int steps = 200, launches = 50;
  auto out = Buffer<float>::device(4096, Backend::cuda, "iota out");
  Stream stream(Backend::cuda);
  (void)time_steps(stream, out.device_data(), 5, launches);  // warm-up
  const double untraced = time_steps(stream, out.device_data(), steps, launches);

  TraceSession session({.label = "overhead"});
  ASSERT_TRUE(session.active()) << session.message();
  const double traced = time_steps(stream, out.device_data(), steps, launches);
  const auto t0 = std::chrono::steady_clock::now();
  auto records = session.stop();
  const auto t1 = std::chrono::steady_clock::now();
  const Timeline timeline(std::move(records));
  ChromeTraceWriter writer;
  writer.add(timeline);
  const auto json = writer.str();
  const auto t2 = std::chrono::steady_clock::now();

  const auto n = static_cast<double>(steps * launches);
  EXPECT_EQ(timeline.records().kernels.size(), static_cast<std::size_t>(steps * launches));
  EXPECT_EQ(timeline.stats().dropped_records, 0u);
  std::printf(
      "[ trace    ] untraced %.2f us/launch, traced %.2f us/launch (+%.1f%%); stop+flush %.1f ms, "
      "timeline+json %.1f ms for %zu kernels (%.1f MB)\n",
      untraced / n * 1e6, traced / n * 1e6, (traced / untraced - 1.0) * 100.0,
      std::chrono::duration<double, std::milli>(t1 - t0).count(),
      std::chrono::duration<double, std::milli>(t2 - t1).count(), timeline.records().kernels.size(),
      static_cast<double>(json.size()) / 1e6);
  EXPECT_LT(traced, untraced * 20.0) << "tracing made launches more than 20x slower";
#endif
}

}  // namespace
}  // namespace hisparse::trace
