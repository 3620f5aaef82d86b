// The Chrome-trace / Perfetto JSON written from recorded activity: parsed back and checked for
// tracks, NVTX pairing and nesting, timestamps, flows and arguments.
#include "trace/chrome_trace_writer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.hpp"
#include "trace/record_text.hpp"

namespace hisparse::trace {
namespace {

using nlohmann::json;

constexpr int host_pid = 100;
constexpr int gpu_pid = 101;

Timeline fixture() {
  return Timeline(read_records_text(HISPARSE_TEST_FIXTURES "/trace/decode_two_steps.records"));
}

json written(const Timeline& t) {
  ChromeTraceWriter w;
  w.add(t);
  return json::parse(w.str());
}

std::vector<json> events(const json& doc, std::string_view ph, std::string_view cat = {}) {
  std::vector<json> out;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == ph && (cat.empty() || (e.contains("cat") && e.at("cat") == cat)))
      out.push_back(e);
  return out;
}

json event_named(const json& doc, std::string_view ph, std::string_view name) {
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == ph && e.contains("name") && e.at("name") == name) return e;
  ADD_FAILURE() << "no " << ph << " event named " << name;
  return json::object();
}

TEST(TraceChromeWriter, OneTrackPerStreamAndHostThread) {
  const auto doc = written(fixture());
  std::map<std::pair<int, int>, std::string> threads;
  std::map<int, std::string> processes;
  for (const auto& e : events(doc, "M")) {
    if (e.at("name") == "thread_name")
      threads[{e.at("pid"), e.at("tid")}] = e.at("args").at("name");
    if (e.at("name") == "process_name") processes[e.at("pid")] = e.at("args").at("name");
  }
  EXPECT_EQ(processes.at(host_pid), "fixture hisparse c=2 - host");
  EXPECT_EQ(processes.at(gpu_pid), "fixture hisparse c=2 - GPU 0 (NVIDIA H200)");
  EXPECT_EQ(threads,
            (std::map<std::pair<int, int>, std::string>{{{host_pid, 4000}, "main thread 4000"},
                                                        {{host_pid, 4001}, "thread 4001"},
                                                        {{gpu_pid, 13}, "stream 13"},
                                                        {{gpu_pid, 14}, "stream 14"},
                                                        {{gpu_pid, 15}, "stream 15"}}));
  // Every GPU slice sits on its stream's track; no two slices of one track overlap.
  std::map<int, std::vector<std::pair<double, double>>> by_stream;
  for (const auto* cat : {"kernel", "memcpy", "memset"})
    for (const auto& e : events(doc, "X", cat)) {
      EXPECT_EQ(e.at("pid"), gpu_pid);
      by_stream[e.at("tid")].push_back(
          {e.at("ts"), e.at("ts").get<double>() + e.at("dur").get<double>()});
    }
  EXPECT_EQ(by_stream[13].size(), 7u);  // warmup, indexer, topk, memset, attention, ffn, unlaunched
  EXPECT_EQ(by_stream[14].size(), 1u);
  EXPECT_EQ(by_stream[15].size(), 1u);
  for (auto& [stream, slices] : by_stream) {
    std::sort(slices.begin(), slices.end());
    for (std::size_t i = 1; i < slices.size(); ++i)
      EXPECT_LE(slices[i - 1].second, slices[i].first) << stream;
  }
  const auto memcpy = event_named(doc, "X", "Memcpy HtoD (pinned -> device)");
  EXPECT_EQ(memcpy.at("tid"), 14);
}

