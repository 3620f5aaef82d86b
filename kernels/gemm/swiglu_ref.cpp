#include "kernels/gemm/swiglu.hpp"

#include <cmath>
#include <cstddef>

namespace hisparse::kernels {

void swiglu_ref(const SwigluArgs& a) {
  for (int r = 0; r < a.rows; ++r) {
    const float* g = a.gate_up + static_cast<std::ptrdiff_t>(r) * 2 * a.width;
    const float* u = g + a.width;
    float* o = a.out + static_cast<std::ptrdiff_t>(r) * a.width;
    for (int i = 0; i < a.width; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace hisparse::kernels
