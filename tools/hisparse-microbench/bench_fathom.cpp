// Fathom microbenchmarks on the GPU (Qwen3-8B-shaped streams: 8 KV heads x 4 query heads,
// head_dim 128, top_k 512):
//  - fathom_scan/<hbm|host>/budget:B/context:N/batch:S: the fused plane scan + selection
//    (scan kernel + finalize kernel, one CUDA-graph replay) over batch x 8 streams of N tokens.
//    Planes are random bits and scales random fp16 (the scan's cost does not depend on the
//    values; random scores make the rising selection threshold behave as on real data); depths
//    come from the bisection planner on random queries and variances spread over three decades.
//    Counters: us per call, bytes actually read (active planes + scales of active channels),
//    GB/s, and the fraction of the ceiling measured on the device at start (HBM device copy,
//    read + write, for hbm; pinned host -> device cudaMemcpy for host, whose planes the kernel
//    reads straight from mapped pinned memory, so the transfer is overlapped with the scan).
//  - fathom_scan_seeded/drift:D/margin:M/hbm/...: the same scan seeded (PlaneScanArgs::seed_range,
//    seed_margin M) with the score ranges of a previous step whose queries were q + D x N(0, 1)
//    (queries are N(0, 1)); the seeded selection is checked against the unseeded one first.
//    Counter rescanned_streams: streams whose seed was too high (rescanned unseeded).
//  - fathom_scan_variant/variant:V/...: the same scan with kernel variant V (kScanVariants: threads
//    per block, blocks per SM, tile); label and counters give the resident warps per SM.
//  - fathom_scan_host/{staged|direct}/...: host planes staged into HBM by a copy kernel beside the
//    scan (the default) or read in place by the scan; fathom_scan_stage_tune/copy_blocks:G/
//    rounds_per_copy:K/...: the staging copy's shape; fathom_scan_stage_copy/...: the copy alone.
//    Staged host cases also report copy_us and copy_ceiling_fraction: the transfer's own span
//    (first copy block's start to the last one's end, PlaneStaging::copy_clock) and its rate.
//  - fathom_scan_plan/{given|separate|fused}/hbm/budget:48/context:C/batch:8: the scan with depths
//    planned beforehand, after the planner kernel in the same graph, or planned inside the scan
//    (PlaneScanArgs::plan_variances); the difference is what planning costs a decode step.
//  - fathom_scan_head_budgets/spread:S/chunks:work|uniform/...: budget 48 on average, KV heads
//    alternating at 48 + S and 48 - S (fathom.head_budgets), planned in the scan: what a per-head
//    split costs the scan, with chunks sized by each stream's work or the same for every stream.
//  - fathom_plan/batch:S: the depth planner for batch x 8 streams at budget 48; us per call of one
//    graph replay (what a decode step pays) and per launch within 100 back-to-back launches.
//    fathom_plan_measured/batch:S: the same for PlanRule::measured's planner (read tables
//    calibrated on random keys with spread channel scales and a few biased channels).
//  - fathom_quantize/tokens:T/streams:S: quantize + pack of T bf16 keys per stream (prefill
//    chunks; T = 64 is the decode-time re-quantization of the block being filled). GB/s over
//    keys read + planes and scales written.
// L2 is flushed before every timed call.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "fathom/depth_planner.hpp"
#include "fathom/plane_scan.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "kernels/fathom/plane_scan_config.hpp"
#include "kernels/fathom/plane_stage.hpp"
#include "kernels/fathom/quantize_pack.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {
namespace kf = kernels::fathom;

constexpr int kKvHeads = 8;
constexpr int kGroupHeads = 4;
constexpr int kHeadDim = 128;
constexpr int kDefaultTopK = 512;
/// top_k of the scan benchmarks: 512 (REFERENCE.md's published setting) unless
/// HISPARSE_MICROBENCH_TOPK says otherwise (diagnostics: how much of the time selection takes).
[[maybe_unused]] int scan_top_k() {
  const char* env = std::getenv("HISPARSE_MICROBENCH_TOPK");
  const int k = env ? std::atoi(env) : 0;
  return k > 36 ? k : kDefaultTopK;
}

