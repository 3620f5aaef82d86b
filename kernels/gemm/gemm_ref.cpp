#include "kernels/gemm/gemm.hpp"

#include <algorithm>

#include "core/dtypes.hpp"

namespace hisparse::kernels {

void gemm_ref(const GemmArgs& a) {
  const int ldx = a.ldx ? a.ldx : a.k;
  const int ldw = a.ldw ? a.ldw : a.k;
  const int ldy = a.ldy ? a.ldy : a.n;
  // Blocks of weight rows stay in cache while every activation row passes over them. The sum of
  // each output is taken over k in order, so the result does not depend on the blocking.
  constexpr int kRowBlock = 64;
  for (int n0 = 0; n0 < a.n; n0 += kRowBlock) {
    const int n1 = std::min(a.n, n0 + kRowBlock);
    for (int i = 0; i < a.m; ++i) {
      const float* x = a.x + static_cast<std::ptrdiff_t>(i) * ldx;
      float* y = a.y + static_cast<std::ptrdiff_t>(i) * ldy;
      for (int j = n0; j < n1; ++j) {
        float acc = 0.0f;
        if (a.w_bf16 != nullptr) {
          const std::uint16_t* w = a.w_bf16 + static_cast<std::ptrdiff_t>(j) * ldw;
          for (int p = 0; p < a.k; ++p)
            acc += bf16_to_float(float_to_bf16(x[p])) * bf16_to_float(w[p]);
        } else {
          const float* w = a.w + static_cast<std::ptrdiff_t>(j) * ldw;
          for (int p = 0; p < a.k; ++p) acc += x[p] * w[p];
        }
        y[j] = a.beta == 0.0f ? a.alpha * acc : a.alpha * acc + a.beta * y[j];
      }
    }
  }
}

}  // namespace hisparse::kernels