TEST(TraceChromeWriter, NvtxRangesArePairedAndNested) {
  const auto doc = written(fixture());
  const auto ranges = events(doc, "X", "nvtx");
  ASSERT_EQ(ranges.size(), 10u);
  std::multiset<std::string> names;
  for (const auto& r : ranges) {
    names.insert(r.at("name"));
    EXPECT_EQ(r.at("pid"), host_pid);
  }
  EXPECT_EQ(names,
            (std::multiset<std::string>{"step", "step", "layer", "indexer", "topk", "swap_in",
                                        "SwapIn::run", "attention", "ffn", "background work"}));
  // On each thread, two ranges are either disjoint or one contains the other.
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = 0; j < ranges.size(); ++j) {
      const auto& a = ranges[i];
      const auto& b = ranges[j];
      if (i == j || a.at("tid") != b.at("tid")) continue;
      const double a0 = a.at("ts"), a1 = a0 + a.at("dur").get<double>();
      const double b0 = b.at("ts"), b1 = b0 + b.at("dur").get<double>();
      const bool disjoint = a1 <= b0 || b1 <= a0;
      const bool nested = (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1);
      EXPECT_TRUE(disjoint || nested) << a.at("name") << " / " << b.at("name");
    }
  const auto swap_in = event_named(doc, "X", "swap_in");
  EXPECT_DOUBLE_EQ(swap_in.at("ts").get<double>(), 17.5);
  EXPECT_DOUBLE_EQ(swap_in.at("dur").get<double>(), 7.5);
  EXPECT_EQ(swap_in.at("args").at("phase"), "swap_in");
  EXPECT_EQ(swap_in.at("args").at("payload"), 2);
  EXPECT_EQ(swap_in.at("args").at("colour"), "#ef5350");
  const auto open = event_named(doc, "X", "background work");
  EXPECT_EQ(open.at("tid"), 4001);
  EXPECT_EQ(open.at("args").at("unterminated"), true);
  EXPECT_DOUBLE_EQ(open.at("dur").get<double>(), 70.0);  // closed at the session's last instant
  const auto mark = event_named(doc, "i", "checkpoint");
  EXPECT_DOUBLE_EQ(mark.at("ts").get<double>(), 50.0);
}

TEST(TraceChromeWriter, TimestampsAreMicrosecondsFromTheFirstInstant) {
  const auto doc = written(fixture());
  const auto indexer = event_named(doc, "X", "indexer_kernel(float const*, float*, int)");
  EXPECT_DOUBLE_EQ(indexer.at("ts").get<double>(), 14.0);
  EXPECT_DOUBLE_EQ(indexer.at("dur").get<double>(), 6.0);
  const auto step = event_named(doc, "X", "step");
  EXPECT_DOUBLE_EQ(step.at("ts").get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(step.at("dur").get<double>(), 50.0);
  // Sub-microsecond values keep their nanoseconds: the memset lasts 0.3 us.
  const auto memset = event_named(doc, "X", "Memset (device)");
  EXPECT_DOUBLE_EQ(memset.at("ts").get<double>(), 23.1);
  EXPECT_DOUBLE_EQ(memset.at("dur").get<double>(), 0.3);
  EXPECT_EQ(doc.at("displayTimeUnit"), "ns");
}

TEST(TraceChromeWriter, FlowsGoFromTheLaunchingCallToTheGpuSlice) {
  const auto doc = written(fixture());
  const auto starts = events(doc, "s", "launch");
  const auto finishes = events(doc, "f", "launch");
  ASSERT_EQ(starts.size(), 8u);  // corr 10..17; the unlaunched kernel has none
  ASSERT_EQ(finishes.size(), 8u);
  const auto api = events(doc, "X", "cuda_api");
  std::vector<json> gpu;
  for (const auto* cat : {"kernel", "memcpy", "memset"})
    for (const auto& e : events(doc, "X", cat)) gpu.push_back(e);
  auto inside = [](const json& point, const json& slice) {
    const double t = point.at("ts"), t0 = slice.at("ts"), t1 = t0 + slice.at("dur").get<double>();
    return point.at("pid") == slice.at("pid") && point.at("tid") == slice.at("tid") && t0 <= t &&
           t <= t1;
  };
  for (const auto& s : starts) {
    const auto f = std::find_if(finishes.begin(), finishes.end(),
                                [&](const json& x) { return x.at("id") == s.at("id"); });
    ASSERT_NE(f, finishes.end());
    EXPECT_EQ(f->at("bp"), "e");
    const auto call =
        std::find_if(api.begin(), api.end(), [&](const json& x) { return inside(s, x); });
    ASSERT_NE(call, api.end()) << "flow start must lie inside a runtime call";
    const auto slice =
        std::find_if(gpu.begin(), gpu.end(), [&](const json& x) { return inside(*f, x); });
    ASSERT_NE(slice, gpu.end()) << "flow end must lie inside a GPU slice";
    EXPECT_EQ(call->at("args").at("correlation"), slice->at("args").at("correlation"));
  }
}

TEST(TraceChromeWriter, KernelAndCopyArguments) {
  const auto doc = written(fixture());
  const auto indexer = event_named(doc, "X", "indexer_kernel(float const*, float*, int)");
  const auto& a = indexer.at("args");
  EXPECT_EQ(a.at("grid"), "[132,1,1]");
  EXPECT_EQ(a.at("block"), "[128,1,1]");
  EXPECT_EQ(a.at("registers per thread"), 32);
  EXPECT_EQ(a.at("static shared memory"), 1024);
  EXPECT_EQ(a.at("dynamic shared memory"), 4096);
  EXPECT_EQ(a.at("phase"), "indexer");
  EXPECT_EQ(a.at("step"), 0);
  EXPECT_EQ(a.at("correlation"), 11);
  EXPECT_EQ(a.at("mangled"), "_Z14indexer_kernelPKfPfi");
  const auto copy = event_named(doc, "X", "Memcpy HtoD (pinned -> device)");
  EXPECT_EQ(copy.at("args").at("bytes"), 65600);
  EXPECT_DOUBLE_EQ(copy.at("args").at("GB/s").get<double>(), 13.12);
  EXPECT_EQ(copy.at("args").at("phase"), "swap_in");
  const auto launch = events(doc, "X", "cuda_api");
  EXPECT_EQ(launch.size(), 8u);
  const auto clock = event_named(doc, "C", "SM clock");
  EXPECT_EQ(clock.at("args").at("MHz"), 1980);
  EXPECT_EQ(clock.at("pid"), gpu_pid);
}

TEST(TraceChromeWriter, OtherDataHoldsStatisticsAndBreakdown) {
  const auto doc = written(fixture());
  const auto& s = doc.at("otherData").at("sessions").at(0);
  EXPECT_EQ(s.at("label"), "fixture hisparse c=2");
  EXPECT_EQ(s.at("dropped_records"), 3);
  EXPECT_EQ(s.at("unmatched_end_markers"), 1);
  EXPECT_EQ(s.at("unterminated_ranges"), 1);
  EXPECT_EQ(s.at("invalid_activities"), 1);
  EXPECT_EQ(s.at("unlaunched_activities"), 1);
  const auto& b = s.at("phase_breakdown");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].at("step"), 0);
  EXPECT_NEAR(b[0].at("phase_ms").at("swap_in").get<double>(), 0.0053, 1e-12);
  EXPECT_NEAR(b[1].at("phase_ms").at("ffn").get<double>(), 0.014, 1e-12);
}

