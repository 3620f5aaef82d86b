// Fathom CUDA kernels against their CPU twins on random inputs: exact codes, planes and scales;
// exact depths and theta; bit-identical scores (the scan sums 8-bit weights x masked codes on
// integer tensor cores, exact, and the twin sums the same integers) and identical selections,
// for both plane layouts, several lengths, odd shapes and ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/dtypes.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "fathom/plane_scan.hpp"
#include "fathom/plane_store.hpp"
#include "fathom/selector.hpp"
#include "fathom/synthetic_keys.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "kernels/fathom/plane_scan_config.hpp"
#include "support/error_message.hpp"
#include "support/gpu.hpp"
#include "support/read_tables.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

std::vector<std::uint16_t> random_keys(std::size_t count, int d, std::uint64_t seed,
                                       bool ties = false) {
  std::vector<std::uint16_t> k(count);
  for (std::size_t i = 0; i < count; ++i) {
    float v = random_normal(seed, i) *
              (0.2f + static_cast<float>(i % static_cast<std::size_t>(d)) / 16.0f);
    if (ties) v = (i / static_cast<std::size_t>(d)) % 7 == 0 ? v : 0.5f;  // most tokens identical
    k[i] = float_to_bf16(v);
  }
  return k;
}

template <class T>
std::vector<T> to_host(const T* p, std::size_t n, Backend b) {
  std::vector<T> v(n);
  copy_bytes(v.data(), p, n * sizeof(T), b);
  return v;
}

template <class T>
Buffer<T> to_device(const std::vector<T>& v, const char* label) {
  auto buf = Buffer<T>::device(v.size(), Backend::cuda, label);
  copy_bytes(buf.device_data(), v.data(), v.size() * sizeof(T), Backend::cuda);
  return buf;
}

// Fills a CPU store and a CUDA store with the same keys, appended in the same pieces.
void fill_both(PlaneStore& cpu, PlaneStore& gpu, const std::vector<std::uint16_t>& keys,
               std::int64_t n, std::int32_t streams, const std::vector<std::int64_t>& pieces) {
  const int d = cpu.channels();
  auto dev = to_device(keys, "test keys");
  Stream stream(Backend::cuda);
  std::int64_t done = 0;
  for (std::int64_t piece : pieces) {
    const std::int64_t take = std::min(piece, n - done);
    if (take <= 0) break;
    cpu.append(0, streams, keys.data() + done * d, d, n * d, take);
    gpu.append(0, streams, dev.device_data() + done * d, d, n * d, take, stream.native());
    done += take;
  }
  stream.synchronize();
}

/// In a list of budgets: plan with a random budget per KV head (DepthPlanArgs::budgets).
constexpr int kPerHeadBudgets = -1;

TEST(FathomGpu, QuantizeAndAppendMatchTwinBothLayouts) {
  HISPARSE_REQUIRE_GPU();
  const int d = 128, streams = 3;
  const std::int64_t n = 64 * 37 + 5;
  const auto keys = random_keys(static_cast<std::size_t>(n) * streams * d, d, 5);
  for (auto kind : {PlaneLayoutKind::host, PlaneLayoutKind::hbm}) {
    PlaneStore cpu(Backend::cpu, kind, streams, d, n);
    PlaneStore gpu(Backend::cuda, kind, streams, d, n);
    fill_both(cpu, gpu, keys, n, streams, {1, 2, 61, 64 * 20, 7, n});
    const auto& L = cpu.layout();
    const auto words = to_host(
        gpu.words(), static_cast<std::size_t>(L.words_per_stream() * streams), Backend::cuda);
    const auto scales = to_host(
        gpu.scales(), static_cast<std::size_t>(L.scales_per_stream() * streams), Backend::cuda);
    std::size_t word_diff = 0, scale_diff = 0;
    for (int s = 0; s < streams; ++s)
      for (std::int64_t b = 0; b * 64 < n; ++b)
        for (int j = 0; j < d; ++j) {
          const auto si = s * L.scales_per_stream() + L.scale_index(b, j);
          scale_diff += scales[si] != cpu.host_scales()[si];
          for (int p = 0; p < 4; ++p) {
            const auto wi = s * L.words_per_stream() + L.word_index(b, j, p);
            word_diff += words[wi] != cpu.host_words()[wi];
          }
        }
    EXPECT_EQ(word_diff, 0u) << static_cast<int>(kind);
    EXPECT_EQ(scale_diff, 0u) << static_cast<int>(kind);
    EXPECT_EQ(gpu.length(2), n);
  }
}

TEST(FathomGpu, PlannerMatchesBisectionTwinExactly) {
  HISPARSE_REQUIRE_GPU();
  const int d = 128, heads = 4, kv = 8, streams = 64;
  std::vector<float> q(static_cast<std::size_t>(streams) * heads * d),
      var(static_cast<std::size_t>(kv) * d);
  Rng rng(9);
  for (auto& x : q) x = rng.normal();
  for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
  var[5] = 0.0f;  // a dead channel
  auto qd = to_device(q, "q");
  auto vd = to_device(var, "var");
  for (int budget : {0, 1, 40, 48, 64, 80, 128, 300, 512}) {
    auto depths = Buffer<std::uint8_t>::device(static_cast<std::size_t>(streams) * d, Backend::cuda,
                                               "depths");
    auto theta = Buffer<float>::device(streams, Backend::cuda, "theta");
    kf::DepthPlanArgs a;
    a.queries = qd.device_data();
    a.variances = vd.device_data();
    a.variance_period = kv;
    a.streams = streams;
    a.heads = heads;
    a.channels = d;
    a.budget = budget;
    a.depths = depths.device_data();
    a.log2_theta = theta.device_data();
    Stream stream(Backend::cuda);
    DepthPlanner(Backend::cuda).plan(a, stream.native());
    stream.synchronize();
    std::vector<std::uint8_t> want(static_cast<std::size_t>(streams) * d);
    std::vector<float> want_theta(streams);
    kf::DepthPlanArgs r = a;
    r.queries = q.data();
    r.variances = var.data();
    r.depths = want.data();
    r.log2_theta = want_theta.data();
    kf::depth_plan_bisection_ref(r);
    EXPECT_EQ(to_host(depths.device_data(), want.size(), Backend::cuda), want)
        << "budget " << budget;
    EXPECT_EQ(to_host(theta.device_data(), want_theta.size(), Backend::cuda), want_theta)
        << "budget " << budget;
  }
}

