#include "model/selection_quality.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/topk/topk.hpp"

namespace hisparse {

void top_k_positions(const float* scores, std::int64_t n, int k, std::int32_t* out) {
  kernels::TopkArgs a;
  a.scores = scores;
  a.lengths = &n;
  a.out = out;
  a.rows = 1;
  a.stride = n;
  a.k = k;
  kernels::topk_ref(a);
}

double selection_recall(const SelectionRecallArgs& a) {
  const std::int64_t n = std::min(a.seq_len, a.capacity);
  const int k = static_cast<int>(std::min<std::int64_t>(a.top_k, n));
  if (a.batch < 1 || a.q_heads < 1 || k < 1) return 0.0;
  const std::ptrdiff_t stride = a.k_row_stride ? a.k_row_stride : a.dim;
  const int group = a.q_heads / a.kv_heads;
  std::vector<float> scores(static_cast<std::size_t>(n));
  std::vector<std::int32_t> exact(static_cast<std::size_t>(k));
  std::vector<char> chosen(static_cast<std::size_t>(n));
  double sum = 0;
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.q_heads; ++h) {
      const int g = h / group;
      const float* q = a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.dim;
      const float* rows =
          a.k + (static_cast<std::ptrdiff_t>(b) * a.kv_heads + g) * a.capacity * stride;
      for (std::int64_t t = 0; t < n; ++t) {
        float dot = 0.0f;
        for (int c = 0; c < a.dim; ++c) dot += q[c] * rows[t * stride + c];
        scores[static_cast<std::size_t>(t)] = dot;
      }
      top_k_positions(scores.data(), n, k, exact.data());
      std::fill(chosen.begin(), chosen.end(), char{0});
      const int sel = a.groups == 1 ? 0 : g;
      const std::int32_t* s =
          a.selected + (static_cast<std::ptrdiff_t>(b) * a.groups + sel) * a.width;
      for (int i = 0; i < a.width; ++i)
        if (s[i] >= 0 && s[i] < n) chosen[static_cast<std::size_t>(s[i])] = 1;
      int kept = 0;
      for (std::int32_t t : exact) kept += t >= 0 && chosen[static_cast<std::size_t>(t)] ? 1 : 0;
      sum += static_cast<double>(kept) / k;
    }
  return sum / (static_cast<double>(a.batch) * a.q_heads);
}

}  // namespace hisparse
