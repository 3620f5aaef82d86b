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

namespace {
/// Plane bits plus the scale's 0.25 bit when the read needs the block scales.
double read_bits(std::uint8_t depth) {
  return kf::read_planes(depth) + (kf::reads_scale(depth) ? 0.25 : 0.0);
}
}  // namespace

double plan_bits(std::span<const std::uint8_t> depths) {
  double bits = 0;
  for (auto t : depths) bits += read_bits(t);
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

void DepthPlanner::plan(const kf::DepthPlanArgs& args, NativeStream stream) const {
  HISPARSE_RANGE("fathom_plan", Phase::plan);
  check_budget(args.budget, args.channels, "fathom planner: budget_bits");
  if (args.heads < 1 || args.heads > kf::kMaxGroupHeads)
    throw Error("fathom planner: heads", fmt::format("{} query heads per KV head", args.heads),
                fmt::format("use 1..{}", kf::kMaxGroupHeads));
  if (args.channels < 1 || args.channels > kf::kMaxChannels)
    throw Error("fathom planner: head_dim", fmt::format("head_dim {}", args.channels),
                fmt::format("use 1..{}", kf::kMaxChannels));
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
    for (int t = 0; t < kDepths; ++t) {
      const std::size_t at = static_cast<std::size_t>(j) * kDepths + t;
      // Read 0 is the sign read's slot in the sums; depth 0 itself reads nothing (gain 1).
      float& gain = t == 0 ? out.sign_gain[static_cast<std::size_t>(j)] : out.gain[at];
      float& distortion =
          t == 0 ? out.sign_distortion[static_cast<std::size_t>(j)] : out.distortion[at];
      out.distortion[at] = static_cast<float>(var_k);
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

void depth_plan_measured(const float* queries, int heads, int channels,
                         const PlaneReadCalibration& reads, int budget, std::uint8_t* depths) {
  constexpr int kDepths = kf::kPlanes + 1;
  if (reads.distortion.size() != static_cast<std::size_t>(channels) * kDepths ||
      reads.sign_distortion.size() != static_cast<std::size_t>(channels))
    throw Error("fathom planner (measured rule): plane read calibration",
                fmt::format("{} values for head_dim {}", reads.distortion.size(), channels),
                "calibrate with calibrate_plane_reads() on keys of this head_dim");
  std::vector<double> weight(static_cast<std::size_t>(channels), 0.0);
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < channels; ++j) {
      const double q = queries[static_cast<std::size_t>(h) * channels + j];
      weight[j] += q * q;
    }
  std::fill(depths, depths + channels, std::uint8_t{0});
  // The reads a channel can move to, cheapest first: a sign read (1 bit), then depths 1..4 with
  // the scale (t + 0.25 bits). Each round takes the move (one channel, from its read to a
  // costlier one) that removes the most weighted error variance per bit; a move of several planes
  // is the lower convex hull, so a channel whose first plane alone gains little is still reached.
  // Only planes count against the budget (a sign read to depth 1 adds none). Ties: lower
  // channel, cheaper read.
  constexpr std::uint8_t kReads[] = {kf::kSignRead, 1, 2, 3, 4};
  for (int left = budget; left > 0;) {
    double best = 0;
    int best_j = -1;
    std::uint8_t best_to = 0;
    for (int j = 0; j < channels; ++j) {
      const std::uint8_t from = depths[j];
      const double e_from = reads.distortion_of(j, from);
      for (const std::uint8_t to : kReads) {
        const int planes = kf::read_planes(to) - kf::read_planes(from);
        const double bits = read_bits(to) - read_bits(from);
        if (bits <= 0 || planes < 0 || planes > left) continue;
        const double rate = weight[j] * (e_from - reads.distortion_of(j, to)) / bits;
        if (rate > best) best = rate, best_j = j, best_to = to;
      }
    }
    if (best_j < 0) break;  // nothing left that lowers the error
    left -= kf::read_planes(best_to) - kf::read_planes(depths[best_j]);
    depths[best_j] = best_to;
  }
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