// The measured-rule planner kernel (one warp per stream) against its twin, on random read tables:
// every width instance, 1 to 8 heads, tied channels, budgets from nothing to every plane. Depths
// (sign reads included) and gained queries must be identical.
TEST(FathomGpu, MeasuredPlannerMatchesTheTwinExactly) {
  HISPARSE_REQUIRE_GPU();
  int signs = 0;
  for (const auto& [d, heads] : std::vector<std::pair<int, int>>{
           {32, 1}, {40, 4}, {64, 8}, {100, 2}, {128, 4}, {200, 3}, {256, 8}}) {
    const int period = 8, streams = 37;
    const auto reads =
        test::random_read_calibrations(period, d, 100 + static_cast<std::uint64_t>(d));
    std::vector<float> distortion, gain;
    pack_read_tables(reads, d, distortion, gain);
    Rng rng(static_cast<std::uint64_t>(d * 10 + heads));
    std::vector<float> q(static_cast<std::size_t>(streams) * heads * d);
    for (auto& x : q) x = static_cast<float>(rng.normal());
    for (int s = 0; s < streams; s += 2)  // channels 1-3 tie with channel 0 in even streams
      for (int h = 0; h < heads; ++h)
        for (int j = 1; j < 4; ++j) {
          const auto at = (static_cast<std::size_t>(s) * heads + h) * d;
          q[at + j] = q[at];
        }
    auto qd = to_device(q, "q");
    auto dist_d = to_device(distortion, "read errors");
    auto gain_d = to_device(gain, "read gains");
    std::vector<std::int32_t> per_head(static_cast<std::size_t>(period));
    for (auto& b : per_head) b = static_cast<std::int32_t>(rng.below(4 * d + 1));
    per_head.front() = 0;
    auto per_head_d = to_device(per_head, "budgets");
    for (int budget : {0, 1, 9, 48, 128, 4 * d, kPerHeadBudgets}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", heads " + std::to_string(heads) +
                   ", budget " + std::to_string(budget));
      auto depths = Buffer<std::uint8_t>::device(static_cast<std::size_t>(streams) * d,
                                                 Backend::cuda, "depths");
      auto gained = Buffer<float>::device(q.size(), Backend::cuda, "gained");
      kf::MeasuredPlanArgs a;
      a.queries = qd.device_data();
      a.distortion = dist_d.device_data();
      a.gain = gain_d.device_data();
      a.period = period;
      a.streams = streams;
      a.heads = heads;
      a.channels = d;
      a.budget = budget == kPerHeadBudgets ? 4 * d : budget;
      a.budgets = budget == kPerHeadBudgets ? per_head_d.device_data() : nullptr;
      a.depths = depths.device_data();
      a.gained_queries = gained.device_data();
      Stream stream(Backend::cuda);
      DepthPlanner(Backend::cuda).plan_measured(a, stream.native());
      stream.synchronize();
      std::vector<std::uint8_t> want(static_cast<std::size_t>(streams) * d);
      std::vector<float> want_q(q.size());
      kf::MeasuredPlanArgs r = a;
      r.queries = q.data();
      r.distortion = distortion.data();
      r.gain = gain.data();
      r.depths = want.data();
      r.gained_queries = want_q.data();
      if (a.budgets != nullptr) r.budgets = per_head.data();
      kf::depth_plan_measured_ref(r);
      const auto got = to_host(depths.device_data(), want.size(), Backend::cuda);
      ASSERT_EQ(got, want);
      ASSERT_EQ(to_host(gained.device_data(), want_q.size(), Backend::cuda), want_q);
      signs += static_cast<int>(std::count(want.begin(), want.end(), kf::kSignRead));
    }
  }
  EXPECT_GT(signs, 10);  // the plans hold sign reads
}