TEST(TraceChromeWriter, SessionsGetTheirOwnProcessesOnOneClock) {
  auto records = read_records_text(HISPARSE_TEST_FIXTURES "/trace/decode_two_steps.records");
  auto later = records;
  later.label = "second point";
  for (auto& c : later.clock) c.host_ns += 1'000'000;  // the same work 1 ms later on the host clock
  ChromeTraceWriter w;
  w.add(Timeline(std::move(records)));
  w.add(Timeline(std::move(later)));
  EXPECT_EQ(w.sessions(), 2u);
  const auto doc = json::parse(w.str());
  std::set<int> pids;
  double second_step = -1;
  for (const auto& e : doc.at("traceEvents")) {
    pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "X" && e.at("name") == "step" && e.at("pid") == 200 && second_step < 0)
      second_step = e.at("ts");
  }
  EXPECT_EQ(pids, (std::set<int>{100, 101, 200, 201}));
  EXPECT_DOUBLE_EQ(second_step, 1010.0);
  EXPECT_EQ(doc.at("otherData").at("sessions").at(1).at("label"), "second point");
}

TEST(TraceChromeWriter, OverlappingKernelsOfOneStreamGetTheirOwnLane) {
  // A kernel launched with programmatic dependent launch starts before the previous kernel of its
  // stream ends (the swap-in's resolve and copy kernels, seen on the H200): it must go to a second
  // track, since one Perfetto track cannot show overlapping slices.
  TraceRecords r;
  r.label = "pdl";
  r.clock = {{1000000000, 50000000000}, {1000100000, 50000100000}};
  KernelRecord resolve;
  resolve.start = 1000010000;
  resolve.end = 1000030000;
  resolve.stream = 18;
  resolve.correlation = 1;
  resolve.name = "resolve";
  KernelRecord copy = resolve;
  copy.start = 1000025000;  // starts 5 us before resolve ends
  copy.end = 1000080000;
  copy.correlation = 2;
  copy.name = "copy";
  KernelRecord next = resolve;  // after both: back on the stream's own track
  next.start = 1000090000;
  next.end = 1000095000;
  next.correlation = 3;
  next.name = "next";
  r.kernels = {resolve, copy, next};
  const auto doc = written(Timeline(std::move(r)));
  EXPECT_EQ(event_named(doc, "X", "resolve").at("tid"), 18);
  EXPECT_EQ(event_named(doc, "X", "copy").at("tid"), 1000018);
  EXPECT_EQ(event_named(doc, "X", "next").at("tid"), 18);
  std::map<std::uint64_t, std::string> lanes;
  for (const auto& e : events(doc, "M"))
    if (e.at("name") == "thread_name") lanes[e.at("tid")] = e.at("args").at("name");
  EXPECT_EQ(lanes.at(18), "stream 18");
  EXPECT_EQ(lanes.at(1000018), "stream 18 (overlapping launch 1)");
}

