#include "fathom/depth_planner.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "fathom/synthetic_keys.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

std::string MethodSpec::name() const {
  const char* basis = klt ? "klt-" : "";
  switch (method) {
    case ScanMethod::fathom:
      return fmt::format("fathom-{}{}{}", rule == PlanRule::measured ? "m-" : "", basis, budget);
    case ScanMethod::full_scan:
      return fmt::format("full-{}4bit", basis);
    case ScanMethod::fixed_channels:
      return fmt::format("fixed-{}{}ch", basis, channels);
    case ScanMethod::sparq:
      return fmt::format("sparq-{}{}", basis, channels);
    case ScanMethod::oracle:
      return "oracle";
  }
  return "unknown";
}

const char* plan_rule_name(PlanRule rule) noexcept {
  return rule == PlanRule::measured ? "measured" : "paper";
}

double plan_bits(std::span<const std::uint8_t> depths) {
  double bits = 0;
  for (auto t : depths) bits += kf::read_bits(t);
  return bits;
}

int active_channels(std::span<const std::uint8_t> depths) {
  return static_cast<int>(
      std::count_if(depths.begin(), depths.end(), [](auto t) { return kf::read_planes(t) > 0; }));
}

float PlaneReadCalibration::gain_of(int j, std::uint8_t depth) const {
  if (depth == kf::kSignRead) return sign_gain[static_cast<std::size_t>(j)];
  return gain[static_cast<std::size_t>(j) * (kf::kPlanes + 1) + kf::read_planes(depth)];
}

float PlaneReadCalibration::distortion_of(int j, std::uint8_t depth) const {
  if (depth == kf::kSignRead) return sign_distortion[static_cast<std::size_t>(j)];
  return distortion[static_cast<std::size_t>(j) * (kf::kPlanes + 1) + kf::read_planes(depth)];
}

void check_budget(int budget, int channels, const std::string& where) {
  if (budget < 0 || budget > kf::kPlanes * channels)
    throw Error(where,
                fmt::format("budget {} plane bits is outside 0..{} for head_dim {}", budget,
                            kf::kPlanes * channels, channels),
                "use a budget such as 40, 48, 64, 80 or 128");
}

std::vector<std::int32_t> head_budgets(std::span<const int> table, int kv_heads, int layer,
                                       int budget, int max_budget, const std::string& where) {
  if (kv_heads < 1 || table.empty() || table.size() % static_cast<std::size_t>(kv_heads) != 0)
    throw Error(
        where,
        fmt::format("{} per-head budgets for a model with {} KV heads", table.size(), kv_heads),
        fmt::format("give {} budgets per layer (one per KV head), layer by layer", kv_heads));
  double mean = 0;
  for (const int t : table) mean += t;
  mean /= static_cast<double>(table.size());
  if (mean <= 0)
    throw Error(where, "every per-head budget is 0, so the table says nothing about a split",
                "give the heads' calibrated budgets (positive numbers)");
  const std::size_t rows = table.size() / static_cast<std::size_t>(kv_heads);
  const std::size_t row = static_cast<std::size_t>(layer) % rows;
  std::vector<std::int32_t> out(static_cast<std::size_t>(kv_heads));
  for (std::size_t g = 0; g < out.size(); ++g) {
    const double b = std::round(budget * (table[row * out.size() + g] / mean));
    out[g] = static_cast<std::int32_t>(std::clamp(b, 0.0, static_cast<double>(max_budget)));
  }
  return out;
}

namespace {
void check_plan_shape(int budget, int heads, int channels) {
  check_budget(budget, channels, "fathom planner: budget_bits");
  if (heads < 1 || heads > kf::kMaxGroupHeads)
    throw Error("fathom planner: heads", fmt::format("{} query heads per KV head", heads),
                fmt::format("use 1..{}", kf::kMaxGroupHeads));
  if (channels < 1 || channels > kf::kMaxChannels)
    throw Error("fathom planner: head_dim", fmt::format("head_dim {}", channels),
                fmt::format("use 1..{}", kf::kMaxChannels));
}
}  // namespace

void DepthPlanner::plan_measured(const kf::MeasuredPlanArgs& args, NativeStream stream) const {
  HISPARSE_RANGE("fathom_plan_measured", Phase::plan);
  check_plan_shape(args.budget, args.heads, args.channels);
  if (backend_ == Backend::cpu) {
    kf::depth_plan_measured_ref(args);
    return;
  }
#if HISPARSE_WITH_CUDA
  kf::launch_depth_plan_measured(args, stream);
#else
  (void)stream;
#endif
}

void DepthPlanner::plan(const kf::DepthPlanArgs& args, NativeStream stream) const {
  HISPARSE_RANGE("fathom_plan", Phase::plan);
  check_plan_shape(args.budget, args.heads, args.channels);
  if (backend_ == Backend::cpu) {
    kf::depth_plan_greedy_ref(args);
    return;
  }
#if HISPARSE_WITH_CUDA
  kf::launch_depth_plan(args, stream);
#else
  (void)stream;
#endif
}