// The kernel is instantiated for 1, 2, 4 and 8 channels per lane and loads every head up front:
// widths at and between the instance limits, 1 to 8 heads, dead and tied channels, and more
// KV heads than streams.
TEST(FathomGpu, PlannerMatchesBisectionTwinOnEveryWidthAndGroup) {
  HISPARSE_REQUIRE_GPU();
  struct Shape {
    int d, heads, kv, streams;
  };
  for (const Shape sh :
       {Shape{24, 1, 2, 5}, Shape{32, 3, 4, 9}, Shape{64, 8, 8, 16}, Shape{100, 2, 3, 33},
        Shape{128, 4, 8, 64}, Shape{200, 5, 1, 7}, Shape{256, 8, 8, 40}, Shape{256, 1, 16, 3}}) {
    std::vector<float> q(static_cast<std::size_t>(sh.streams) * sh.heads * sh.d),
        var(static_cast<std::size_t>(sh.kv) * sh.d);
    Rng rng(static_cast<std::uint64_t>(sh.d * 131 + sh.heads));
    for (auto& x : q) x = rng.normal();
    for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
    var[1] = 0.0f;                                                 // a dead channel
    for (int j = 2; j < std::min(sh.d, 10); ++j) var[j] = var[2];  // equal variances
    auto qd = to_device(q, "q");
    auto vd = to_device(var, "var");
    // A budget per KV head (DepthPlanArgs::budgets): random, 0 and every plane included.
    std::vector<std::int32_t> per_head(static_cast<std::size_t>(sh.kv));
    for (auto& b : per_head) b = static_cast<std::int32_t>(rng.below(4 * sh.d + 1));
    per_head.front() = 0;
    per_head.back() = 4 * sh.d;
    auto per_head_d = to_device(per_head, "budgets");
    for (int budget : {0, 3, 48, 4 * sh.d - 1, 4 * sh.d, kPerHeadBudgets}) {
      SCOPED_TRACE("d " + std::to_string(sh.d) + " heads " + std::to_string(sh.heads) + " budget " +
                   std::to_string(budget));
      const auto n = static_cast<std::size_t>(sh.streams) * sh.d;
      auto depths = Buffer<std::uint8_t>::device(n, Backend::cuda, "depths");
      copy_bytes(depths.device_data(), std::vector<std::uint8_t>(n, 9).data(), n, Backend::cuda);
      auto theta = Buffer<float>::device(sh.streams, Backend::cuda, "theta");
      kf::DepthPlanArgs a;
      a.queries = qd.device_data();
      a.variances = vd.device_data();
      a.variance_period = sh.kv;
      a.streams = sh.streams;
      a.heads = sh.heads;
      a.channels = sh.d;
      a.budget = budget == kPerHeadBudgets ? 4 * sh.d : budget;
      a.budgets = budget == kPerHeadBudgets ? per_head_d.device_data() : nullptr;
      a.depths = depths.device_data();
      a.log2_theta = theta.device_data();
      Stream stream(Backend::cuda);
      DepthPlanner(Backend::cuda).plan(a, stream.native());
      stream.synchronize();
      std::vector<std::uint8_t> want(n);
      std::vector<float> want_theta(static_cast<std::size_t>(sh.streams));
      kf::DepthPlanArgs r = a;
      r.queries = q.data();
      r.variances = var.data();
      if (a.budgets != nullptr) r.budgets = per_head.data();
      r.depths = want.data();
      r.log2_theta = want_theta.data();
      kf::depth_plan_bisection_ref(r);
      EXPECT_EQ(to_host(depths.device_data(), n, Backend::cuda), want);
      EXPECT_EQ(to_host(theta.device_data(), want_theta.size(), Backend::cuda), want_theta);
    }
  }
}

struct ScanCase {
  PlaneLayoutKind kind;
  std::vector<std::int64_t> lengths;  // per stream (sequence x KV head)
  int heads;
  int top_k;
  int budget;
  bool ties;
  int d = 128;  ///< head_dim
  /// Row stride of the scores and what the merge kernel is sized for (PlaneScanArgs::max_tokens);
  /// 0: the longest stream. Above about 1.6M tokens the merge sorts with the bitonic network
  /// instead of the bitmap of positions.
  std::int64_t max_tokens = 0;
  /// Then one PlaneScan runs twice, the second time with the queries times -1/4: nothing the
  /// first call left in the reused workspace (candidates, counts, thresholds) may leak into it.
  bool rerun_negated = false;
  /// Every other depth-1 channel of each stream's plan becomes a sign read (kf::kSignRead: no
  /// scales read), as PlanRule::measured plans them. The fused plan is then not checked (the
  /// GPU planner never makes sign reads).
  bool sign_reads = false;
  /// A budget per KV head (each <= budget): the plan has one variance row per entry (stream s
  /// uses row s % size), planned with DepthPlanArgs::budgets and fused with plan_budgets.
  std::vector<std::int32_t> head_budgets = {};
  /// SMs the chunks are planned for (PlaneScan::set_multiprocessors); 0: the device's.
  int multiprocessors = 0;
  /// > 0: the chunks per stream the workspace must plan for the default variant 0 (so that a
  /// case is sure to take a path; the other variants hold more blocks per SM).
  int expect_chunks = 0;
};

// Scan runs of run_scan_case whose workspace sized chunks by work (chunk_period > 0).
int g_work_sized_runs = 0;

// The first `count[s]` entries of each stream's selection equal the twin's.
void expect_same_selection(const std::vector<std::int32_t>& want,
                           const std::vector<std::int32_t>& want_count,
                           const Buffer<std::int32_t>& sel, const Buffer<std::int32_t>& cnt,
                           std::size_t max_sel) {
  const auto got_count = to_host(cnt.device_data(), cnt.size(), Backend::cuda);
  const auto got = to_host(sel.device_data(), sel.size(), Backend::cuda);
  for (std::size_t s = 0; s < want_count.size(); ++s) {
    ASSERT_EQ(got_count[s], want_count[s]) << "stream " << s;
    for (std::int32_t i = 0; i < want_count[s]; ++i)
      ASSERT_EQ(got[s * max_sel + static_cast<std::size_t>(i)],
                want[s * max_sel + static_cast<std::size_t>(i)])
          << "stream " << s << " entry " << i;
  }
}

