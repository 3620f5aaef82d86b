#include "kernels/attention/rope.hpp"

#include <cmath>
#include <cstddef>

namespace hisparse::kernels {

void rope_ref(const RopeArgs& a) {
  const int half = a.dim / 2;
  const int row_stride = a.row_stride ? a.row_stride : a.heads * a.head_stride;
  for (int r = 0; r < a.rows; ++r) {
    const double pos = static_cast<double>(a.positions[r]);
    for (int i = 0; i < half; ++i) {
      const double inv_freq =
          std::pow(static_cast<double>(a.theta), -2.0 * i / static_cast<double>(a.dim));
      const double angle = pos * inv_freq;
      const auto c = static_cast<float>(std::cos(angle));
      const auto s = static_cast<float>(std::sin(angle));
      for (int h = 0; h < a.heads; ++h) {
        float* v = a.x + static_cast<std::ptrdiff_t>(r) * row_stride +
                   static_cast<std::ptrdiff_t>(h) * a.head_stride + a.offset;
        const float x0 = v[i];
        const float x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
      }
    }
  }
}

}  // namespace hisparse::kernels