std::vector<int> calibrate_fixed_channels(std::span<const float> variance,
                                          std::span<const float> calibration_queries, int channels,
                                          int count) {
  const std::size_t rows = calibration_queries.size() / static_cast<std::size_t>(channels);
  std::vector<double> score(static_cast<std::size_t>(channels), 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (int j = 0; j < channels; ++j) {
      const double q = calibration_queries[r * channels + j];
      score[j] += q * q;
    }
  for (int j = 0; j < channels; ++j) score[j] *= variance[j];
  std::vector<int> order(static_cast<std::size_t>(channels));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  order.resize(static_cast<std::size_t>(std::min(count, channels)));
  std::sort(order.begin(), order.end());
  return order;
}

PlaneReadCalibration calibrate_plane_reads(const std::uint16_t* keys, std::int64_t tokens,
                                           int channels, int skip, int count) {
  constexpr int kDepths = kf::kPlanes + 1;
  PlaneReadCalibration out;
  out.gain.assign(static_cast<std::size_t>(channels) * kDepths, 1.0f);
  out.distortion.assign(out.gain.size(), 0.0f);
  out.sign_gain.assign(static_cast<std::size_t>(channels), 0.0f);
  out.sign_distortion.assign(static_cast<std::size_t>(channels), 0.0f);
  const std::int64_t begin = std::clamp<std::int64_t>(skip, 0, tokens);
  std::int64_t first = (begin + kf::kBlockTokens - 1) / kf::kBlockTokens;
  std::int64_t last = std::min<std::int64_t>(tokens, begin + std::max(count, 0)) / kf::kBlockTokens;
  if (last <= first) first = 0, last = tokens / kf::kBlockTokens;  // too short to skip
  if (last <= first) {
    // Not one whole block: the paper's model, Var(k) 4^-t over the tokens there are, gains 1.
    const auto var = calibration_variance(keys, tokens, channels, 0, static_cast<int>(tokens));
    for (int j = 0; j < channels; ++j) {
      for (int t = 0; t < kDepths; ++t)
        out.distortion[static_cast<std::size_t>(j) * kDepths + t] =
            var[static_cast<std::size_t>(j)] * std::ldexp(1.0f, -2 * t);
      out.sign_distortion[static_cast<std::size_t>(j)] = var[static_cast<std::size_t>(j)];
    }
    return out;  // (a sign read removes nothing there: never planned)
  }
  const double n = static_cast<double>((last - first) * kf::kBlockTokens);
  for (int j = 0; j < channels; ++j) {
    // Sums of k, k k, and per read of r, k r and r r: reads 1..kPlanes are the depths, read 0
    // the sign read (the top plane's midpoint without the scale, +-1/2).
    double sk = 0, skk = 0, sr[kDepths] = {}, skr[kDepths] = {}, srr[kDepths] = {};
    for (std::int64_t b = first; b < last; ++b) {
      const std::uint16_t* block = keys + b * kf::kBlockTokens * channels + j;
      float absmax = 0.0f;
      for (int i = 0; i < kf::kBlockTokens; ++i)
        absmax = std::max(absmax, std::abs(bf16_to_float(block[i * channels])));
      const float scale = f16_to_float(kf::block_scale_f16(absmax));
      for (int i = 0; i < kf::kBlockTokens; ++i) {
        const float k = bf16_to_float(block[i * channels]);
        const std::uint32_t code = kf::quantize_code(k, scale);
        sk += k;
        skk += static_cast<double>(k) * k;
        for (int t = 0; t < kDepths; ++t) {
          const double r = t == 0 ? kf::partial_multiplier(code >> (kf::kPlanes - 1), 1)
                                  : kf::partial_value(code, t, scale);
          sr[t] += r;
          skr[t] += k * r;
          srr[t] += r * r;
        }
      }
    }
    const double mean_k = sk / n;
    const double var_k = std::max(0.0, skk / n - mean_k * mean_k);
    // Depth 0 reads nothing: its error is Var(k), its gain 1.
    out.distortion[static_cast<std::size_t>(j) * kDepths] = static_cast<float>(var_k);
    for (int t = 0; t < kDepths; ++t) {
      const std::size_t at = static_cast<std::size_t>(j) * kDepths + t;
      // Read 0 in the sums is the sign read.
      float& gain = t == 0 ? out.sign_gain[static_cast<std::size_t>(j)] : out.gain[at];
      float& distortion =
          t == 0 ? out.sign_distortion[static_cast<std::size_t>(j)] : out.distortion[at];
      const double cov = skr[t] / n - mean_k * (sr[t] / n);
      const double var_r = srr[t] / n - (sr[t] / n) * (sr[t] / n);
      distortion = static_cast<float>(var_k);
      if (var_r > 1e-9 * (srr[t] / n)) {  // r varies (not only by rounding of the sums)
        gain = static_cast<float>(cov / var_r);
        distortion = static_cast<float>(std::max(0.0, var_k - cov * cov / var_r));
      }
    }
  }
  return out;
}

void pack_read_tables(std::span<const PlaneReadCalibration> reads, int channels,
                      std::vector<float>& distortion, std::vector<float>& gain) {
  constexpr int kDepths = kf::kPlanes + 1;
  const auto row = static_cast<std::size_t>(channels) * kf::kReadColumns;
  distortion.assign(reads.size() * row, 0.0f);
  gain.assign(distortion.size(), 1.0f);
  for (std::size_t r = 0; r < reads.size(); ++r) {
    const PlaneReadCalibration& c = reads[r];
    if (c.distortion.size() != static_cast<std::size_t>(channels) * kDepths ||
        c.gain.size() != c.distortion.size() ||
        c.sign_distortion.size() != static_cast<std::size_t>(channels) ||
        c.sign_gain.size() != c.sign_distortion.size())
      throw Error("fathom planner (measured rule): plane read calibration",
                  fmt::format("{} values for head_dim {}", c.distortion.size(), channels),
                  "calibrate with calibrate_plane_reads() on keys of this head_dim");
    for (int j = 0; j < channels; ++j)
      for (int col = 0; col < kf::kReadColumns; ++col) {
        const auto depth = col <= kf::kPlanes ? static_cast<std::uint8_t>(col) : kf::kSignRead;
        const std::size_t at = r * row + static_cast<std::size_t>(j) * kf::kReadColumns + col;
        distortion[at] = c.distortion_of(j, depth);
        gain[at] = c.gain_of(j, depth);
      }
  }
}

namespace {
Buffer<float> device_copy(const std::vector<float>& host, Backend backend, const char* label) {
  auto b = Buffer<float>::device(host.size(), backend, label);
  copy_bytes(b.device_data(), host.data(), b.bytes(), backend);
  return b;
}
}  // namespace

ReadTables::ReadTables(Backend backend, std::span<const PlaneReadCalibration> reads, int channels)
    : backend_(backend), period_(static_cast<std::int32_t>(reads.size())), channels_(channels) {
  std::vector<float> distortion, gain;
  pack_read_tables(reads, channels, distortion, gain);
  distortion_ = device_copy(distortion, backend, "fathom read errors");
  gain_ = device_copy(gain, backend, "fathom read gains");
}

void depth_plan_measured(const float* queries, int heads, int channels,
                         const PlaneReadCalibration& reads, int budget, std::uint8_t* depths) {
  std::vector<float> distortion, gain;
  pack_read_tables(std::span<const PlaneReadCalibration>(&reads, 1), channels, distortion, gain);
  kf::MeasuredPlanArgs a;
  a.queries = queries;
  a.distortion = distortion.data();
  a.gain = gain.data();
  a.streams = 1;
  a.heads = heads;
  a.channels = channels;
  a.budget = budget;
  a.depths = depths;
  kf::depth_plan_measured_ref(a);
}

void apply_read_gains(float* queries, int heads, int channels, const PlaneReadCalibration& reads,
                      std::span<const std::uint8_t> depths) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < channels; ++j)
      queries[static_cast<std::size_t>(h) * channels + j] *= reads.gain_of(j, depths[j]);
}

