// Timeline from recorded activity (tests/fixtures/trace/decode_two_steps.records): clock
// alignment, NVTX pairing and nesting, launch linking, phase and step attribution, breakdown.
#include "trace/timeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "trace/record_text.hpp"
#include "trace/trace_file.hpp"

namespace hisparse::trace {
namespace {

constexpr std::int64_t host0 = 50'000'000'000;  // host ns of CUPTI 1e9 in the fixture

Timeline fixture() {
  return Timeline(read_records_text(HISPARSE_TEST_FIXTURES "/trace/decode_two_steps.records"));
}

const NvtxRange& range_named(const Timeline& t, std::string_view name) {
  const auto& rs = t.ranges();
  const auto it =
      std::find_if(rs.begin(), rs.end(), [&](const NvtxRange& r) { return r.name == name; });
  EXPECT_NE(it, rs.end()) << name;
  return *it;
}

const GpuActivity& activity(const Timeline& t, std::uint32_t correlation) {
  const auto& as = t.activities();
  const auto it = std::find_if(as.begin(), as.end(),
                               [&](const GpuActivity& a) { return a.correlation == correlation; });
  EXPECT_NE(it, as.end()) << correlation;
  return *it;
}

TEST(TraceClock, TwoSamplesGiveOffsetAndDrift) {
  // Host runs 100 ppm faster than CUPTI's clock, offset 5 s.
  const ClockAlignment c({{1'000'000'000, 6'000'000'000}, {2'000'000'000, 7'000'100'000}});
  EXPECT_EQ(c.to_host_ns(1'000'000'000), 6'000'000'000);
  EXPECT_EQ(c.to_host_ns(2'000'000'000), 7'000'100'000);
  EXPECT_EQ(c.to_host_ns(1'500'000'000), 6'500'050'000);
  EXPECT_EQ(c.to_host_ns(999'000'000), 5'998'999'900);  // before the first sample: extrapolated
  EXPECT_NEAR(c.drift_ppm(), 100.0, 1e-6);
}

TEST(TraceClock, OneSampleIsAnOffsetAndNoneIsIdentity) {
  EXPECT_EQ(ClockAlignment({{100, 1000}}).to_host_ns(150), 1050);
  EXPECT_EQ(ClockAlignment().to_host_ns(123), 123);
  EXPECT_EQ(ClockAlignment({{100, 1000}}).drift_ppm(), 0.0);
}

TEST(TraceTimeline, PairsStartAndEndMarkersById) {
  const auto t = fixture();
  // 9 ranges on thread 4000 plus the unterminated one on 4001; the orphan end (id 99) is dropped.
  EXPECT_EQ(t.ranges().size(), 10u);
  EXPECT_EQ(t.stats().unmatched_end_markers, 1u);
  EXPECT_EQ(t.stats().unterminated_ranges, 1u);
  const auto& step = range_named(t, "step");
  EXPECT_EQ(step.start_ns, host0 + 10'000);
  EXPECT_EQ(step.end_ns, host0 + 60'000);
  EXPECT_TRUE(step.has_payload);
  EXPECT_EQ(step.payload, 0);
  EXPECT_EQ(step.colour, 0xff455a64u);
  const auto& attention = range_named(t, "attention");
  EXPECT_EQ(attention.start_ns, host0 + 25'500);
  EXPECT_EQ(attention.end_ns, host0 + 30'000);
  EXPECT_EQ(attention.phase, Phase::attention);
  const auto& open = range_named(t, "background work");
  EXPECT_FALSE(open.terminated);
  EXPECT_EQ(open.end_ns, t.end_ns());
  EXPECT_EQ(t.end_ns(), host0 + 100'000);  // the stop clock sample is the last instant
  EXPECT_FALSE(open.phase.has_value()) << "ranges of other domains have no phase";
  ASSERT_EQ(t.instants().size(), 1u);
  EXPECT_EQ(t.instants()[0].name, "checkpoint");
  EXPECT_EQ(t.instants()[0].ts_ns, host0 + 50'000);
}

TEST(TraceTimeline, NamesUnresolvedRegisteredStringsAfterTheirPhase) {
  const auto t = fixture();
  const auto& ffn = range_named(t, "ffn");  // recorded with an empty name and category 13
  EXPECT_EQ(ffn.phase, Phase::ffn);
  EXPECT_EQ(ffn.start_ns, host0 + 72'000);
}

TEST(TraceTimeline, NestsRangesPerThread) {
  const auto t = fixture();
  const auto& rs = t.ranges();
  auto parent_name = [&](const NvtxRange& r) {
    return r.parent < 0 ? std::string("-") : rs[r.parent].name;
  };
  EXPECT_EQ(parent_name(range_named(t, "SwapIn::run")), "swap_in");
  EXPECT_EQ(parent_name(range_named(t, "swap_in")), "layer");
  EXPECT_EQ(parent_name(range_named(t, "layer")), "step");
  EXPECT_EQ(range_named(t, "SwapIn::run").depth, 3);
  EXPECT_EQ(range_named(t, "SwapIn::run").phase, Phase::api);
  EXPECT_EQ(parent_name(range_named(t, "background work")), "-");
  for (const auto& r : rs) {
    EXPECT_TRUE(r.nested) << r.name;
    if (r.parent >= 0) {
      const auto& p = rs[r.parent];
      EXPECT_EQ(p.thread, r.thread);
      EXPECT_LE(p.start_ns, r.start_ns) << r.name;
      EXPECT_GE(p.end_ns, r.end_ns) << r.name;
    }
  }
}

TEST(TraceTimeline, OverlappingStartEndRangesAreMarkedNotNested) {
  TraceRecords r;
  r.markers = {{MarkerKind::start, 100, 1, 1, 1, "a", "x"},
               {MarkerKind::start, 200, 2, 1, 1, "b", "x"},
               {MarkerKind::end, 300, 1, 1, 1, "", ""},
               {MarkerKind::end, 400, 2, 1, 1, "", ""}};
  const Timeline t(std::move(r));
  ASSERT_EQ(t.ranges().size(), 2u);
  EXPECT_TRUE(t.ranges()[0].nested);
  EXPECT_FALSE(t.ranges()[1].nested);
  EXPECT_EQ(t.enclosing_range({1, 1}, 350), -1) << "b is not nested, a has ended";
  EXPECT_EQ(t.enclosing_range({1, 1}, 250), 0);
}

TEST(TraceTimeline, LinksActivitiesToLaunchesPhasesAndSteps) {
  const auto t = fixture();
  EXPECT_EQ(t.activities().size(),
            9u);  // 8 kernels, a copy and a memset; the reversed kernel is left out
  EXPECT_EQ(t.stats().invalid_activities, 1u);
  EXPECT_EQ(t.stats().unlaunched_activities, 1u);
  EXPECT_EQ(t.stats().dropped_records, 3u);
  EXPECT_TRUE(std::is_sorted(
      t.activities().begin(), t.activities().end(),
      [](const GpuActivity& a, const GpuActivity& b) { return a.start_ns < b.start_ns; }));

  EXPECT_EQ(activity(t, 10).phase, Phase::other);
  EXPECT_EQ(activity(t, 10).step, -1);
  EXPECT_EQ(activity(t, 11).phase, Phase::indexer);
  EXPECT_EQ(activity(t, 11).step, 0);
  EXPECT_EQ(t.ranges()[activity(t, 11).range].name, "indexer");
  EXPECT_EQ(activity(t, 12).phase, Phase::topk);
  // The copy and memset were launched inside SwapIn::run (an api range) inside swap_in.
  EXPECT_EQ(activity(t, 13).phase, Phase::swap_in);
  EXPECT_EQ(t.ranges()[activity(t, 13).range].name, "SwapIn::run");
  EXPECT_EQ(activity(t, 13).kind, ActivityKind::memcpy);
  EXPECT_EQ(activity(t, 13).stream, 14u);
  EXPECT_EQ(activity(t, 14).phase, Phase::swap_in);
  EXPECT_EQ(activity(t, 14).kind, ActivityKind::memset);
  EXPECT_EQ(activity(t, 15).phase, Phase::attention);
  EXPECT_EQ(activity(t, 16).phase, Phase::ffn);
  EXPECT_EQ(activity(t, 16).step, 1);
  EXPECT_EQ(activity(t, 17).stream, 15u);
  EXPECT_EQ(activity(t, 17).step, 1);
  EXPECT_EQ(activity(t, 77).launch, -1);
  EXPECT_EQ(activity(t, 77).phase, Phase::other);
  EXPECT_EQ(activity(t, 11).start_ns, host0 + 14'000);
  EXPECT_EQ(activity(t, 11).end_ns, host0 + 20'000);
}

TEST(TraceTimeline, TracksAreHostThreadsAndStreams) {
  const auto t = fixture();
  EXPECT_EQ(t.host_threads(), (std::vector<HostThread>{{4000, 4000}, {4000, 4001}}));
  EXPECT_EQ(t.streams(), (std::vector<StreamTrack>{{0, 13}, {0, 14}, {0, 15}}));
}

TEST(TraceTimeline, DemanglesKernelNames) {
  const auto t = fixture();
  EXPECT_EQ(t.display_name(activity(t, 12)),
            "void hisparse::kernels::topk<2048>(float const*, int*, int)");
  EXPECT_EQ(t.display_name(activity(t, 13)), "") << "copies have no kernel name";
  EXPECT_EQ(demangle("not_mangled"), "not_mangled");
  EXPECT_EQ(demangle("_Zbroken"), "_Zbroken");
}

TEST(TracePhaseBreakdown, SumsGpuTimePerPhasePerStep) {
  const auto steps = phase_breakdown(fixture());
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 0);
  EXPECT_DOUBLE_EQ(steps[0].wall_ms, 0.050);
  EXPECT_EQ(steps[0].kernels, 3u);
  EXPECT_EQ(steps[0].copies, 2u);
  EXPECT_NEAR(steps[0].gpu_ms, 0.0182, 1e-12);
  EXPECT_EQ(steps[0].phase_ms.size(), 4u);
  EXPECT_NEAR(steps[0].phase_ms.at("indexer"), 0.006, 1e-12);
  EXPECT_NEAR(steps[0].phase_ms.at("topk"), 0.0025, 1e-12);
  EXPECT_NEAR(steps[0].phase_ms.at("swap_in"), 0.0053, 1e-12);  // 5 us copy + 0.3 us memset
  EXPECT_NEAR(steps[0].phase_ms.at("attention"), 0.0044, 1e-12);
  EXPECT_EQ(steps[1].step, 1);
  EXPECT_DOUBLE_EQ(steps[1].wall_ms, 0.020);
  EXPECT_NEAR(steps[1].phase_ms.at("ffn"), 0.014, 1e-12);  // two streams, summed
  EXPECT_EQ(steps[1].kernels, 2u);
}

TEST(TracePhaseBreakdown, MeanOverStepsCountsMissingPhasesAsZero) {
  const auto mean = mean_phase_ms(phase_breakdown(fixture()));
  EXPECT_EQ(mean.size(), 6u);  // indexer, topk, swap_in, attention, ffn, total
  EXPECT_NEAR(mean.at("indexer"), 0.003, 1e-12);
  EXPECT_NEAR(mean.at("ffn"), 0.007, 1e-12);
  EXPECT_NEAR(mean.at("total"), (0.0182 + 0.014) / 2, 1e-12);
  EXPECT_TRUE(mean_phase_ms({}).empty());
}

TEST(TracePhaseBreakdown, StepsWithoutPayloadAreNumberedInTimeOrder) {
  TraceRecords r;
  r.markers = {{MarkerKind::start, 500, 2, 1, 1, "step", "hisparse"},
               {MarkerKind::end, 600, 2, 1, 1, "", ""},
               {MarkerKind::start, 100, 1, 1, 1, "step", "hisparse"},
               {MarkerKind::end, 200, 1, 1, 1, "", ""}};
  r.runtime_calls = {{510, 520, 1, 1, 9, 211, "cudaLaunchKernel", 0}};
  r.kernels.push_back({});
  r.kernels[0].start = 530;
  r.kernels[0].end = 580;
  r.kernels[0].correlation = 9;
  const Timeline t(std::move(r));
  const auto steps = phase_breakdown(t);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 0);
  EXPECT_EQ(steps[0].gpu_ms, 0.0);
  EXPECT_EQ(steps[1].step, 1);
  EXPECT_NEAR(steps[1].gpu_ms, 50e-6, 1e-15);
  EXPECT_NEAR(steps[1].phase_ms.at("other"), 50e-6, 1e-15);
}

TEST(TraceNvtx, PhaseNamesRoundTrip) {
  for (int i = 0; i < phase_count; ++i) {
    const auto p = static_cast<Phase>(i);
    EXPECT_EQ(phase_from_name(phase_name(p)), p);
    EXPECT_EQ(phase_from_category(static_cast<std::uint32_t>(i)), p);
  }
  EXPECT_FALSE(phase_from_name("nope").has_value());
  EXPECT_FALSE(phase_from_category(static_cast<std::uint32_t>(phase_count)).has_value());
  // The macros compile in every build (no-ops without NVTX injection or CUDA).
  HISPARSE_PHASE_RANGE(Phase::attention);
  HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, 3);
  HISPARSE_RANGE_PAYLOAD("layer", Phase::layer, 1);
  HISPARSE_FUNC_RANGE();
}

}  // namespace
}  // namespace hisparse::trace