void run_scan_case(const ScanCase& c) {
  const int d = c.d;
  const auto streams = static_cast<std::int32_t>(c.lengths.size());
  const std::int64_t cap = *std::max_element(c.lengths.begin(), c.lengths.end());
  PlaneStore cpu(Backend::cpu, c.kind, streams, d, cap);
  PlaneStore gpu(Backend::cuda, c.kind, streams, d, cap);
  Stream stream(Backend::cuda);
  for (std::int32_t s = 0; s < streams; ++s) {
    const auto keys = random_keys(static_cast<std::size_t>(c.lengths[s]) * d, d,
                                  100 + static_cast<std::uint64_t>(s), c.ties);
    auto dev = to_device(keys, "keys");
    cpu.append(s, 1, keys.data(), d, 0, c.lengths[s]);
    gpu.append(s, 1, dev.device_data(), d, 0, c.lengths[s], stream.native());
    stream.synchronize();
  }
  const auto period = static_cast<std::int32_t>(std::max<std::size_t>(c.head_budgets.size(), 1));
  std::vector<float> q(static_cast<std::size_t>(streams) * c.heads * d),
      var(static_cast<std::size_t>(period) * d);
  Rng rng(77);
  for (auto& x : q) x = rng.normal();
  for (auto& v : var) v = std::pow(10.0f, -2.0f * rng.uniform());
  std::vector<std::uint8_t> depths(static_cast<std::size_t>(streams) * d);
  kf::DepthPlanArgs p;
  p.queries = q.data();
  p.variances = var.data();
  p.variance_period = period;
  p.budgets = c.head_budgets.empty() ? nullptr : c.head_budgets.data();
  p.streams = streams;
  p.heads = c.heads;
  p.channels = d;
  p.budget = c.budget;
  p.depths = depths.data();
  kf::depth_plan_bisection_ref(p);
  if (c.sign_reads) {
    int ones = 0, signs = 0;
    for (auto& t : depths)
      if (t == 1 && ones++ % 2 == 0) t = kf::kSignRead, ++signs;
    ASSERT_GE(signs, streams) << "too few depth-1 channels to test sign reads";
    ASSERT_GT(ones, signs);
  }
  auto qd = to_device(q, "q");
  auto dd = to_device(depths, "depths");

  kf::PlaneScanArgs ref = PlaneScan::args_for(cpu);
  ref.queries = q.data();
  ref.depths = depths.data();
  ref.heads = c.heads;
  ref.keep = c.top_k - 36;
  const auto max_sel = static_cast<std::size_t>(ref.max_selected());
  if (c.max_tokens > 0) ref.max_tokens = c.max_tokens;
  const std::int64_t stride = ref.max_tokens;  // of the score rows, on both sides
  std::vector<std::int32_t> want(max_sel * streams), want_count(streams);
  std::vector<float> want_scores(static_cast<std::size_t>(streams) * c.heads * stride);
  ref.selected = want.data();
  ref.selected_count = want_count.data();
  ref.scores = want_scores.data();
  kf::plane_scan_select_ref(ref);

  kf::PlaneScanArgs a = PlaneScan::args_for(gpu);
  a.queries = qd.device_data();
  a.depths = dd.device_data();
  a.heads = c.heads;
  a.keep = c.top_k - 36;
  a.max_tokens = stride;
  auto sel = Buffer<std::int32_t>::device(max_sel * streams, Backend::cuda, "sel");
  auto cnt = Buffer<std::int32_t>::device(streams, Backend::cuda, "cnt");
  auto scores = Buffer<float>::device(want_scores.size(), Backend::cuda, "scores");
  a.selected = sel.device_data();
  a.selected_count = cnt.device_data();
  a.scores = scores.device_data();
  // Every kernel variant (plane_scan_config.hpp), and for host planes both the staged copy and
  // the scan's own reads of mapped memory, must reproduce the twin bit for bit; the outputs are
  // overwritten with a sentinel before each run.
  // Staged host planes run with the default copy shape and with two copy blocks per stream
  // moving three rounds at a time.
  struct Staging {
    bool on;
    int copy_blocks, rounds_per_copy;
    std::string name;
  };
  const std::vector<Staging> stagings =
      c.kind == PlaneLayoutKind::host
          ? std::vector<Staging>{{true, 0, 0, "staged"},
                                 {true, 2 * streams, 3, "staged, 2 parts, 3 rounds per copy"},
                                 {false, 0, 0, "direct"}}
          : std::vector<Staging>{{false, 0, 0, "HBM"}};
  for (int run = 0; run < kf::kScanVariantCount * static_cast<int>(stagings.size()); ++run) {
    const int variant = run % kf::kScanVariantCount;
    const Staging& staging = stagings[static_cast<std::size_t>(run / kf::kScanVariantCount)];
    SCOPED_TRACE("scan variant " + std::to_string(variant) + ", " + staging.name);
    copy_bytes(sel.device_data(), std::vector<std::int32_t>(sel.size(), -7).data(), sel.size() * 4,
               Backend::cuda);
    copy_bytes(cnt.device_data(), std::vector<std::int32_t>(cnt.size(), -7).data(), cnt.size() * 4,
               Backend::cuda);
    copy_bytes(scores.device_data(), std::vector<float>(scores.size(), -7.0f).data(),
               scores.size() * 4, Backend::cuda);
    PlaneScan scan(Backend::cuda);
    scan.set_variant(variant);
    scan.set_host_staging(staging.on, staging.copy_blocks, staging.rounds_per_copy);
    // The copy-span diagnostic (PlaneStaging::copy_clock) on the shaped staging: the copy
    // blocks record when the first started and the last ended.
    const bool clocked = staging.copy_blocks > 0;
    auto clock = Buffer<unsigned long long>::device(2, Backend::cuda, "copy clock");
    if (clocked) {
      const unsigned long long unset[2] = {~0ull, 0};
      copy_bytes(clock.device_data(), unset, sizeof(unset), Backend::cuda);
      scan.set_copy_clock(clock.device_data());
    }
    if (c.multiprocessors > 0) scan.set_multiprocessors(c.multiprocessors);
    scan.run(a, c.budget, stream.native(), c.head_budgets);
    stream.synchronize();
    if (clocked) {
      const auto span = to_host(clock.device_data(), 2, Backend::cuda);
      const bool copied = scan.workspace().staging.enabled();
      EXPECT_EQ(span[0] != ~0ull, copied) << "copy start";
      EXPECT_EQ(span[1] > span[0] && span[1] != 0, copied) << "copy end after its start";
    }
    EXPECT_EQ(scan.workspace().variant, variant);
    if (c.expect_chunks > 0 && variant == 0) {
      EXPECT_EQ(scan.workspace().chunks, c.expect_chunks);
    }
    if (scan.workspace().chunk_period > 0) ++g_work_sized_runs;
    // The staging path really ran (where asked for, on the variant compiled for it), in the
    // shape asked for; the other variants read host planes in place.
    const kf::PlaneStaging& st = scan.workspace().staging;
    EXPECT_EQ(st.enabled(), staging.on && variant == kf::kStagedVariant);
    if (st.enabled() && staging.copy_blocks > 0) {
      EXPECT_EQ(st.parts, 2);
      EXPECT_EQ(st.rounds_per_copy, 3);
    }
    const auto got_count = to_host(cnt.device_data(), cnt.size(), Backend::cuda);
    const auto got = to_host(sel.device_data(), sel.size(), Backend::cuda);
    const auto got_scores = to_host(scores.device_data(), scores.size(), Backend::cuda);
    for (std::int32_t s = 0; s < streams; ++s) {
      ASSERT_EQ(got_count[s], want_count[s]) << "stream " << s << " length " << c.lengths[s];
      for (std::int32_t i = 0; i < want_count[s]; ++i)
        ASSERT_EQ(got[s * max_sel + i], want[s * max_sel + i]) << "stream " << s << " entry " << i;
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t row = (static_cast<std::size_t>(s) * c.heads + h) * stride;
        std::int64_t first = -1, differ = 0;
        for (std::int64_t t = 0; t < c.lengths[s]; ++t)
          if (std::memcmp(&got_scores[row + t], &want_scores[row + t], sizeof(float)) != 0) {
            if (first < 0) first = t;
            ++differ;
          }
        ASSERT_EQ(differ, 0)
            << "scores differ, stream " << s << " head " << h << ": " << differ << " tokens, first "
            << first << " (GPU "
            << got_scores[row + static_cast<std::size_t>(std::max<std::int64_t>(first, 0))]
            << ", twin "
            << want_scores[row + static_cast<std::size_t>(std::max<std::int64_t>(first, 0))] << ")";
      }
    }
  }
  // Seeded selection (PlaneScanArgs::seed_range): whatever the seeds, the selection and each
  // head's (keep-th, top) scores equal the twin's. Seeds: the twin's own ranges (every seed
  // proven); then even streams seeded a quarter range below and odd streams above their top (no
  // candidate: a rescan), twice on one PlaneScan so that counts left by the first call would
  // show; then NaN (no seed).
  {
    std::vector<float> want_range(static_cast<std::size_t>(streams) * c.heads * 2);
    kf::PlaneScanArgs ranged = ref;
    ranged.scores = nullptr;
    ranged.score_range = want_range.data();
    kf::plane_scan_select_ref(ranged);
    for (std::int32_t s = 0; s < streams; ++s)
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t e = (static_cast<std::size_t>(s) * c.heads + h) * 2;
        const std::int64_t eligible = std::max<std::int64_t>(0, c.lengths[s] - 36);
        ASSERT_EQ(std::isnan(want_range[e + 1]), eligible == 0) << "stream " << s;
        ASSERT_EQ(std::isnan(want_range[e]), eligible < ranged.keep) << "stream " << s;
        if (eligible >= ranged.keep) {
          ASSERT_LE(want_range[e], want_range[e + 1]);
        }
      }
    std::vector<float> mixed = want_range, none(want_range.size(), std::nanf(""));
    for (std::size_t e = 0; e < mixed.size(); e += 2)
      if ((e / 2 / static_cast<std::size_t>(c.heads)) % 2 == 1) mixed[e] = mixed[e + 1] + 1.0f;
    auto seeds = Buffer<float>::device(want_range.size(), Backend::cuda, "seed ranges");
    auto range = Buffer<float>::device(want_range.size(), Backend::cuda, "score ranges");
    kf::PlaneScanArgs seeded = a;
    seeded.scores = nullptr;
    seeded.seed_range = seeds.device_data();
    seeded.score_range = range.device_data();
    for (int run = 0; run < kf::kScanVariantCount * static_cast<int>(stagings.size()); ++run) {
      const int variant = run % kf::kScanVariantCount;
      const Staging& staging = stagings[static_cast<std::size_t>(run / kf::kScanVariantCount)];
      PlaneScan scan(Backend::cuda);
      scan.set_variant(variant);
      scan.set_host_staging(staging.on, staging.copy_blocks, staging.rounds_per_copy);
      if (c.multiprocessors > 0) scan.set_multiprocessors(c.multiprocessors);
      const std::pair<const std::vector<float>*, float> runs[] = {
          {&want_range, 0.0f}, {&mixed, 0.25f}, {&mixed, 0.25f}, {&none, 0.25f}};
      for (int k = 0; k < 4; ++k) {
        SCOPED_TRACE("seeded run " + std::to_string(k) + ", scan variant " +
                     std::to_string(variant) + ", " + staging.name);
        copy_bytes(seeds.device_data(), runs[k].first->data(), want_range.size() * 4,
                   Backend::cuda);
        copy_bytes(cnt.device_data(), std::vector<std::int32_t>(cnt.size(), -7).data(),
                   cnt.size() * 4, Backend::cuda);
        copy_bytes(range.device_data(), std::vector<float>(want_range.size(), -7.0f).data(),
                   want_range.size() * 4, Backend::cuda);
        seeded.seed_margin = runs[k].second;
        scan.run(seeded, c.budget, stream.native(), c.head_budgets);
        stream.synchronize();
        expect_same_selection(want, want_count, sel, cnt, max_sel);
        const auto got_range = to_host(range.device_data(), range.size(), Backend::cuda);
        for (std::size_t e = 0; e < want_range.size(); ++e)
          ASSERT_EQ(std::memcmp(&got_range[e], &want_range[e], sizeof(float)), 0)
              << "range entry " << e << ": GPU " << got_range[e] << ", twin " << want_range[e];
      }
    }
  }
  if (c.sign_reads) return;
  // The fused plan: every scan block plans its own stream; same depths, same selection.
  auto vard = to_device(var, "variances");
  auto budgets_d = to_device(
      c.head_budgets.empty() ? std::vector<std::int32_t>{c.budget} : c.head_budgets, "budgets");
  auto planned = Buffer<std::uint8_t>::device(depths.size(), Backend::cuda, "planned depths");
  kf::PlaneScanArgs fused = a;
  fused.depths = nullptr;
  fused.plan_variances = vard.device_data();
  fused.plan_variance_period = period;
  fused.plan_budget = c.budget;
  fused.plan_budgets = c.head_budgets.empty() ? nullptr : budgets_d.device_data();
  fused.planned_depths = planned.device_data();
  fused.scores = nullptr;
  for (int run = 0; run < kf::kScanVariantCount * static_cast<int>(stagings.size()); ++run) {
    const int variant = run % kf::kScanVariantCount;
    const Staging& staging = stagings[static_cast<std::size_t>(run / kf::kScanVariantCount)];
    SCOPED_TRACE("fused plan, scan variant " + std::to_string(variant) + ", " + staging.name);
    copy_bytes(planned.device_data(), std::vector<std::uint8_t>(planned.size(), 9).data(),
               planned.size(), Backend::cuda);
    copy_bytes(cnt.device_data(), std::vector<std::int32_t>(cnt.size(), -7).data(), cnt.size() * 4,
               Backend::cuda);
    PlaneScan scan(Backend::cuda);
    scan.set_variant(variant);
    scan.set_host_staging(staging.on, staging.copy_blocks, staging.rounds_per_copy);
    if (c.multiprocessors > 0) scan.set_multiprocessors(c.multiprocessors);
    scan.run(fused, c.budget, stream.native(), c.head_budgets);
    stream.synchronize();
    EXPECT_EQ(to_host(planned.device_data(), planned.size(), Backend::cuda), depths);
    expect_same_selection(want, want_count, sel, cnt, max_sel);
  }
  if (!c.rerun_negated) return;
  // One scan object, two calls: q, then -q / 4 (the same given depths; other top tokens with
  // scores a quarter as large, so a threshold left from the first call would drop most of them).
  PlaneScan again(Backend::cuda);
  again.run(a, c.budget, stream.native());
  stream.synchronize();
  expect_same_selection(want, want_count, sel, cnt, max_sel);
  for (auto& x : q) x = -0.25f * x;
  copy_bytes(qd.device_data(), q.data(), q.size() * sizeof(float), Backend::cuda);
  ref.queries = q.data();
  ref.scores = nullptr;
  kf::plane_scan_select_ref(ref);
  a.scores = nullptr;
  again.run(a, c.budget, stream.native());
  stream.synchronize();
  SCOPED_TRACE("second call, queries times -1/4");
  expect_same_selection(want, want_count, sel, cnt, max_sel);
}

