#include <algorithm>
#include <vector>

#include "kernels/fathom/depth_plan_measured.hpp"

namespace hisparse::kernels::fathom {

void depth_plan_measured_ref(const MeasuredPlanArgs& a) {
  const int d = a.channels;
  std::vector<float> weight(static_cast<std::size_t>(d));
  for (std::int32_t s = 0; s < a.streams; ++s) {
    const std::int64_t table = static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
    std::uint8_t* depths = a.depths + static_cast<std::int64_t>(s) * d;
    for (int j = 0; j < d; ++j) weight[static_cast<std::size_t>(j)] = measured_weight(a, s, j);
    std::fill(depths, depths + d, std::uint8_t{0});
    for (int left = a.budget_of(s); left > 0;) {
      float best = 0.0f;
      int best_j = -1;
      std::uint8_t best_to = 0;
      for (int j = 0; j < d; ++j)
        if (best_measured_move(weight[static_cast<std::size_t>(j)],
                               a.distortion + table + static_cast<std::int64_t>(j) * kReadColumns,
                               depths[j], left, best, best_to))
          best_j = j;
      if (best_j < 0) break;  // nothing left that lowers the error
      left -= read_planes(best_to) - read_planes(depths[best_j]);
      depths[best_j] = best_to;
    }
    if (a.gained_queries == nullptr) continue;
    for (int h = 0; h < a.heads; ++h)
      for (int j = 0; j < d; ++j) {
        const std::int64_t at = (static_cast<std::int64_t>(s) * a.heads + h) * d + j;
        a.gained_queries[at] =
            a.queries[at] *
            a.gain[table + static_cast<std::int64_t>(j) * kReadColumns + read_column(depths[j])];
      }
  }
}

}  // namespace hisparse::kernels::fathom
