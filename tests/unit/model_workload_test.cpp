#include "model/kv_workload.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.hpp"
#include "model/decode_engine.hpp"
#include "support/error_message.hpp"

namespace hisparse {
namespace {

std::size_t overlap(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::set<std::int32_t> s(a.begin(), a.end());
  std::size_t n = 0;
  for (auto x : b) n += x >= 0 && s.count(x);
  return n;
}

TEST(ModelWorkload, GeometryFollowsTheModel) {
  const KvWorkload g(load_model("tiny-gqa"), WorkloadSpec{}, 2, 256);
  EXPECT_EQ(g.kv_heads(), 2);
  EXPECT_EQ(g.q_heads(), 8);
  EXPECT_EQ(g.key_dim(), 32);
  EXPECT_EQ(g.index_heads(), 0);
  const KvWorkload d(load_model("tiny-dsa"), WorkloadSpec{}, 2, 256);
  EXPECT_EQ(d.kv_heads(), 1);
  EXPECT_EQ(d.key_dim(), 64 + 16);
  EXPECT_EQ(d.value_dim(), 64);
  EXPECT_EQ(d.index_dim(), 32);
}

TEST(ModelWorkload, DeterministicAndSliceIndependent) {
  const KvWorkload w(load_model("tiny-gqa"), WorkloadSpec{}, 2, 256);
  std::vector<float> all(100 * 32), part(10 * 32);
  w.keys(1, 1, 1, 0, 100, all.data());
  w.keys(1, 1, 1, 40, 10, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 40 * 32));
  std::vector<float> q5(8 * 32), q5_again(8 * 32), q2(8 * 32);
  w.queries(0, 0, 5, q5.data());
  w.queries(0, 0, 2, q2.data());  // going back recomputes
  w.queries(0, 0, 5, q5_again.data());
  EXPECT_EQ(q5, q5_again);
  const KvWorkload other(load_model("tiny-gqa"), WorkloadSpec{}, 2, 256);
  std::vector<float> q5_other(8 * 32);
  other.queries(0, 0, 5, q5_other.data());
  EXPECT_EQ(q5, q5_other);
}

TEST(ModelWorkload, ChannelVariancesSpreadAndOutliersShowInTheKeys) {
  WorkloadSpec spec;
  spec.channel_spread_decades = 3.0;
  spec.outlier_channels = 2;
  spec.outlier_scale = 10.0;
  spec.sink_tokens = 0;
  spec.recency_bias = 0.0;
  const KvWorkload w(load_model("tiny-gqa"), spec, 1, 4096);
  const auto var = w.channel_variance(0, 0);
  ASSERT_EQ(var.size(), 32u);
  std::vector<float> sorted = var;
  std::sort(sorted.begin(), sorted.end());
  // Rank r of 32 has variance 10^(-3 r / 31); ranks 0 and 1 are the outliers (x 10^2).
  EXPECT_NEAR(sorted[0], 1e-3f, 1e-6f);
  EXPECT_NEAR(sorted[29], std::pow(10.0f, -6.0f / 31), 1e-5f);
  EXPECT_NEAR(sorted[30], 100.0f * std::pow(10.0f, -3.0f / 31), 1e-3f);
  EXPECT_FLOAT_EQ(sorted[31], 100.0f);
  // The empirical variance of the keys matches the generator's within sampling error.
  std::vector<float> k(4096 * 32);
  w.keys(0, 0, 0, 0, 4096, k.data());
  for (int j = 0; j < 32; ++j) {
    double s = 0;
    for (int t = 0; t < 4096; ++t) s += static_cast<double>(k[t * 32 + j]) * k[t * 32 + j];
    EXPECT_NEAR(s / 4096, var[static_cast<std::size_t>(j)], 0.1 * var[static_cast<std::size_t>(j)])
        << j;
  }
}

TEST(ModelWorkload, SinksAreSelectedAndSmallDriftKeepsSelectionsClose) {
  WorkloadSpec spec;
  spec.query_drift = 0.02;
  const KvWorkload w(load_model("tiny-dsa"), spec, 1, 2048);
  const auto s0 = w.select(0, 1, 0, 2048, 64);
  const auto s1 = w.select(0, 1, 1, 2048, 64);
  ASSERT_EQ(s0.size(), 64u);
  for (int sink = 0; sink < 4; ++sink) EXPECT_EQ(s0[static_cast<std::size_t>(sink)], sink);
  EXPECT_TRUE(std::is_sorted(s0.begin(), s0.end()));
  EXPECT_GE(overlap(s0, s1), 48u);
  // A large drift decorrelates the steps: far less overlap after 10 steps.
  spec.query_drift = 0.9;
  const KvWorkload fast(load_model("tiny-dsa"), spec, 1, 2048);
  EXPECT_LT(overlap(fast.select(0, 1, 0, 2048, 64), fast.select(0, 1, 10, 2048, 64)),
            overlap(s0, s1));
  // GQA selection (exact attention mass) also keeps the sinks.
  const KvWorkload g(load_model("tiny-gqa"), WorkloadSpec{}, 1, 1024);
  const auto sg = g.select(0, 0, 0, 1024, 32);
  EXPECT_EQ(sg[0], 0);
  EXPECT_EQ(sg[3], 3);
}

TEST(ModelWorkload, BadSpecIsRejected) {
  auto error_of = [](const WorkloadSpec& s) {
    return test::error_message([&] { KvWorkload w(load_model("tiny-gqa"), s, 1, 16); });
  };
  WorkloadSpec spec;
  spec.generator = "replay";
  EXPECT_EQ(error_of(spec),
            "workload.replay_path: generator 'replay' needs a path to captured tensors; set "
            "workload.replay_path to a directory of .npy files or a .safetensors file");
  spec.generator = "captured";
  EXPECT_EQ(error_of(spec),
            "workload.generator: unknown generator 'captured'; use workload.generator: synthetic "
            "or replay");
  spec = {};
  spec.query_drift = 1.5;
  try {
    KvWorkload w(load_model("tiny-gqa"), spec, 1, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "workload.query_drift: must lie in [0, 1], got 1.5; use e.g. 0.05");
  }
}

}  // namespace
}  // namespace hisparse
