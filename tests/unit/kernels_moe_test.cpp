// The fused MoE experts' CPU twin: a case worked by hand, and the same layer composed from the
// GEMM, SwiGLU and router twins the engine used before (every expert over the whole batch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/moe/moe_experts.hpp"
#include "support/error_message.hpp"

namespace hisparse {
namespace {

using kernels::MoeExpertsArgs;

std::vector<float> identity(int n) {
  std::vector<float> m(static_cast<std::size_t>(n) * n, 0.0f);
  for (int i = 0; i < n; ++i) m[static_cast<std::size_t>(i) * n + i] = 1.0f;
  return m;
}

TEST(KernelsMoe, OneTokenThroughIdentityExpertsByHand) {
  // hidden = width = 8; expert 0 has identity projections, expert 1 zero gate, expert 2 is not
  // routed. Token 0: h = e0 + 2 e3, weights 0.5 (expert 0) and 0.25 (expert 1).
  const int n = 8;
  const std::vector<float> eye = identity(n), zero(static_cast<std::size_t>(n) * n, 0.0f);
  const void* gate[3] = {eye.data(), zero.data(), eye.data()};
  const void* up[3] = {eye.data(), eye.data(), eye.data()};
  const void* down[3] = {eye.data(), eye.data(), eye.data()};
  std::vector<float> h(n, 0.0f), x(n, 1.0f), act(3 * n, -7.0f);
  h[0] = 1.0f;
  h[3] = 2.0f;
  const std::vector<float> route = {0.5f, 0.25f, 0.0f};
  MoeExpertsArgs a;
  a.h = h.data();
  a.route_weights = route.data();
  a.gate = gate;
  a.up = up;
  a.down = down;
  a.act = act.data();
  a.x = x.data();
  a.tokens = 1;
  a.experts = 3;
  a.hidden = n;
  a.width = n;
  kernels::moe_experts_ref(a);
  // Expert 0: act = silu(h) * h: silu(1) = 1 / (1 + e^-1), silu(2) * 2 = 4 / (1 + e^-2).
  const float s1 = 1.0f / (1.0f + std::exp(-1.0f)), s2 = 4.0f / (1.0f + std::exp(-2.0f));
  EXPECT_FLOAT_EQ(act[0], s1);
  EXPECT_FLOAT_EQ(act[3], s2);
  EXPECT_EQ(act[1], 0.0f);
  // Expert 1: gate 0, silu(0) = 0, so it adds nothing; expert 2's row is never written.
  for (int i = 0; i < n; ++i) EXPECT_EQ(act[static_cast<std::size_t>(n + i)], 0.0f) << i;
  EXPECT_EQ(act[2 * n], -7.0f);
  EXPECT_FLOAT_EQ(x[0], 1.0f + 0.5f * s1);
  EXPECT_FLOAT_EQ(x[3], 1.0f + 0.5f * s2);
  EXPECT_EQ(x[1], 1.0f);
}

// The layer as the engine's GEMM path computes it: router weights, then per expert gate/up GEMMs,
// SwiGLU, rows scaled by their weights, down GEMM accumulated into x.
std::vector<float> experts_as_gemms(const std::vector<float>& h, const std::vector<float>& route,
                                    const std::vector<std::vector<float>>& w, std::vector<float> x,
                                    int tokens, int experts, int hidden, int width, bool bf16) {
  for (int e = 0; e < experts; ++e) {
    std::vector<float> gate_up(static_cast<std::size_t>(tokens) * 2 * width);
    std::vector<float> act(static_cast<std::size_t>(tokens) * width);
    for (int p = 0; p < 2; ++p) {
      kernels::GemmArgs g;
      const auto& m = w[static_cast<std::size_t>(3 * e + p)];
      std::vector<std::uint16_t> mb(m.size());
      for (std::size_t i = 0; i < m.size(); ++i) mb[i] = float_to_bf16(m[i]);
      g.x = h.data();
      g.w = m.data();
      if (bf16) g.w_bf16 = mb.data();
      g.y = gate_up.data() + p * width;
      g.m = tokens;
      g.n = width;
      g.k = hidden;
      g.ldy = 2 * width;
      kernels::gemm_ref(g);
    }
    kernels::SwigluArgs s;
    s.gate_up = gate_up.data();
    s.out = act.data();
    s.rows = tokens;
    s.width = width;
    kernels::swiglu_ref(s);
    const auto& down = w[static_cast<std::size_t>(3 * e + 2)];
    std::vector<std::uint16_t> db(down.size());
    for (std::size_t i = 0; i < down.size(); ++i) db[i] = float_to_bf16(down[i]);
    for (int t = 0; t < tokens; ++t) {
      const float r = route[static_cast<std::size_t>(t * experts + e)];
      if (r == 0.0f) continue;
      kernels::GemmArgs g;
      g.x = act.data() + static_cast<std::size_t>(t) * width;
      g.w = down.data();
      if (bf16) g.w_bf16 = db.data();
      g.y = x.data() + static_cast<std::size_t>(t) * hidden;
      g.m = 1;
      g.n = hidden;
      g.k = width;
      g.alpha = r;
      g.beta = 1.0f;
      kernels::gemm_ref(g);
    }
  }
  return x;
}

TEST(KernelsMoe, TwinEqualsTheLayerComposedFromGemmsWithinRounding) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int tokens = 5, experts = 6, hidden = 48, width = 24;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::vector<std::vector<float>> w;
    for (int i = 0; i < 3 * experts; ++i) {
      std::vector<float> m(static_cast<std::size_t>(hidden) * width);
      for (float& v : m) v = bf16_to_float(float_to_bf16(0.2f * d(rng)));  // bf16 values
      w.push_back(std::move(m));
    }
    std::vector<float> h(static_cast<std::size_t>(tokens) * hidden), x(h.size()),
        logits(static_cast<std::size_t>(tokens) * experts), route(logits.size());
    for (float& v : h) v = d(rng);
    for (float& v : x) v = d(rng);
    for (float& v : logits) v = d(rng);
    kernels::MoeRouteArgs r{logits.data(), route.data(), tokens, experts, 2};
    kernels::moe_route_ref(r);
    std::vector<const void*> ptr;
    std::vector<std::vector<std::uint16_t>> wb;
    for (const auto& m : w) {
      std::vector<std::uint16_t> b(m.size());
      for (std::size_t i = 0; i < m.size(); ++i) b[i] = float_to_bf16(m[i]);
      wb.push_back(std::move(b));
    }
    for (int p = 0; p < 3; ++p)
      for (int e = 0; e < experts; ++e)
        ptr.push_back(
            bf16 ? static_cast<const void*>(wb[static_cast<std::size_t>(3 * e + p)].data())
                 : static_cast<const void*>(w[static_cast<std::size_t>(3 * e + p)].data()));
    const std::vector<float> x_before = x;
    const std::vector<float> want =
        experts_as_gemms(h, route, w, x, tokens, experts, hidden, width, bf16);
    std::vector<float> act(static_cast<std::size_t>(experts) * tokens * width);
    MoeExpertsArgs a{h.data(),
                     route.data(),
                     ptr.data(),
                     ptr.data() + experts,
                     ptr.data() + 2 * experts,
                     bf16,
                     act.data(),
                     x.data(),
                     tokens,
                     experts,
                     hidden,
                     width};
    kernels::moe_experts_ref(a);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(x[i] - want[i])));
    EXPECT_LT(worst, 1e-4);
    EXPECT_NE(x, x_before);  // every token is routed to 2 experts
  }
}

