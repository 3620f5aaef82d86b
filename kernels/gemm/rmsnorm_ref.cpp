#include "kernels/gemm/rmsnorm.hpp"

#include <cmath>
#include <cstddef>

namespace hisparse::kernels {

void rmsnorm_ref(const RmsNormArgs& a) {
  const int ldx = a.ldx ? a.ldx : a.n;
  const int ldy = a.ldy ? a.ldy : a.n;
  for (int r = 0; r < a.rows; ++r) {
    const float* x = a.x + static_cast<std::ptrdiff_t>(r) * ldx;
    float* y = a.y + static_cast<std::ptrdiff_t>(r) * ldy;
    float sum_sq = 0.0f;
    for (int i = 0; i < a.n; ++i) sum_sq += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(a.n) + a.eps);
    for (int i = 0; i < a.n; ++i) y[i] = x[i] * inv * (a.weight ? a.weight[i] : 1.0f);
  }
}

}  // namespace hisparse::kernels