/// Diagnostic (HISPARSE_MICROBENCH_FLAT_DEPTHS=1): every stream reads its first `budget` channels
/// at depth 1 instead of the planner's depths, the work of the fathom_score_ceiling probe's
/// `slots:budget` cases, so that the scan and the probe can be compared on equal arithmetic.
[[maybe_unused]] bool flat_depths() {
  const char* env = std::getenv("HISPARSE_MICROBENCH_FLAT_DEPTHS");
  return env != nullptr && std::atoi(env) == 1;
}

struct ScanCase {
  kf::PlaneLayoutKind kind;
  int budget;
  std::int64_t context;
  int batch;
  int variant = 0;  ///< kScanVariants index (plane_scan_config.hpp)
  /// Where the depths come from: given (planned before, untimed), separate (the planner kernel
  /// then the scan, both timed in one graph), fused (every scan block plans its own stream).
  enum class Plan { given, separate, fused } plan = Plan::given;
  /// Diagnostic: time the staging copy alone (no scan) in the graph.
  bool copy_only = false;
  /// Host planes: staged into HBM by the copy kernel beside the scan (PlaneStaging), or read by
  /// the scan from mapped host memory itself.
  bool staged = true;
  int copy_blocks = 0;      ///< staging copy blocks, 0: the default
  int rounds_per_copy = 0;  ///< staging rounds per copy step, 0: the default
  /// A budget per KV head: even heads plan budget + spread, odd heads budget - spread (the mean
  /// stays `budget`; DepthPlanArgs::budgets), and the scan is sized for budget + spread.
  int head_spread = 0;
  /// With a spread: chunks sized by each stream's work (PlaneScanWorkspace::chunk_period), or
  /// the same number for every stream (the budgets withheld from the workspace plan).
  bool work_chunks = true;
  /// Seeded selection (PlaneScanArgs::seed_range): the previous step's score ranges, its queries
  /// q + seed_drift x N(0, 1) per element (the queries are N(0, 1)), seed the timed step; < 0:
  /// unseeded.
  double seed_drift = -1;
  float seed_margin = 0.5f;  ///< PlaneScanArgs::seed_margin of the seeded cases
  [[nodiscard]] int max_budget() const { return budget + head_spread; }
};

/// Random queries [streams][heads][d] and per-KV-head variances [kKvHeads][d] spread over three
/// decades, as the planner sees them.
[[maybe_unused]] void random_plan_inputs(std::int32_t streams, std::vector<float>& q,
                                         std::vector<float>& var) {
  Rng rng(2026);
  q.resize(static_cast<std::size_t>(streams) * kGroupHeads * kHeadDim);
  var.resize(static_cast<std::size_t>(kKvHeads) * kHeadDim);
  for (auto& x : q) x = rng.normal();
  for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
}

/// PlanRule::measured's read tables ([kKvHeads][kHeadDim][kReadColumns]) calibrated on random
/// bf16 keys: channel scales over three decades, every 16th channel with a bias of 3 scales.
[[maybe_unused]] void random_read_tables(std::vector<float>& distortion, std::vector<float>& gain) {
  constexpr std::int64_t kTokens = 2048;
  std::vector<fathom::PlaneReadCalibration> reads;
  std::vector<std::uint16_t> keys(static_cast<std::size_t>(kTokens) * kHeadDim);
  for (int h = 0; h < kKvHeads; ++h) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int j = static_cast<int>(i % kHeadDim);
      const float scale = std::pow(10.0f, -1.5f * static_cast<float>((j * 37 + h) % kHeadDim) /
                                              static_cast<float>(kHeadDim));
      keys[i] = float_to_bf16(
          scale * (random_normal(static_cast<std::uint64_t>(h), i) + (j % 16 == 0 ? 3.0f : 0.0f)));
    }
    reads.push_back(fathom::calibrate_plane_reads(keys.data(), kTokens, kHeadDim, 16, 4096));
  }
  fathom::pack_read_tables(reads, kHeadDim, distortion, gain);
}

