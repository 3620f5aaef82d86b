#include "fathom/depth_planner.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

std::string MethodSpec::name() const {
  const char* basis = klt ? "klt-" : "";
  switch (method) {
    case ScanMethod::fathom:
      return fmt::format("fathom-{}{}", basis, budget);
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

double plan_bits(std::span<const std::uint8_t> depths) {
  double bits = 0;
  for (auto t : depths) bits += t > 0 ? t + 0.25 : 0.0;
  return bits;
}

int active_channels(std::span<const std::uint8_t> depths) {
  return static_cast<int>(
      std::count_if(depths.begin(), depths.end(), [](auto t) { return t > 0; }));
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

std::vector<std::uint8_t> method_depths(const MethodSpec& method, const float* queries, int heads,
                                        int channels, std::span<const float> variance,
                                        std::span<const int> fixed_set) {
  std::vector<std::uint8_t> depths(static_cast<std::size_t>(channels), 0);
  switch (method.method) {
    case ScanMethod::fathom: {
      check_budget(method.budget, channels, "fathom method: budget");
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