// The tensor-core path: bf16 with hidden and width multiples of 32, and its workspace holds the
// plan and the scratch of tokens x experts pairs (each part 256-byte aligned).
TEST(KernelsMoe, TensorCorePathAndItsWorkspace) {
  MoeExpertsArgs a;
  a.bf16 = true;
  a.tokens = 3;
  a.experts = 5;
  a.hidden = 128;
  a.width = 64;
  ASSERT_TRUE(kernels::moe_experts_use_tensor_cores(a));
  const auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t pairs = 15;
  EXPECT_EQ(kernels::moe_experts_workspace_bytes(a), up(8 * 5) + up(4 * 5) + up(4 * pairs) +
                                                         up(2 * 3 * 128) + up(2 * pairs * 64) +
                                                         up(4 * pairs * 128));
  for (auto change :
       {+[](MoeExpertsArgs& m) { m.bf16 = false; }, +[](MoeExpertsArgs& m) { m.hidden = 136; },
        +[](MoeExpertsArgs& m) { m.width = 72; }}) {
    MoeExpertsArgs b = a;
    change(b);
    EXPECT_FALSE(kernels::moe_experts_use_tensor_cores(b));
    EXPECT_EQ(kernels::moe_experts_workspace_bytes(b), 0u);
  }
}

TEST(KernelsMoe, MoreTokensThanTheLimitAreRefused) {
  MoeExpertsArgs a;
  a.tokens = kernels::kMoeExpertsMaxTokens + 1;
  EXPECT_EQ(test::error_message([&] { kernels::moe_experts_ref(a); }),
            "moe_experts: more tokens than kMoeExpertsMaxTokens; run the experts as GEMMs for "
            "larger batches");
}

}  // namespace
}  // namespace hisparse
