#include "fathom/selector.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

FathomSelector::FathomSelector(Backend backend, SelectorConfig config)
    : backend_(backend), config_(config), planner_(backend), scan_(backend), stream_(backend) {
  if (config_.sinks < 0 || config_.recent < 0 || config_.keep() < 1)
    throw Error("fathom selector: top_k",
                fmt::format("top_k {} leaves no room beyond {} sinks and {} recent tokens",
                            config_.top_k, config_.sinks, config_.recent),
                fmt::format("use top_k > {}", config_.sinks + config_.recent));
}

void FathomSelector::set_klt_bases(std::vector<KltBasis> bases) {
  if (!config_.klt)
    throw Error("fathom selector: klt", "KLT bases were given but the selector's klt option is off",
                "set SelectorConfig::klt = true");
  klt_bases_ = std::move(bases);
}

std::vector<std::vector<std::int32_t>> FathomSelector::select(
    const PlaneStore& store, const float* queries, int heads, const float* variances,
    int variance_period, const ReadTables* reads, std::span<const std::int32_t> budgets) {
  HISPARSE_FUNC_RANGE();
  if (store.backend() != backend_)
    throw Error("fathom selector", "the plane store lives on another backend", "use one backend");
  const int d = store.channels();
  const std::int32_t streams = store.streams();
  const auto q_count = static_cast<std::size_t>(streams) * heads * d;
  // KLT: queries and variances in each stream's eigenbasis (host work: heads x d^2 per stream).
  if (config_.klt) {
    if (klt_bases_.empty())
      throw Error("fathom selector: klt", "KLT is on but no basis was given",
                  "call set_klt_bases() with bases calibrated on this layer's keys");
    const auto period = klt_bases_.size();
    for (const auto& b : klt_bases_)
      if (b.channels() != d)
        throw Error("fathom selector: klt",
                    fmt::format("a KLT basis has {} channels, the store {}", b.channels(), d),
                    "calibrate the bases on keys of this head_dim");
    rotated_.resize(q_count);
    const auto per_stream = static_cast<std::size_t>(heads) * d;
    for (std::size_t s = 0; s < static_cast<std::size_t>(streams); ++s)
      klt_bases_[s % period].rotate(queries + s * per_stream, rotated_.data() + s * per_stream,
                                    heads);
    eigen_variances_.clear();
    for (const auto& b : klt_bases_) {
      const auto v = b.variances();
      eigen_variances_.insert(eigen_variances_.end(), v.begin(), v.end());
    }
    queries = rotated_.data();
    variances = eigen_variances_.data();
    variance_period = static_cast<int>(period);
  }
  const auto depth_count = static_cast<std::size_t>(streams) * d;
  float* q_dev = queries_.reserve_device(q_count, backend_, "fathom queries");
  std::uint8_t* depths = depths_.reserve_device(depth_count, backend_, "fathom depths");
  // The queries the scan reads: the given ones (paper rule), or the measured planner's gained
  // queries, written on the backend beside the depths.
  const bool measured = config_.rule == PlanRule::measured;
  if (measured && (reads == nullptr || reads->period() < 1))
    throw Error("fathom selector: rule measured", "no read calibration was given",
                "pass ReadTables of calibrate_plane_reads() of each KV head's stored keys");
  if (measured && reads->channels() != d)
    throw Error("fathom selector: rule measured",
                fmt::format("read tables for head_dim {}, the store holds head_dim {}",
                            reads->channels(), d),
                "calibrate on keys of this head_dim");
  if (measured && reads->backend() != backend_)
    throw Error("fathom selector: rule measured", "the read tables live on another backend",
                "build the ReadTables on the selector's backend");
  copy_bytes(q_dev, queries, q_count * sizeof(float), backend_);
  // Per-head budgets: one per row of the plan's period; the largest sizes the planner and scan.
  const int period = measured ? reads->period() : variance_period;
  int budget = config_.budget;
  const std::int32_t* budgets_dev = nullptr;
  if (!budgets.empty()) {
    if (budgets.size() != static_cast<std::size_t>(period))
      throw Error("fathom selector: budgets",
                  fmt::format("{} per-head budgets for a plan period of {} KV heads",
                              budgets.size(), period),
                  "give one budget per KV head (per variance row or read table)");
    for (const std::int32_t b : budgets) check_budget(b, d, "fathom selector: budgets");
    budget = *std::max_element(budgets.begin(), budgets.end());
    std::int32_t* dev = budgets_.reserve_device(budgets.size(), backend_, "fathom budgets");
    copy_bytes(dev, budgets.data(), budgets.size() * sizeof(std::int32_t), backend_);
    budgets_dev = dev;
  }
  if (measured) {
    check_budget(budget, d, "fathom selector: budget");
    kf::MeasuredPlanArgs plan;
    plan.queries = q_dev;
    plan.distortion = reads->distortion();
    plan.gain = reads->gain();
    plan.period = reads->period();
    plan.streams = streams;
    plan.heads = heads;
    plan.channels = d;
    plan.budget = budget;
    plan.budgets = budgets_dev;
    plan.depths = depths;
    plan.gained_queries = gained_.reserve_device(q_count, backend_, "fathom gained queries");
    planner_.plan_measured(plan, stream_.native());
  } else {
    const auto var_count = static_cast<std::size_t>(variance_period) * d;
    float* var_dev = variances_.reserve_device(var_count, backend_, "fathom variances");
    copy_bytes(var_dev, variances, var_count * sizeof(float), backend_);
    kf::DepthPlanArgs plan;
    plan.queries = q_dev;
    plan.variances = var_dev;
    plan.variance_period = variance_period;
    plan.streams = streams;
    plan.heads = heads;
    plan.channels = d;
    plan.budget = budget;
    plan.budgets = budgets_dev;
    plan.depths = depths;
    planner_.plan(plan, stream_.native());
  }

  kf::PlaneScanArgs args = PlaneScan::args_for(store);
  args.queries = measured ? gained_.device_data() : q_dev;
  args.depths = depths;
  args.heads = heads;
  args.keep = config_.keep();
  args.sinks = config_.sinks;
  args.recent = config_.recent;
  const auto max_sel = static_cast<std::size_t>(args.max_selected());
  const auto sel_count = max_sel * static_cast<std::size_t>(streams);
  args.selected = selected_.reserve_device(sel_count, backend_, "fathom selection");
  args.selected_count = counts_.reserve_device(static_cast<std::size_t>(streams), backend_,
                                               "fathom selection counts");
  if (config_.seeded) {
    // The previous call's ranges seed this one and are overwritten by it (the scan reads every
    // seed before it writes a range); a new shape starts from NaN: no seed.
    const auto entries = static_cast<std::size_t>(streams) * heads * 2;
    float* range = score_range_.reserve_device(entries, backend_, "fathom score ranges");
    if (entries != score_range_entries_) {
      const std::vector<float> none(entries, std::numeric_limits<float>::quiet_NaN());
      copy_bytes(range, none.data(), entries * sizeof(float), backend_);
      score_range_entries_ = entries;
    }
    args.seed_range = range;
    args.score_range = range;
    args.seed_margin = config_.seed_margin;
  }
  scan_.run(args, budget, stream_.native(), budgets);
  stream_.synchronize();

  selected_host_.resize(sel_count);
  counts_host_.resize(static_cast<std::size_t>(streams));
  copy_bytes(selected_host_.data(), args.selected, sel_count * sizeof(std::int32_t), backend_);
  copy_bytes(counts_host_.data(), args.selected_count, counts_host_.size() * sizeof(std::int32_t),
             backend_);
  depths_host_.resize(depth_count);
  copy_bytes(depths_host_.data(), depths, depth_count, backend_);
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(streams));
  for (std::int32_t s = 0; s < streams; ++s) {
    const auto first = selected_host_.begin() + static_cast<std::ptrdiff_t>(s * max_sel);
    out[s].assign(first, first + counts_host_[s]);
  }
  return out;
}