#if HISPARSE_WITH_CUDA
void run_scan(benchmark::State& state, const ScanCase& c) {
  const std::int32_t streams = c.batch * kKvHeads;
  kf::PlaneLayout layout;
  layout.kind = c.kind;
  layout.channels = kHeadDim;
  const std::int64_t blocks = (c.context + kf::kBlockTokens - 1) / kf::kBlockTokens;
  layout.capacity_blocks =
      (blocks + kf::kSuperblockBlocks - 1) / kf::kSuperblockBlocks * kf::kSuperblockBlocks;
  const auto words_per = static_cast<std::size_t>(layout.words_per_stream());
  const auto scales_per = static_cast<std::size_t>(layout.scales_per_stream());

  // One stream's random planes and scales, replicated into every stream.
  std::vector<std::uint64_t> words(words_per);
  std::vector<std::uint16_t> scales(scales_per);
  random_planes(words, scales);
  const bool host = c.kind == kf::PlaneLayoutKind::host;
  auto make = [&](auto& buf, const auto& one, std::size_t per, const char* label) {
    using T = typename std::decay_t<decltype(one)>::value_type;
    const std::size_t total = per * static_cast<std::size_t>(streams);
    buf = host ? Buffer<T>::pinned(total, Backend::cuda, label)
               : Buffer<T>::device(total, Backend::cuda, label);
    for (std::int32_t s = 0; s < streams; ++s) {
      if (host)
        std::memcpy(buf.host_data() + s * per, one.data(), per * sizeof(T));
      else
        copy_bytes(buf.device_data() + s * per, one.data(), per * sizeof(T), Backend::cuda);
    }
  };
  Buffer<std::uint64_t> d_words;
  Buffer<std::uint16_t> d_scales;
  make(d_words, words, words_per, host ? "host planes" : "HBM planes");
  make(d_scales, scales, scales_per, host ? "host scales" : "HBM scales");

  std::vector<float> q, var;
  random_plan_inputs(streams, q, var);
  std::vector<std::uint8_t> depths(static_cast<std::size_t>(streams) * kHeadDim);
  kf::DepthPlanArgs p;
  p.queries = q.data();
  p.variances = var.data();
  p.variance_period = kKvHeads;
  p.streams = streams;
  p.heads = kGroupHeads;
  p.channels = kHeadDim;
  p.budget = c.max_budget();
  std::vector<std::int32_t> head_budgets(kKvHeads);
  for (int h = 0; h < kKvHeads; ++h)
    head_budgets[static_cast<std::size_t>(h)] =
        c.budget + (h % 2 == 0 ? c.head_spread : -c.head_spread);
  if (c.head_spread != 0) p.budgets = head_budgets.data();
  p.depths = depths.data();
  kf::depth_plan_bisection_ref(p);
  const bool flat = flat_depths() && c.plan == ScanCase::Plan::given;
  if (flat)
    for (std::size_t i = 0; i < depths.size(); ++i)
      depths[i] = static_cast<int>(i % kHeadDim) < c.max_budget() ? 1 : 0;
  double plane_bytes = 0, scale_bytes = 0;
  for (std::int32_t s = 0; s < streams; ++s) {
    const std::span<const std::uint8_t> d(depths.data() + s * kHeadDim, kHeadDim);
    int sum = 0;
    for (auto t : d) sum += t;
    plane_bytes += static_cast<double>(sum) * static_cast<double>(c.context) / 8.0;
    scale_bytes += fathom::active_channels(d) * 2.0 * static_cast<double>(blocks);
  }

  auto d_q = device_copy(q, "queries");
  auto d_depths = device_copy(depths, "depths");
  auto d_var = device_copy(var, "variances");
  auto d_budgets = device_copy(head_budgets, "budgets per KV head");
  auto d_lengths = device_copy(std::vector<std::int64_t>(streams, c.context), "lengths");
  kf::PlaneScanArgs a;
  a.words = d_words.device_data();
  a.scales = d_scales.device_data();
  a.layout = layout;
  a.lengths = d_lengths.device_data();
  a.queries = d_q.device_data();
  a.depths = d_depths.device_data();
  a.streams = streams;
  a.heads = kGroupHeads;
  a.keep = scan_top_k() - a.sinks - a.recent;
  a.max_tokens = c.context;
  auto d_sel = Buffer<std::int32_t>::device(static_cast<std::size_t>(a.max_selected()) * streams,
                                            Backend::cuda, "selection");
  auto d_count = Buffer<std::int32_t>::device(streams, Backend::cuda, "selection counts");
  a.selected = d_sel.device_data();
  a.selected_count = d_count.device_data();

  if (c.plan == ScanCase::Plan::fused) {
    a.depths = nullptr;
    a.plan_variances = d_var.device_data();
    a.plan_variance_period = kKvHeads;
    a.plan_budget = c.max_budget();
    if (c.head_spread != 0) a.plan_budgets = d_budgets.device_data();
  }
  kf::DepthPlanArgs planner = p;  // the separate planner writes the depths the scan reads
  planner.queries = d_q.device_data();
  planner.variances = d_var.device_data();
  if (c.head_spread != 0) planner.budgets = d_budgets.device_data();
  planner.depths = d_depths.device_data();
  Stream stream(Backend::cuda);
  fathom::PlaneScan scan(Backend::cuda);
  scan.set_variant(c.variant);
  scan.set_host_staging(c.staged, c.copy_blocks, c.rounds_per_copy);
  // The staging copy's own span (PlaneStaging::copy_clock): first copy block start to last end.
  const bool clocked = host && c.staged;
  auto d_clock = Buffer<unsigned long long>::device(2, Backend::cuda, "staging copy clock");
  if (clocked) scan.set_copy_clock(d_clock.device_data());
  // Unequal head budgets size the chunks by work (PlaneScanWorkspace::chunk_period).
  const std::span<const std::int32_t> chunk_budgets =
      c.head_spread != 0 && c.work_chunks ? std::span<const std::int32_t>(head_budgets)
                                          : std::span<const std::int32_t>();
  // Warm-up; sizes the workspace outside the capture.
  scan.run(a, c.max_budget(), stream.native(), chunk_budgets);
  stream.synchronize();
  std::vector<std::int32_t> counts(streams);
  copy_bytes(counts.data(), d_count.device_data(), counts.size() * 4, Backend::cuda);
  for (auto n : counts)
    if (n != a.max_selected() && n < scan_top_k()) {
      state.SkipWithError(fmt::format("selection returned {} rows", n).c_str());
      return;
    }
  // Seeded cases: the previous step's ranges (its query drifted by seed_drift) seed the timed
  // step, whose selection must equal the unseeded one.
  Buffer<float> d_prev_range;
  Buffer<float> d_q_prev;
  int rescanned = 0;
  if (c.seed_drift >= 0) {
    // Each stream's selection: its count, then that many positions (the rest of its row holds
    // whatever an earlier call left).
    const auto selection = [&] {
      std::vector<std::int32_t> rows(d_sel.size()), n(static_cast<std::size_t>(streams)), out;
      copy_bytes(rows.data(), d_sel.device_data(), rows.size() * 4, Backend::cuda);
      copy_bytes(n.data(), d_count.device_data(), n.size() * 4, Backend::cuda);
      const auto row = static_cast<std::size_t>(a.max_selected());
      for (std::size_t st = 0; st < n.size(); ++st) {
        out.push_back(n[st]);
        out.insert(out.end(), rows.begin() + static_cast<std::ptrdiff_t>(st * row),
                   rows.begin() + static_cast<std::ptrdiff_t>(st * row) + std::max(n[st], 0));
      }
      return out;
    };
    const std::vector<std::int32_t> unseeded = selection();
    const std::size_t entries = static_cast<std::size_t>(streams) * a.heads * 2;
    auto d_now = Buffer<float>::device(entries, Backend::cuda, "score ranges");
    d_prev_range = Buffer<float>::device(entries, Backend::cuda, "previous score ranges");
    a.score_range = d_now.device_data();
    scan.run(a, c.max_budget(), stream.native(), chunk_budgets);
    Rng drift(77);
    std::vector<float> q_prev = q;
    for (auto& x : q_prev) x += static_cast<float>(c.seed_drift) * drift.normal();
    d_q_prev = device_copy(q_prev, "previous queries");
    a.queries = d_q_prev.device_data();
    a.score_range = d_prev_range.device_data();
    scan.run(a, c.max_budget(), stream.native(), chunk_budgets);
    stream.synchronize();
    a.queries = d_q.device_data();
    a.score_range = nullptr;  // replays keep the same seeds
    a.seed_range = d_prev_range.device_data();
    a.seed_margin = c.seed_margin;
    std::vector<float> now(entries), prev(entries);
    copy_bytes(now.data(), d_now.device_data(), entries * 4, Backend::cuda);
    copy_bytes(prev.data(), d_prev_range.device_data(), entries * 4, Backend::cuda);
    for (std::int32_t st = 0; st < streams; ++st) {
      bool again = false;
      for (int h = 0; h < a.heads; ++h) {
        const std::size_t e = (static_cast<std::size_t>(st) * a.heads + h) * 2;
        again = again || kf::seed_score(prev[e], prev[e + 1], a.seed_margin) > now[e];
      }
      rescanned += again ? 1 : 0;
    }
    scan.run(a, c.max_budget(), stream.native(), chunk_budgets);
    stream.synchronize();
    if (selection() != unseeded) {
      state.SkipWithError("the seeded selection differs from the unseeded one");
      return;
    }
  }
  L2Flusher l2;
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, [&](cudaStream_t s) {
    if (c.plan == ScanCase::Plan::separate) kf::launch_depth_plan(planner, s);
    if (c.copy_only) {
      kf::launch_plane_stage(a, scan.workspace(), s);
    } else {
      scan.run(a, c.max_budget(), s, chunk_budgets);
    }
  });
  double copy_span = 0;  // seconds, summed over the calls
  const double per_call = time_calls(
      state, timer,
      [&](std::size_t) {
        l2.flush(stream);
        if (!clocked) return;
        HISPARSE_CUDA_CHECK(cudaMemsetAsync(d_clock.device_data(), 0xff, 8, stream.native()));
        HISPARSE_CUDA_CHECK(cudaMemsetAsync(d_clock.device_data() + 1, 0, 8, stream.native()));
      },
      [&](std::size_t) { graph.launch(stream); },
      [&](std::size_t) {
        if (!clocked) return;
        unsigned long long clock[2] = {};
        copy_bytes(clock, d_clock.device_data(), sizeof(clock), Backend::cuda);
        if (clock[1] > clock[0]) copy_span += static_cast<double>(clock[1] - clock[0]) * 1e-9;
      });
  const double bytes = plane_bytes + scale_bytes;
  const double gbps = bytes / per_call / 1e9;
  const double ceiling = host ? pcie_h2d_gbps() : hbm_copy_gbps();
  state.counters["us_per_call"] = per_call * 1e6;
  if (copy_span > 0 && state.iterations() > 0) {
    // The transfer alone: the step's bytes over the copy's own span, not over the whole step.
    const double span = copy_span / static_cast<double>(state.iterations());
    state.counters["copy_us"] = span * 1e6;
    state.counters["copy_ceiling_fraction"] = bytes / span / 1e9 / pcie_h2d_gbps();
  }
  state.counters["read_MB"] = bytes / 1e6;
  state.counters["GBps"] = gbps;
  state.counters["ceiling_fraction"] = gbps / ceiling;
  state.counters["Gtokens_per_s"] =
      static_cast<double>(streams) * static_cast<double>(c.context) / per_call / 1e9;
  const auto& ws = scan.workspace();
  const auto& v = kf::kScanVariants[ws.variant];
  const int resident = kf::plane_scan_resident_blocks(a, ws);
  const auto smem = kf::plan_scan_shared(a, ws).total;
  state.counters["variant"] = ws.variant;
  state.counters["chunks"] = ws.chunks;  // chunk slots per stream (the heaviest stream's)
  state.counters["chunk_period"] = ws.chunk_period;
  state.counters["resident_warps_per_sm"] = resident * v.threads / 32;
  const std::string source =
      !host ? "HBM planes"
      : ws.staging.enabled()
          ? fmt::format("host planes staged by {} copy blocks in {} rounds, {} per copy",
                        ws.staging.copy_blocks, ws.staging.rounds, ws.staging.rounds_per_copy)
          : std::string("host planes read in place");
  state.counters["staged"] = ws.staging.enabled() ? 1 : 0;
  if (c.seed_drift >= 0) state.counters["rescanned_streams"] = rescanned;
  state.SetLabel(fmt::format(
      "variant {}: {} streams, {} chunks x {}-block tiles, {} threads x {} blocks/SM resident "
      "({} KB shared each), {}, ceiling {:.0f} GB/s ({}){}{}",
      ws.variant, streams, ws.chunks, ws.tile_blocks, v.threads, resident, smem / 1024, source,
      ceiling, host ? "PCIe H2D" : "HBM copy",
      flat ? ", flat depths (diagnostic: the first budget channels at depth 1)" : "",
      c.seed_drift >= 0
          ? fmt::format(", seeded by the previous step (query drift {}, margin {}, {} of {} "
                        "streams rescanned)",
                        c.seed_drift, a.seed_margin, rescanned, streams)
          : std::string()));
}