TEST(FathomGpu, ScanSelectMatchesTwinHbm) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::hbm, {5000, 70001, 37, 1, 2048, 9000}, 4, 512, 48, false});
}

TEST(FathomGpu, ScanSelectMatchesTwinHost) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::host, {40000, 3333, 100, 65536}, 4, 512, 64, false});
}

TEST(FathomGpu, ScanSelectMatchesTwinLargeTopKAndFullBudget) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::hbm, {20000, 131072}, 4, 2048, 128, false});
  run_scan_case({PlaneLayoutKind::hbm, {6000, 1500}, 2, 300, 512, false});
  run_scan_case({PlaneLayoutKind::hbm, {30000}, 8, 256, 40, false});
}

TEST(FathomGpu, ScanSelectBreaksTiesByPositionLikeTheTwin) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::hbm, {12000, 50000}, 4, 512, 48, true});
  run_scan_case({PlaneLayoutKind::host, {12000}, 4, 512, 48, true});
}

// The tensor-core scan (8-bit weights, integer MMAs) on shapes that exercise its padding: an odd
// number of heads (a half-empty head pair), head_dim 40 (slots not a multiple of 16), one head,
// tiny budgets, every plane of 64 channels, 8 heads.
TEST(FathomGpu, ScanSelectMatchesTwinOddShapes) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::hbm, {3000, 777, 64}, 3, 256, 48, false, 40});
  run_scan_case({PlaneLayoutKind::host, {10000, 65}, 1, 100, 7, false, 128});
  run_scan_case({PlaneLayoutKind::hbm, {4096, 5000}, 8, 128, 256, false, 64});
  run_scan_case({PlaneLayoutKind::host, {2000}, 4, 64, 1, false, 128});
}