void exact_scores(const float* queries, int heads, const std::uint16_t* keys, std::int64_t n, int d,
                  float* out) {
  for (std::int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < d; ++j)
        acc = kf::fused_multiply_add(queries[h * d + j], bf16_to_float(keys[i * d + j]), acc);
      out[h * n + i] = acc;
    }
}

void attention_over(const float* queries, int heads, const std::uint16_t* keys,
                    const std::uint16_t* values, std::int64_t n, int d,
                    std::span<const std::int32_t> positions, float* out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> logits;
  std::vector<std::int64_t> rows;
  if (positions.empty()) {
    rows.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) rows[i] = i;
  } else {
    rows.assign(positions.begin(), positions.end());
  }
  logits.resize(rows.size());
  for (int h = 0; h < heads; ++h) {
    double mx = -1e300;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      double acc = 0;
      for (int j = 0; j < d; ++j)
        acc += queries[h * d + j] * static_cast<double>(bf16_to_float(keys[rows[r] * d + j]));
      logits[r] = acc * scale;
      mx = std::max(mx, logits[r]);
    }
    double denom = 0;
    for (auto& l : logits) denom += (l = std::exp(l - mx));
    for (int j = 0; j < d; ++j) {
      double acc = 0;
      for (std::size_t r = 0; r < rows.size(); ++r)
        acc += logits[r] * bf16_to_float(values[rows[r] * d + j]);
      out[h * d + j] = static_cast<float>(acc / denom);
    }
  }
}

}  // namespace hisparse::fathom