void run_plan(benchmark::State& state, int batch, bool measured) {
  const std::int32_t streams = batch * kKvHeads;
  std::vector<float> q, var, distortion, gain;
  random_plan_inputs(streams, q, var);
  random_read_tables(distortion, gain);
  auto d_q = device_copy(q, "queries");
  auto d_var = device_copy(var, "variances");
  auto d_distortion = device_copy(distortion, "read errors");
  auto d_gain = device_copy(gain, "read gains");
  auto d_gained = Buffer<float>::device(q.size(), Backend::cuda, "gained queries");
  auto d_depths = Buffer<std::uint8_t>::device(static_cast<std::size_t>(streams) * kHeadDim,
                                               Backend::cuda, "depths");
  kf::DepthPlanArgs p;
  p.queries = d_q.device_data();
  p.variances = d_var.device_data();
  p.variance_period = kKvHeads;
  p.streams = streams;
  p.heads = kGroupHeads;
  p.channels = kHeadDim;
  p.budget = 48;
  p.depths = d_depths.device_data();
  kf::MeasuredPlanArgs m;
  m.queries = d_q.device_data();
  m.distortion = d_distortion.device_data();
  m.gain = d_gain.device_data();
  m.period = kKvHeads;
  m.streams = streams;
  m.heads = kGroupHeads;
  m.channels = kHeadDim;
  m.budget = 48;
  m.depths = d_depths.device_data();
  m.gained_queries = d_gained.device_data();
  const auto launch = [&](cudaStream_t s) {
    if (measured)
      kf::launch_depth_plan_measured(m, s);
    else
      kf::launch_depth_plan(p, s);
  };
  Stream stream(Backend::cuda);
  GpuTimer timer(stream);
  constexpr int kBackToBack = 100;
  const CapturedGraph one(stream, launch);
  const CapturedGraph many(stream, [&](cudaStream_t s) {
    for (int i = 0; i < kBackToBack; ++i) launch(s);
  });
  many.launch(stream);
  stream.synchronize();
  const double per_call = time_calls(
      state, timer, [](std::size_t) {}, [&](std::size_t) { one.launch(stream); });
  timer.start();
  many.launch(stream);
  const double batched = timer.stop_seconds() / kBackToBack;
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["us_per_launch_back_to_back"] = batched * 1e6;
  state.counters["streams"] = streams;
}

