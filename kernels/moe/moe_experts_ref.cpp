#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/moe/moe_experts.hpp"

namespace hisparse::kernels {
namespace {

[[nodiscard]] float weight_at(const void* w, bool bf16, std::size_t i) {
  return bf16 ? bf16_to_float(static_cast<const std::uint16_t*>(w)[i])
              : static_cast<const float*>(w)[i];
}

[[nodiscard]] float maybe_round(float v, bool bf16) {
  return bf16 ? bf16_to_float(float_to_bf16(v)) : v;
}

// One dot product of a weight row with a vector, summed in order.
[[nodiscard]] float dot(const void* w, bool bf16, std::size_t row, const float* v, int n) {
  float acc = 0.0f;
  for (int k = 0; k < n; ++k)
    acc +=
        weight_at(w, bf16, row * static_cast<std::size_t>(n) + static_cast<std::size_t>(k)) * v[k];
  return acc;
}

}  // namespace

void moe_experts_ref(const MoeExpertsArgs& a) {
  if (a.tokens > kMoeExpertsMaxTokens)
    throw Error("moe_experts", "more tokens than kMoeExpertsMaxTokens",
                "run the experts as GEMMs for larger batches");
  const auto H = static_cast<std::size_t>(a.hidden), W = static_cast<std::size_t>(a.width);
  std::vector<float> hr(H), act(W), actr(W), sum(H);
  for (int t = 0; t < a.tokens; ++t) {
    const float* h = a.h + static_cast<std::size_t>(t) * H;
    for (std::size_t k = 0; k < H; ++k) hr[k] = maybe_round(h[k], a.bf16);
    std::fill(sum.begin(), sum.end(), 0.0f);
    bool routed = false;
    for (int e = 0; e < a.experts; ++e) {
      const float r =
          a.route_weights[static_cast<std::size_t>(t) * static_cast<std::size_t>(a.experts) +
                          static_cast<std::size_t>(e)];
      if (r == 0.0f) continue;
      routed = true;
      for (std::size_t n = 0; n < W; ++n) {
        const float g = dot(a.gate[e], a.bf16, n, hr.data(), a.hidden);
        const float u = dot(a.up[e], a.bf16, n, hr.data(), a.hidden);
        act[n] = g / (1.0f + std::exp(-g)) * u;
        actr[n] = maybe_round(act[n], a.bf16);
      }
      float* scratch = a.act + (static_cast<std::size_t>(e) * static_cast<std::size_t>(a.tokens) +
                                static_cast<std::size_t>(t)) *
                                   W;
      std::copy(act.begin(), act.end(), scratch);
      for (std::size_t n = 0; n < H; ++n)
        sum[n] += r * dot(a.down[e], a.bf16, n, actr.data(), a.width);
    }
    if (!routed) continue;
    float* x = a.x + static_cast<std::size_t>(t) * H;
    for (std::size_t n = 0; n < H; ++n) x[n] += sum[n];
  }
}

}  // namespace hisparse::kernels