// One long stream split over many chunks (one per resident scan block) and merged.
TEST(FathomGpu, ScanSelectMatchesTwinManyChunksPerStream) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::host, {262144 + 31}, 4, 512, 48, false});
  run_scan_case({PlaneLayoutKind::hbm, {200000, 3}, 4, 512, 80, false});
  // Equal scores over a long stream split over many chunks: the radix selects of the scan and
  // the merge decide on the positions' digits.
  run_scan_case({PlaneLayoutKind::hbm, {150000}, 4, 512, 48, true});
  ScanCase twice{PlaneLayoutKind::hbm, {200000, 150000}, 4, 512, 48, false};
  twice.rerun_negated = true;
  run_scan_case(twice);
}

// Seeded scans whose rescan is spread over the whole grid (kf::rescan_share): the seeded runs
// of run_scan_case put odd streams' seeds above their top, so here the long stream's rescan
// takes every block of the grid, and the head merge reads its rescan lists. Planned for one
// SM, every stream has one chunk (variant 0; 2 for the others): the merge then runs for the
// rescanned streams only, and the finalize reads the others' keys straight from the scan.
TEST(FathomGpu, SeededRescanIsSpreadOverTheGrid) {
  HISPARSE_REQUIRE_GPU();
  run_scan_case({PlaneLayoutKind::hbm, {3000, 200000}, 4, 512, 48, false});
  ScanCase one_chunk{PlaneLayoutKind::hbm, {5000, 70001, 37, 2048, 9000, 3000}, 4, 512, 48, false};
  one_chunk.multiprocessors = 1;
  one_chunk.expect_chunks = 1;
  run_scan_case(one_chunk);
  one_chunk.kind = PlaneLayoutKind::host;  // read in place by the variants without staging
  run_scan_case(one_chunk);
}