std::vector<std::uint8_t> method_depths(const MethodSpec& method, const float* queries, int heads,
                                        int channels, std::span<const float> variance,
                                        std::span<const int> fixed_set,
                                        const PlaneReadCalibration* reads) {
  std::vector<std::uint8_t> depths(static_cast<std::size_t>(channels), 0);
  switch (method.method) {
    case ScanMethod::fathom: {
      check_budget(method.budget, channels, "fathom method: budget");
      if (method.rule == PlanRule::measured) {
        if (!reads)
          throw Error("fathom method: " + method.name(), "the measured rule needs calibration",
                      "pass calibrate_plane_reads() of the keys");
        depth_plan_measured(queries, heads, channels, *reads, method.budget, depths.data());
        break;
      }
      kf::DepthPlanArgs args;
      args.queries = queries;
      args.variances = variance.data();
      args.streams = 1;
      args.heads = heads;
      args.channels = channels;
      args.budget = method.budget;
      args.depths = depths.data();
      kf::depth_plan_greedy_ref(args);
      break;
    }
    case ScanMethod::full_scan:
      std::fill(depths.begin(), depths.end(), std::uint8_t{4});
      break;
    case ScanMethod::fixed_channels:
      for (int j : fixed_set) depths[static_cast<std::size_t>(j)] = 4;
      break;
    case ScanMethod::sparq: {
      std::vector<float> weight(static_cast<std::size_t>(channels), 0.0f);
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < channels; ++j) weight[j] += std::abs(queries[h * channels + j]);
      std::vector<int> order(static_cast<std::size_t>(channels));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return weight[a] > weight[b]; });
      for (int r = 0; r < std::min(method.channels, channels); ++r) depths[order[r]] = 4;
      break;
    }
    case ScanMethod::oracle:
      break;
  }
  return depths;
}

}  // namespace hisparse::fathom