TEST(TraceChromeWriter, EscapesNamesAndWritesFiles) {
  TraceRecords r;
  r.label = "quote \" backslash \\ tab \t";
  r.markers = {{MarkerKind::start, 10, 1, 1, 1, "a\"b\n", "d"},
               {MarkerKind::end, 20, 1, 1, 1, "", ""}};
  ChromeTraceWriter w;
  w.add(Timeline(std::move(r)));
  const auto dir = std::filesystem::temp_directory_path() / "hisparse_trace_writer_test";
  std::filesystem::create_directories(dir);
  w.write(dir / "trace.json");
  std::ifstream in(dir / "trace.json");
  const auto doc = json::parse(in);
  EXPECT_EQ(doc.at("otherData").at("sessions").at(0).at("label"), "quote \" backslash \\ tab \t");
  EXPECT_EQ(event_named(doc, "X", "a\"b\n").at("dur").get<double>(), 0.01);
  std::filesystem::remove_all(dir);
  try {
    w.write("/nonexistent-dir/trace.json");
    FAIL() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "/nonexistent-dir/trace.json: cannot create the trace file; "
                 "check that the directory exists and is writable");
  }
}

// Writing must be cheap next to the steps it describes: ~100k GPU activities (a few steps of a
// 78-layer model) are linked, attributed and written well under a second on one core.
TEST(TraceChromeWriter, WritingScalesToManyRecords) {
  TraceRecords r;
  r.clock = {{1'000, 1'000}, {100'000'000'000, 100'000'000'000}};
  constexpr int steps = 4, layers = 78, per_layer = 80;
  std::uint32_t corr = 1, id = 1;
  std::uint64_t t = 10'000;
  for (int s = 0; s < steps; ++s) {
    const auto step_id = id++;
    r.markers.push_back({MarkerKind::start, t, step_id, 1, 1, "step", "hisparse"});
    r.marker_data.push_back({step_id, 0, 1, true, s});
    for (int l = 0; l < layers; ++l) {
      const auto attn = id++;
      r.markers.push_back({MarkerKind::start, t, attn, 1, 1, "attention", "hisparse"});
      r.marker_data.push_back({attn, 0, 12, false, 0});
      for (int k = 0; k < per_layer; ++k, ++corr, t += 1'000) {
        r.runtime_calls.push_back({t, t + 300, 1, 1, corr, 211, "cudaLaunchKernel", 0});
        KernelRecord kr;
        kr.start = t + 400;
        kr.end = t + 900;
        kr.stream = 7;
        kr.correlation = corr;
        kr.name = "_Z16attention_kernelPK13__nv_bfloat16Pfi";
        r.kernels.push_back(std::move(kr));
      }
      r.markers.push_back({MarkerKind::end, t, attn, 1, 1, "", ""});
    }
    r.markers.push_back({MarkerKind::end, t, step_id, 1, 1, "", ""});
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Timeline timeline(std::move(r));
  ChromeTraceWriter w;
  w.add(timeline);
  const std::string text = w.str();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto activities = timeline.activities().size();
  EXPECT_EQ(activities, static_cast<std::size_t>(steps * layers * per_layer));
  const auto steps_out = phase_breakdown(timeline);
  ASSERT_EQ(steps_out.size(), static_cast<std::size_t>(steps));
  EXPECT_NEAR(steps_out[3].phase_ms.at("attention"), layers * per_layer * 500e-6, 1e-9);
  std::printf(
      "[ trace    ] %zu activities + %zu ranges -> %.1f MB JSON in %.3f s (%.2f us per activity)\n",
      activities, timeline.ranges().size(), static_cast<double>(text.size()) / 1e6, seconds,
      seconds * 1e6 / static_cast<double>(activities));
  EXPECT_LT(seconds, 5.0) << "trace writing is far slower than expected";
}

}  // namespace
}  // namespace hisparse::trace