// Sized for 1.9M tokens, the merge kernel's bitmap of positions no longer fits its shared memory
// and it sorts the selection with the bitonic network instead (plan_finalize_smem).
TEST(FathomGpu, ScanSelectMatchesTwinWithTheBitonicMerge) {
  HISPARSE_REQUIRE_GPU();
  ScanCase c{PlaneLayoutKind::hbm, {20000, 777}, 4, 512, 48, false};
  c.max_tokens = 1900000;
  run_scan_case(c);
  c.kind = PlaneLayoutKind::host;
  run_scan_case(c);
}

// Sign reads (PlanRule::measured): the scan takes their block scales as 1 and the staged copy
// moves no scales for them; every variant, staged and direct, must still equal the twin.
TEST(FathomGpu, ScanSelectMatchesTwinWithSignReads) {
  HISPARSE_REQUIRE_GPU();
  ScanCase hbm{PlaneLayoutKind::hbm, {5000, 70001, 37, 2048}, 4, 512, 48, false};
  hbm.sign_reads = true;
  run_scan_case(hbm);
  ScanCase host{PlaneLayoutKind::host, {40000, 3333, 100, 65536}, 4, 512, 64, false};
  host.sign_reads = true;
  run_scan_case(host);
  ScanCase odd{PlaneLayoutKind::hbm, {3000, 777}, 3, 256, 40, false, 40};
  odd.sign_reads = true;
  run_scan_case(odd);
}

// A budget per KV head, planned apart and fused into the scan (staged copy blocks plan too):
// every stream's depths and selection equal the twin's. The scan is sized for the largest.
TEST(FathomGpu, ScanSelectMatchesTwinWithPerHeadBudgets) {
  HISPARSE_REQUIRE_GPU();
  ScanCase hbm{PlaneLayoutKind::hbm, {5000, 70001, 37, 2048, 9000, 3000}, 4, 512, 96, false};
  hbm.head_budgets = {96, 8, 48};
  run_scan_case(hbm);
  ScanCase host{PlaneLayoutKind::host, {40000, 3333, 100, 65536}, 4, 512, 64, false};
  host.head_budgets = {0, 64, 30, 41};
  run_scan_case(host);
  // Planned for 4 and 8 SMs, the streams take chunks by budget (work-sized chunks,
  // PlaneScanWorkspace::chunk_period: 5, 3 and 4, or 6, 4 and 5) in 11 of the runs: HBM with
  // every variant at 8 SMs and variant 0 at 4, and at 8 SMs host planes wherever they are read
  // in place (7 runs; staged planes keep equal chunks).
  g_work_sized_runs = 0;
  for (const int sms : {4, 8}) {
    SCOPED_TRACE(std::to_string(sms) + " SMs");
    for (const auto kind : {PlaneLayoutKind::hbm, PlaneLayoutKind::host}) {
      ScanCase small{kind, {5000, 70001, 37, 2048, 9000, 3000}, 4, 512, 96, false};
      small.head_budgets = {96, 8, 48};
      small.multiprocessors = sms;
      run_scan_case(small);
    }
  }
  EXPECT_EQ(g_work_sized_runs, 11);
}

// One synthetic KV head of 32K + 11 tokens in a CPU and a CUDA plane store (host layout).
struct SelectorCase {
  static constexpr int kDim = 128, kHeads = 4;
  static constexpr std::int64_t kTokens = 32768 + 11;
  SyntheticKeySpec spec;
  SyntheticKeys data;
  PlaneStore cpu{Backend::cpu, PlaneLayoutKind::host, 1, kDim, kTokens};
  PlaneStore gpu{Backend::cuda, PlaneLayoutKind::host, 1, kDim, kTokens};
  SelectorCase() {
    spec.tokens = kTokens;
    spec.steps = 1;
    data = make_synthetic_keys(spec);
    fill_both(cpu, gpu, data.keys, kTokens, 1, {kTokens});
  }
};

