#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/topk/topk.hpp"

namespace hisparse::kernels {
namespace {

TEST(KernelsIndexer, ScoresByHand) {
  // Heads q0 = (1, 0), q1 = (0, 1), weights (1, 0.5).
  // t0: key (2, -1), scale 1: relu(2) * 1 + relu(-1) * 0.5 = 2.
  // t1: key (-1, 4), scale 0.5: (relu(-1) * 1 + relu(4) * 0.5) * 0.5 = 1. t2 is past seq_len.
  const std::vector<float> q{1, 0, 0, 1};
  const std::vector<float> w{1.0f, 0.5f};
  std::vector<std::uint8_t> keys(3 * 2);
  const float raw[] = {2, -1, -1, 4, 9, 9};
  for (int i = 0; i < 6; ++i) keys[static_cast<std::size_t>(i)] = float_to_fp8e4m3(raw[i]);
  const std::vector<float> scales{1.0f, 0.5f, 1.0f};
  const std::vector<std::int64_t> len{2};
  std::vector<float> scores(3);
  IndexerArgs a;
  a.q = q.data();
  a.weights = w.data();
  a.keys = keys.data();
  a.key_scales = scales.data();
  a.seq_lens = len.data();
  a.scores = scores.data();
  a.batch = 1;
  a.heads = 2;
  a.dim = 2;
  a.capacity = 3;
  indexer_ref(a);
  EXPECT_EQ(scores[0], 2.0f);
  EXPECT_EQ(scores[1], 1.0f);
  EXPECT_EQ(scores[2], -std::numeric_limits<float>::infinity());
}

// A replayed CUDA graph's way: each request's new key at the position read from memory (not
// dest_offset). Request 0's key (448, 0) at row 2, request 1's (0, -448) at row 0, rows of 3.
TEST(KernelsIndexer, QuantizedKeysGoToPositionsReadFromMemory) {
  const std::vector<float> keys{448, 0, 0, -448};
  std::vector<std::uint8_t> codes(2 * 3 * 2, 0);
  std::vector<float> scales(2 * 3, 0.0f);
  const std::vector<std::int64_t> position{2, 0};
  QuantizeIndexKeysArgs q;
  q.keys = keys.data();
  q.codes = codes.data();
  q.scales = scales.data();
  q.rows = 2;
  q.dim = 2;
  q.key_stride = 2;
  q.dest_row_stride = 3;
  q.dest_offset = 1;  // ignored with positions
  q.dest_positions = position.data();
  quantize_index_keys_ref(q);
  EXPECT_EQ(scales, (std::vector<float>{0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(fp8e4m3_to_float(codes[4]), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(codes[7]), -448.0f);
  EXPECT_EQ(codes[2], 0);  // row 1 (dest_offset) untouched
}

TEST(KernelsIndexer, QuantizeKeyUsesAbsmaxOver448) {
  const float key[] = {448.0f, -224.0f, 0.0f};
  std::uint8_t codes[3];
  float scale = 0;
  quantize_index_key(key, 3, codes, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(fp8e4m3_to_float(codes[0]), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(codes[1]), -224.0f);
  EXPECT_EQ(codes[2], 0);
  const float zero[] = {0.0f, 0.0f};
  quantize_index_key(zero, 2, codes, &scale);
  EXPECT_EQ(scale, 1.0f);
  // Random keys come back within fp8's relative step (2^-4 of the value, plus subnormals).
  std::vector<float> k(64);
  std::vector<std::uint8_t> c(64);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 3.0f * random_normal(9, i);
  quantize_index_key(k.data(), 64, c.data(), &scale);
  for (std::size_t i = 0; i < k.size(); ++i)
    EXPECT_NEAR(fp8e4m3_to_float(c[i]) * scale, k[i], std::fabs(k[i]) / 16 + scale / 256) << i;
}

TEST(KernelsTopk, TiesGoToTheLowerPositionAndOutputIsSorted) {
  const std::vector<float> s{1, 3, 3, 2, 3};
  const std::vector<std::int64_t> len{5};
  std::vector<std::int32_t> out(2);
  TopkArgs a;
  a.scores = s.data();
  a.lengths = len.data();
  a.out = out.data();
  a.rows = 1;
  a.stride = 5;
  a.k = 2;
  topk_ref(a);
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 2}));
  out.resize(4);
  a.out = out.data();
  a.k = 4;
  topk_ref(a);
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 2, 3, 4}));
}

TEST(KernelsTopk, ShortRowsPadWithMinusOneAndNanRanksLast) {
  const std::vector<float> s{std::nanf(""), 1.0f, std::nanf(""), 50.0f};
  const std::vector<std::int64_t> len{3};
  std::vector<std::int32_t> out(5);
  TopkArgs a;
  a.scores = s.data();
  a.lengths = len.data();
  a.out = out.data();
  a.rows = 1;
  a.stride = 4;
  a.k = 5;
  topk_ref(a);  // position 3 is past the length: never chosen
  EXPECT_EQ(out, (std::vector<std::int32_t>{0, 1, 2, -1, -1}));
  a.k = 2;
  topk_ref(a);  // 1.0 first, then the lower NaN
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 1);
}

TEST(KernelsTopk, MatchesAFullSortOnRandomRows) {
  const int rows = 3, stride = 500, k = 37;
  std::vector<float> s(rows * stride);
  // Scores quantised to 1/8 so that ties are frequent.
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = std::round(random_normal(4, i) * 8) / 8;
  const std::vector<std::int64_t> len{500, 300, 20};
  std::vector<std::int32_t> out(rows * k);
  TopkArgs a;
  a.scores = s.data();
  a.lengths = len.data();
  a.out = out.data();
  a.rows = rows;
  a.stride = stride;
  a.k = k;
  topk_ref(a);
  for (int r = 0; r < rows; ++r) {
    std::vector<int> all(static_cast<std::size_t>(len[r]));
    for (int i = 0; i < len[r]; ++i) all[static_cast<std::size_t>(i)] = i;
    const float* row = s.data() + r * stride;
    std::stable_sort(all.begin(), all.end(), [&](int x, int y) { return row[x] > row[y]; });
    all.resize(std::min<std::size_t>(all.size(), k));
    std::sort(all.begin(), all.end());
    for (int i = 0; i < k; ++i)
      EXPECT_EQ(out[static_cast<std::size_t>(r * k + i)],
                i < static_cast<int>(all.size()) ? all[static_cast<std::size_t>(i)] : -1)
          << r << "," << i;
  }
}

}  // namespace
}  // namespace hisparse::kernels
