#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"

namespace hisparse::kernels {
namespace {

TEST(KernelsGemm, LinearLayerByHand) {
  // X [2x3], W [2x3] (rows = output features): Y = X W^T.
  const std::vector<float> x{1, 2, 3, 4, 5, 6};
  const std::vector<float> w{1, 0, -1, 0.5f, 0.5f, 0.5f};
  std::vector<float> y(4, 100.0f);
  GemmArgs a;
  a.x = x.data();
  a.w = w.data();
  a.y = y.data();
  a.m = 2;
  a.n = 2;
  a.k = 3;
  gemm_ref(a);
  EXPECT_EQ(y, (std::vector<float>{-2, 3, -2, 7.5f}));
  a.beta = 1.0f;  // residual accumulate
  gemm_ref(a);
  EXPECT_EQ(y, (std::vector<float>{-4, 6, -4, 15}));
}

TEST(KernelsGemm, Bf16WeightsRoundTheActivationsByHand) {
  // x = 1 + 2^-8 rounds to 1 and 3 + 2^-7 to 3 (both halfway, ties to even):
  // y = 1 * 2 + 3 * 0.5 = 3.5 with bf16 activations (3.51171875 in fp32).
  const std::vector<float> x{1.00390625f, 3.0078125f};
  const std::vector<std::uint16_t> w{0x4000, 0x3f00};  // 2, 0.5
  std::vector<float> y(1, 0.0f);
  GemmArgs a;
  a.x = x.data();
  a.w_bf16 = w.data();
  a.y = y.data();
  a.m = 1;
  a.n = 1;
  a.k = 2;
  gemm_ref(a);
  EXPECT_EQ(y[0], 3.5f);
}

TEST(KernelsGemm, LeadingDimensionsAndBlockingMatchNaiveSums) {
  const int m = 3, n = 130, k = 17, ldx = 20;
  std::vector<float> x(m * ldx), w(n * k), y(m * n);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = random_normal(5, i);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = random_normal(6, i);
  GemmArgs a;
  a.x = x.data();
  a.w = w.data();
  a.y = y.data();
  a.m = m;
  a.n = n;
  a.k = k;
  a.ldx = ldx;
  a.alpha = 0.5f;
  gemm_ref(a);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) acc += x[i * ldx + p] * w[j * k + p];
      EXPECT_EQ(y[i * n + j], 0.5f * acc) << i << "," << j;
    }
}

TEST(KernelsRmsNorm, ThreeFourByHand) {
  // mean(9, 16) = 12.5 -> divide by sqrt(12.5); weight (1, 2).
  const std::vector<float> x{3, 4, 0, 0};
  const std::vector<float> wt{1, 2};
  std::vector<float> y(4, 9.0f);
  RmsNormArgs a;
  a.x = x.data();
  a.weight = wt.data();
  a.y = y.data();
  a.rows = 2;
  a.n = 2;
  a.eps = 0.0f;
  a.eps = 1e-6f;
  rmsnorm_ref(a);
  EXPECT_NEAR(y[0], 3.0f / std::sqrt(12.5f), 1e-6f);
  EXPECT_NEAR(y[1], 8.0f / std::sqrt(12.5f), 1e-6f);
  EXPECT_EQ(y[2], 0.0f);  // a zero row stays zero thanks to eps
  EXPECT_EQ(y[3], 0.0f);
}

TEST(KernelsSwiglu, SiluOfGateTimesUp) {
  const std::vector<float> gu{0.0f, 1.0f, 5.0f, 2.0f};  // gate (0, 1), up (5, 2)
  std::vector<float> out(2);
  SwigluArgs a;
  a.gate_up = gu.data();
  a.out = out.data();
  a.rows = 1;
  a.width = 2;
  swiglu_ref(a);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
}

}  // namespace
}  // namespace hisparse::kernels