TEST(FathomGpu, SelectorOnGpuEqualsSelectorOnCpu) {
  HISPARSE_REQUIRE_GPU();
  const SelectorCase c;
  FathomSelector on_cpu(Backend::cpu, SelectorConfig{512, 4, 32, 48});
  FathomSelector on_gpu(Backend::cuda, SelectorConfig{512, 4, 32, 48});
  const auto a = on_cpu.select(c.cpu, c.data.query(0), c.kHeads, c.data.variance.data(), 1);
  const auto b = on_gpu.select(c.gpu, c.data.query(0), c.kHeads, c.data.variance.data(), 1);
  // Greedy (CPU) and bisection (GPU) depths agree away from exact ties; then so do selections.
  ASSERT_EQ(on_cpu.last_depths(), on_gpu.last_depths());
  EXPECT_EQ(a, b);
  // A budget per KV head in place of the configured one (copied to the device per call).
  const std::vector<std::int32_t> budgets = {72};
  const auto a72 =
      on_cpu.select(c.cpu, c.data.query(0), c.kHeads, c.data.variance.data(), 1, nullptr, budgets);
  const auto b72 =
      on_gpu.select(c.gpu, c.data.query(0), c.kHeads, c.data.variance.data(), 1, nullptr, budgets);
  ASSERT_EQ(on_cpu.last_depths(), on_gpu.last_depths());
  EXPECT_EQ(std::accumulate(on_gpu.last_depths().begin(), on_gpu.last_depths().end(), 0), 72);
  EXPECT_EQ(a72, b72);
  EXPECT_NE(a72, a);
}

// SelectorConfig::seeded over decode steps whose queries drift: each GPU call is seeded by the
// previous one's score ranges and must select what the unseeded CPU selector selects. The last
// step repeats the previous query times 1/8: with positive keep-th scores its seed lies far
// above them, and the scan must find that out and rescan.
TEST(FathomGpu, SeededSelectorOnGpuEqualsSelectorOnCpuOverDriftingSteps) {
  HISPARSE_REQUIRE_GPU();
  constexpr int kDim = 128, kHeads = 4, kSteps = 4;
  constexpr std::int64_t kTokens = 65536 + 7;
  SyntheticKeySpec spec;
  spec.tokens = kTokens;
  spec.steps = kSteps;
  const SyntheticKeys data = make_synthetic_keys(spec);
  PlaneStore cpu(Backend::cpu, PlaneLayoutKind::hbm, 1, kDim, kTokens);
  PlaneStore gpu(Backend::cuda, PlaneLayoutKind::hbm, 1, kDim, kTokens);
  fill_both(cpu, gpu, data.keys, kTokens, 1, {kTokens});
  SelectorConfig config{512, 4, 32, 48};
  FathomSelector on_cpu(Backend::cpu, config);
  config.seeded = true;
  FathomSelector on_gpu(Backend::cuda, config);
  for (int step = 0; step <= kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<float> q(data.query(std::min(step, kSteps - 1)),
                         data.query(std::min(step, kSteps - 1)) + kHeads * kDim);
    if (step == kSteps)
      for (auto& x : q) x *= 0.125f;
    const auto a = on_cpu.select(cpu, q.data(), kHeads, data.variance.data(), 1);
    const auto b = on_gpu.select(gpu, q.data(), kHeads, data.variance.data(), 1);
    ASSERT_EQ(on_cpu.last_depths(), on_gpu.last_depths());
    EXPECT_EQ(a, b);
  }
}

// A seeded launch needs the workspace's seed counters and rescan lists (PlaneScan allocates
// them); a workspace without the rescan lists is refused before anything runs, with one message
// that names what is missing and the fix.
TEST(FathomGpu, SeededLaunchWithoutRescanListsIsRefused) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA  // the launcher exists in CUDA builds only
  PlaneStore store(Backend::cuda, PlaneLayoutKind::hbm, 1, 128, 4096);
  kf::PlaneScanArgs a = PlaneScan::args_for(store);
  a.heads = 4;
  a.keep = 476;
  a.max_tokens = 4096;
  auto seeds = Buffer<float>::device(8, Backend::cuda, "seed ranges");
  a.seed_range = seeds.device_data();
  kf::PlaneScanWorkspace ws = kf::plan_scan_workspace(a, 48, 132);
  auto records = Buffer<std::uint8_t>::device(static_cast<std::size_t>(ws.record_bytes_total(a)),
                                              Backend::cuda, "records");
  auto hits = Buffer<std::int32_t>::device(4, Backend::cuda, "seed hits");
  ws.records = records.device_data();
  ws.seed_hits = hits.device_data();
  EXPECT_EQ(test::error_message([&] { kf::launch_plane_scan_select(a, ws, nullptr); }),
            "fathom scan: seed_range: a seeded scan without the workspace's seed_hits and rescan "
            "lists; use PlaneScan, or give PlaneScanWorkspace::seed_hits [streams][heads] zeroed "
            "and rescan_candidates / rescan_counts shaped like candidates / candidate_counts");
#endif
}

TEST(FathomGpu, MeasuredRuleSelectorOnGpuEqualsSelectorOnCpu) {
  HISPARSE_REQUIRE_GPU();
  // PlanRule::measured plans on each backend (the CUDA planner kernel on the GPU); the CUDA scan
  // then reads the gained queries and must select what the CPU selector selects.
  const SelectorCase c;
  const std::vector<PlaneReadCalibration> reads = {calibrate_plane_reads(
      c.data.keys.data(), c.kTokens, c.kDim, c.spec.calibration_skip, c.spec.calibration_tokens)};
  SelectorConfig config{512, 4, 32, 48};
  config.rule = PlanRule::measured;
  FathomSelector on_cpu(Backend::cpu, config);
  FathomSelector on_gpu(Backend::cuda, config);
  const ReadTables on_host(Backend::cpu, reads, c.kDim), on_device(Backend::cuda, reads, c.kDim);
  const auto a = on_cpu.select(c.cpu, c.data.query(0), c.kHeads, nullptr, 1, &on_host);
  const auto b = on_gpu.select(c.gpu, c.data.query(0), c.kHeads, nullptr, 1, &on_device);
  ASSERT_EQ(on_cpu.last_depths(), on_gpu.last_depths());
  // The plan holds sign reads, so the CUDA scan read channels without their scales.
  EXPECT_GT(std::count(on_cpu.last_depths().begin(), on_cpu.last_depths().end(),
                       kernels::fathom::kSignRead),
            0);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace hisparse::fathom