void run_quantize(benchmark::State& state, std::int64_t tokens, int streams) {
  std::vector<std::uint16_t> keys(static_cast<std::size_t>(tokens) * streams * kHeadDim);
  for (std::size_t i = 0; i < keys.size(); ++i)
    keys[i] = float_to_bf16(random_normal(11, i) * (1.0f + static_cast<float>(i % 7)));
  auto d_keys = device_copy(keys, "keys");
  kf::PlaneLayout layout;
  layout.kind = kf::PlaneLayoutKind::hbm;
  layout.channels = kHeadDim;
  const std::int64_t blocks = (tokens + kf::kBlockTokens - 1) / kf::kBlockTokens;
  layout.capacity_blocks =
      (blocks + kf::kSuperblockBlocks - 1) / kf::kSuperblockBlocks * kf::kSuperblockBlocks;
  auto d_words = Buffer<std::uint64_t>::device(
      static_cast<std::size_t>(layout.words_per_stream()) * streams, Backend::cuda, "planes");
  auto d_scales = Buffer<std::uint16_t>::device(
      static_cast<std::size_t>(layout.scales_per_stream()) * streams, Backend::cuda, "scales");
  kf::QuantizePackArgs a;
  a.keys = d_keys.device_data();
  a.token_stride = kHeadDim;
  a.stream_stride = tokens * kHeadDim;
  a.streams = streams;
  a.tokens = tokens;
  a.layout = layout;
  a.words = d_words.device_data();
  a.scales = d_scales.device_data();
  Stream stream(Backend::cuda);
  L2Flusher l2;
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, [&](cudaStream_t s) { kf::launch_quantize_pack(a, s); });
  graph.launch(stream);
  stream.synchronize();
  const double per_call = time_calls(
      state, timer, [&](std::size_t) { l2.flush(stream); },
      [&](std::size_t) { graph.launch(stream); });
  const double bytes = static_cast<double>(keys.size()) * 2.0 +
                       static_cast<double>(blocks) * streams * kHeadDim * (4 * 8 + 2);
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["GBps"] = bytes / per_call / 1e9;
  state.counters["hbm_fraction"] = bytes / per_call / 1e9 / hbm_copy_gbps();
}
#endif

