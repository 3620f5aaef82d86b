#include "kernels/topk/topk.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <vector>

namespace hisparse::kernels {

void topk_ref(const TopkArgs& a) {
  std::vector<std::int32_t> order;
  for (int r = 0; r < a.rows; ++r) {
    const float* s = a.scores + static_cast<std::ptrdiff_t>(r) * a.stride;
    std::int32_t* out = a.out + static_cast<std::ptrdiff_t>(r) * a.k;
    const auto n = static_cast<std::int32_t>(std::min(a.lengths[r], a.stride));
    order.resize(static_cast<std::size_t>(std::max(n, 0)));
    std::iota(order.begin(), order.end(), 0);
    // A strict total order (score descending, then position ascending): the result is unique.
    auto key = [s](std::int32_t i) {
      return std::isnan(s[i]) ? -std::numeric_limits<float>::infinity() : s[i];
    };
    auto better = [&](std::int32_t x, std::int32_t y) {
      const float kx = key(x), ky = key(y);
      if (kx != ky) return kx > ky;
      if (std::isnan(s[x]) != std::isnan(s[y])) return !std::isnan(s[x]);
      return x < y;
    };
    const auto take = std::min<std::size_t>(order.size(), static_cast<std::size_t>(a.k));
    if (take < order.size())
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take),
                       order.end(), better);
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take));
    for (std::size_t i = 0; i < take; ++i) out[i] = order[i];
    for (std::size_t i = take; i < static_cast<std::size_t>(a.k); ++i) out[i] = -1;
  }
}

}  // namespace hisparse::kernels