void bench_scan(benchmark::State& state, [[maybe_unused]] ScanCase c) {
  guarded(state, "fathom_scan", [&] { HISPARSE_GPU_ONLY(run_scan(state, c)); });
}
void bench_plan(benchmark::State& state, [[maybe_unused]] int batch,
                [[maybe_unused]] bool measured) {
  guarded(state, measured ? "fathom_plan_measured" : "fathom_plan",
          [&] { HISPARSE_GPU_ONLY(run_plan(state, batch, measured)); });
}
void bench_quantize(benchmark::State& state, [[maybe_unused]] std::int64_t tokens,
                    [[maybe_unused]] int streams) {
  guarded(state, "fathom_quantize",
          [&] { HISPARSE_GPU_ONLY(run_quantize(state, tokens, streams)); });
}

void register_scan(const std::string& name, const ScanCase& c) {
  register_timed(name, bench_scan, c);
}
const char* kind_name(kf::PlaneLayoutKind kind) {
  return kind == kf::PlaneLayoutKind::hbm ? "hbm" : "host";
}

bool register_fathom() {
  for (auto kind : {kf::PlaneLayoutKind::hbm, kf::PlaneLayoutKind::host})
    for (std::int64_t context : {32768, 131072, 1048576})
      for (int batch : {1, 8, 32})
        for (int budget : {40, 48, 64, 80, 128})
          register_scan(fmt::format("fathom_scan/{}/budget:{}/context:{}/batch:{}", kind_name(kind),
                                    budget, context, batch),
                        ScanCase{kind, budget, context, batch, 0});
  // Seeded selection (PlaneScanArgs::seed_range) from a previous step whose query drifted.
  for (double margin : {0.25, 0.5, 1.0})
    for (double drift : {0.0, 0.05, 0.2})
      for (int budget : {48, 128})
        for (auto [context, batch] :
             {std::pair<std::int64_t, int>{32768, 8}, {131072, 8}, {1048576, 8}, {1048576, 32}}) {
          ScanCase c{kf::PlaneLayoutKind::hbm, budget, context, batch};
          c.seed_drift = drift;
          c.seed_margin = static_cast<float>(margin);
          register_scan(
              fmt::format("fathom_scan_seeded/drift:{}/margin:{}/hbm/budget:{}/context:{}/batch:{}",
                          drift, margin, budget, context, batch),
              c);
        }
  // Kernel variants (residency) on the issue-4 shapes: 128K x batch 8 and 1M x batch 32 in HBM,
  // 1M x batch 1 from host memory, budget 48.
  for (int variant = 0; variant < kf::kScanVariantCount; ++variant)
    for (const ScanCase& c : {ScanCase{kf::PlaneLayoutKind::hbm, 48, 131072, 8, variant},
                              ScanCase{kf::PlaneLayoutKind::hbm, 48, 1048576, 32, variant},
                              ScanCase{kf::PlaneLayoutKind::host, 48, 1048576, 1, variant}})
      register_scan(fmt::format("fathom_scan_variant/variant:{}/{}/budget:{}/context:{}/batch:{}",
                                variant, kind_name(c.kind), c.budget, c.context, c.batch),
                    c);
  // Host planes staged into HBM beside the scan (the default) against the scan reading mapped
  // host memory itself.
  for (bool staged : {true, false})
    for (int budget : {48, 128})
      for (auto [context, batch] : {std::pair<std::int64_t, int>{1048576, 1}, {131072, 8}}) {
        ScanCase c{kf::PlaneLayoutKind::host, budget, context, batch};
        c.staged = staged;
        register_scan(fmt::format("fathom_scan_host/{}/budget:{}/context:{}/batch:{}",
                                  staged ? "staged" : "direct", budget, context, batch),
                      c);
      }
  // Tuning of the staging copy (plane_scan_config.hpp kStage*): copy blocks x rounds per copy.
  auto stage_tune = [&](int budget, std::int64_t context, int batch, int blocks, int rounds) {
    ScanCase c{kf::PlaneLayoutKind::host, budget, context, batch};
    c.copy_blocks = blocks;
    c.rounds_per_copy = rounds;
    register_scan(fmt::format("fathom_scan_stage_tune/copy_blocks:{}/rounds_per_copy:{}/host/"
                              "budget:{}/context:{}/batch:{}",
                              blocks, rounds, budget, context, batch),
                  c);
  };
  for (auto [context, batch] : {std::pair<std::int64_t, int>{1048576, 1}, {131072, 8}})
    for (int blocks : {8, 16, 32, 64, 128})
      for (int rounds : {1, 2, 4, 16}) stage_tune(48, context, batch, blocks, rounds);
  for (int rounds : {1, 2, 3, 4, 8}) stage_tune(48, 1048576, 8, 64, rounds);
  // Batch 32 (256 streams): rounds of 2 tiles per stream make 256-byte runs per (channel,
  // plane), many more than the host-page translations kept from round to round
  // (stage_rounds_per_copy).
  for (int budget : {48, 128})
    for (std::int64_t context : {std::int64_t{131072}, std::int64_t{1048576}})
      for (int blocks : {8, 64})
        for (int rounds : {1, 4, 16, 32}) stage_tune(budget, context, 32, blocks, rounds);
  // The copy alone (no scan beside it): what SM loads of host memory reach on the same runs.
  for (auto [context, batch] : {std::pair<std::int64_t, int>{1048576, 1}, {131072, 8}})
    for (int blocks : {16, 32, 64})
      for (int rounds : {1, 4}) {
        ScanCase c{kf::PlaneLayoutKind::host, 48, context, batch};
        c.copy_blocks = blocks;
        c.rounds_per_copy = rounds;
        c.copy_only = true;
        register_scan(fmt::format("fathom_scan_stage_copy/copy_blocks:{}/rounds_per_copy:{}/host/"
                                  "budget:48/context:{}/batch:{}",
                                  blocks, rounds, context, batch),
                      c);
      }
  // A budget per KV head (fathom.head_budgets): mean 48, heads at 48 +- spread, planned in the
  // scan; the tiles are sized for the largest, which is what the spread can cost.
  // chunks:work sizes each stream's chunks by its budget, chunks:uniform gives every stream the
  // same number (what the scan did before work-sized chunks; the same selection).
  for (int spread : {0, 16, 32})
    for (const ScanCase& shape : {ScanCase{kf::PlaneLayoutKind::hbm, 48, 131072, 8},
                                  ScanCase{kf::PlaneLayoutKind::hbm, 48, 1048576, 32},
                                  ScanCase{kf::PlaneLayoutKind::host, 48, 131072, 8},
                                  ScanCase{kf::PlaneLayoutKind::host, 48, 1048576, 1}})
      for (bool work : {true, false}) {
        if (!work && spread == 0) continue;  // equal budgets: one plan
        ScanCase c = shape;
        c.plan = ScanCase::Plan::fused;
        c.head_spread = spread;
        c.work_chunks = work;
        register_scan(
            fmt::format("fathom_scan_head_budgets/spread:{}/chunks:{}/{}/budget:48/"
                        "context:{}/batch:{}",
                        spread, work ? "work" : "uniform", kind_name(c.kind), c.context, c.batch),
            c);
      }
  // What the planner adds to a decode step's scan: given depths (no planner), the planner kernel
  // then the scan, and the plan fused into the scan; 1K tokens make the scan itself short.
  for (std::int64_t context : {1024, 131072})
    for (auto plan : {ScanCase::Plan::given, ScanCase::Plan::separate, ScanCase::Plan::fused}) {
      ScanCase c{kf::PlaneLayoutKind::hbm, 48, context, 8};
      c.plan = plan;
      const char* name = plan == ScanCase::Plan::given      ? "given"
                         : plan == ScanCase::Plan::separate ? "separate"
                                                            : "fused";
      register_scan(
          fmt::format("fathom_scan_plan/{}/hbm/budget:48/context:{}/batch:8", name, context), c);
    }
  for (int batch : {1, 8, 32}) {
    register_timed(fmt::format("fathom_plan/batch:{}", batch), bench_plan, batch, false);
    register_timed(fmt::format("fathom_plan_measured/batch:{}", batch), bench_plan, batch, true);
  }
  for (auto [tokens, streams] : {std::pair<std::int64_t, int>{65536, 8}, {64, 64}, {64, 256}})
    register_timed(fmt::format("fathom_quantize/tokens:{}/streams:{}", tokens, streams),
                   bench_quantize, tokens, streams);
  return true;
}

[[maybe_unused]] const bool registered = register_fathom();

}  // namespace
}  // namespace hisparse::microbench
