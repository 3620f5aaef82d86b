#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtypes.hpp"
#include "core/rng.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/mla_decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/decode/decode_ops.hpp"

namespace hisparse::kernels {
namespace {

// Two rows of two floats into a bf16 cache whose rows are 4 elements apart.
void decode_ops_store(std::vector<float>& src, std::vector<std::uint16_t>& dst) {
  StoreBf16RowsArgs st{src.data(), dst.data(), 2, 2, 0, 4};
  store_bf16_rows_ref(st);
}

// The stores a replayed CUDA graph makes read the new token's position from memory: worked by
// hand on the twins (the kernels share these address functions and are checked against them on
// the GPU).
TEST(KernelsDecodeOps, StoresAtPositionsReadFromMemory) {
  // Two requests x two KV heads, caches of 3 rows of 2; request 0 at position 2, request 1 at 0.
  std::vector<float> src{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::uint16_t> cache(4 * 3 * 2, 0);
  const std::vector<std::int64_t> position{2, 2, 0, 0};  // per (request, KV head) row
  StoreBf16RowsArgs st{src.data(), cache.data(), 4, 2, 0, 6, position.data()};
  store_bf16_rows_ref(st);
  std::vector<std::uint16_t> want(cache.size(), 0);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 2; ++c)
      want[static_cast<std::size_t>(r * 6 + position[static_cast<std::size_t>(r)] * 2 + c)] =
          float_to_bf16(src[r * 2 + c]);
  EXPECT_EQ(cache, want);
  EXPECT_EQ(cache[4], float_to_bf16(1.0f));   // row 0 at position 2: elements 4, 5
  EXPECT_EQ(cache[12], float_to_bf16(5.0f));  // row 2 (request 1) at position 0: element 12

  // The append: pool rows of 2 bytes, 4 tokens per stream; 2 hot slots + the newest slot.
  const std::vector<std::uint8_t> rows{10, 11, 20, 21, 30, 31};
  std::vector<std::uint8_t> pool(3 * 8, 0), hot(3 * 6, 0);
  const std::vector<std::int64_t> at{0, 1, 3};  // slots 0, 1 and (3 >= 2 hot slots) the newest, 2
  AppendRowsArgs a{rows.data(), pool.data(), 8, hot.data(), 6, 3, 2, at.data(), 2, 2, 2};
  append_rows_ref(a);
  EXPECT_EQ(pool, (std::vector<std::uint8_t>{10, 11, 0,  0,  0, 0, 0,  0,  //
                                             0,  0,  20, 21, 0, 0, 0,  0,  //
                                             0,  0,  0,  0,  0, 0, 30, 31}));
  EXPECT_EQ(hot, (std::vector<std::uint8_t>{10, 11, 0, 0, 0, 0,  //
                                            0, 0, 20, 21, 0, 0,  //
                                            0, 0, 0, 0, 30, 31}));
}

TEST(KernelsAttention, TwoTokensByHand) {
  // logits 0 and ln 3: weights 1/4 and 3/4 of v0 = (4, 0) and v1 = (0, 8) -> (1, 6).
  const std::vector<float> q{1.0f, 0.0f};
  const std::vector<float> k{0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<float> v{4.0f, 0.0f, 0.0f, 8.0f};
  const std::vector<std::int64_t> len{2};
  std::vector<float> out(2, -1.0f);
  DecodeAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.seq_lens = len.data();
  a.out = out.data();
  a.batch = 1;
  a.q_heads = 1;
  a.kv_heads = 1;
  a.qk_dim = 2;
  a.v_dim = 2;
  a.capacity = 2;
  decode_attention_ref(a);
  EXPECT_NEAR(out[0], 1.0f, 1e-6f);
  EXPECT_NEAR(out[1], 6.0f, 1e-6f);
}

TEST(KernelsAttention, Bf16RowsReadAsTheirFloatValues) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: rounds to even (1); 1 + 3 * 2^-8 to 1 + 2^-6.
  std::vector<float> src{1.00390625f, 1.01171875f, -2.0f, 0.0f};
  std::vector<std::uint16_t> dst(8, 0xffff);
  decode_ops_store(src, dst);
  EXPECT_EQ(src, (std::vector<float>{1.0f, 1.015625f, -2.0f, 0.0f}));
  EXPECT_EQ(dst, (std::vector<std::uint16_t>{0x3f80, 0x3f82, 0xffff, 0xffff, 0xc000, 0x0000, 0xffff,
                                             0xffff}));
  // The same two-token case as above, its rows in bf16 (all exactly representable).
  const std::vector<float> q{1.0f, 0.0f};
  const std::vector<std::uint16_t> k{float_to_bf16(0.0f), 0, float_to_bf16(1.0f), 0};
  const std::vector<std::uint16_t> v{float_to_bf16(4.0f), 0, 0, float_to_bf16(8.0f)};
  const std::vector<std::int64_t> len{2};
  std::vector<float> out(2, -1.0f);
  DecodeAttentionArgs a;
  a.q = q.data();
  a.k_bf16 = k.data();
  a.v_bf16 = v.data();
  a.seq_lens = len.data();
  a.out = out.data();
  a.batch = a.q_heads = a.kv_heads = 1;
  a.qk_dim = a.v_dim = 2;
  a.capacity = 2;
  decode_attention_ref(a);
  const float w1 = std::exp(1.0f) / (1.0f + std::exp(1.0f));  // logits 0 and 1
  EXPECT_NEAR(out[0], 4.0f * (1.0f - w1), 1e-6f);
  EXPECT_NEAR(out[1], 8.0f * w1, 1e-6f);
}

TEST(KernelsAttention, SparseIndicesSkipMinusOneAndUseScale) {
  // Three rows; selection {2, -1, 0}: row 1 is ignored. scale 0.5: logits 0.5*2 = 1 and 0.
  const std::vector<float> q{2.0f};
  const std::vector<float> k{0.0f, 100.0f, 1.0f};
  const std::vector<float> v{10.0f, -50.0f, 20.0f};
  const std::vector<std::int32_t> idx{2, -1, 0};
  std::vector<float> out(1);
  DecodeAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.indices = idx.data();
  a.out = out.data();
  a.batch = 1;
  a.q_heads = 1;
  a.kv_heads = 1;
  a.qk_dim = 1;
  a.v_dim = 1;
  a.capacity = 3;
  a.top_k = 3;
  a.scale = 0.5f;
  decode_attention_ref(a);
  const float e = std::exp(1.0f);
  EXPECT_NEAR(out[0], (e * 20.0f + 10.0f) / (e + 1.0f), 1e-5f);
  // Every entry -1: the head reads nothing and outputs zero.
  const std::vector<std::int32_t> none{-1, -1, -1};
  a.indices = none.data();
  out[0] = 7.0f;
  decode_attention_ref(a);
  EXPECT_EQ(out[0], 0.0f);
}

TEST(KernelsAttention, GqaHeadsReadTheirKvHeadAndMlaStridesWork) {
  // 2 query heads share KV head 0, 2 more share KV head 1; one token each: output = its value.
  const std::vector<float> q(4 * 2, 1.0f);
  const std::vector<float> k{1, 1, 1, 1};
  const std::vector<float> v{3, 4, 5, 6};
  const std::vector<std::int64_t> len{1};
  std::vector<float> out(4 * 2);
  DecodeAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.seq_lens = len.data();
  a.out = out.data();
  a.batch = 1;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.qk_dim = 2;
  a.v_dim = 2;
  a.capacity = 1;
  decode_attention_ref(a);
  EXPECT_EQ(out, (std::vector<float>{3, 4, 3, 4, 5, 6, 5, 6}));
  // MLA: rows [c0 c1 | r], v aliases k with v_dim 2: the output is the attended latent.
  const std::vector<float> rows{1, 2, 0, 3, 4, 0};
  const std::vector<float> q1{0, 0, 1};
  const std::vector<std::int64_t> len2{2};
  std::vector<float> lat(2);
  DecodeAttentionArgs m;
  m.q = q1.data();
  m.k = rows.data();
  m.v = rows.data();
  m.seq_lens = len2.data();
  m.out = lat.data();
  m.batch = 1;
  m.q_heads = 1;
  m.kv_heads = 1;
  m.qk_dim = 3;
  m.v_dim = 2;
  m.capacity = 2;
  m.k_row_stride = 3;
  m.v_row_stride = 3;
  decode_attention_ref(m);
  EXPECT_NEAR(lat[0], 2.0f, 1e-6f);  // equal logits: mean of (1,2) and (3,4)
  EXPECT_NEAR(lat[1], 3.0f, 1e-6f);
}

TEST(KernelsAttention, SparseOverAllRowsInOrderEqualsDenseExactly) {
  const int heads = 4, dim = 16, n = 37;
  std::vector<float> q(heads * dim), k(n * dim), v(n * dim);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = random_normal(1, i);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = random_normal(2, i), v[i] = random_normal(3, i);
  std::vector<std::int32_t> idx(40, -1);
  for (int i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = i;
  const std::vector<std::int64_t> len{n};
  std::vector<float> dense(heads * dim), sparse(heads * dim);
  DecodeAttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.seq_lens = len.data();
  a.out = dense.data();
  a.batch = 1;
  a.q_heads = heads;
  a.kv_heads = 1;
  a.qk_dim = dim;
  a.v_dim = dim;
  a.capacity = n;
  a.scale = 0.25f;
  decode_attention_ref(a);
  a.indices = idx.data();
  a.top_k = 40;
  a.out = sparse.data();
  decode_attention_ref(a);
  EXPECT_EQ(dense, sparse);
}

TEST(KernelsRope, RotatesPairsByPositionTimesFrequency) {
  // dim 4, theta 100: pair (0,2) turns by pos * 1, pair (1,3) by pos * 100^(-1/2) = pos / 10.
  std::vector<float> x{1, 1, 0, 0};
  const std::vector<std::int64_t> pos{10};
  RopeArgs a;
  a.x = x.data();
  a.positions = pos.data();
  a.rows = 1;
  a.heads = 1;
  a.head_stride = 4;
  a.dim = 4;
  a.theta = 100.0f;
  rope_ref(a);
  EXPECT_NEAR(x[0], std::cos(10.0f), 1e-6f);
  EXPECT_NEAR(x[2], std::sin(10.0f), 1e-6f);
  EXPECT_NEAR(x[1], std::cos(1.0f), 1e-6f);
  EXPECT_NEAR(x[3], std::sin(1.0f), 1e-6f);
}

TEST(KernelsRope, OffsetTouchesOnlyTheRopeTailAndPositionZeroIsIdentity) {
  // Two heads of [nope nope | r0 r1]; only channels 2, 3 of each head rotate.
  std::vector<float> x{5, 6, 1, 0, 7, 8, 0, 1};
  const std::vector<std::int64_t> pos{1};
  RopeArgs a;
  a.x = x.data();
  a.positions = pos.data();
  a.rows = 1;
  a.heads = 2;
  a.head_stride = 4;
  a.offset = 2;
  a.dim = 2;
  rope_ref(a);
  EXPECT_EQ(x[0], 5.0f);
  EXPECT_EQ(x[5], 8.0f);
  EXPECT_NEAR(x[2], std::cos(1.0f), 1e-6f);
  EXPECT_NEAR(x[3], std::sin(1.0f), 1e-6f);
  EXPECT_NEAR(x[6], -std::sin(1.0f), 1e-6f);
  EXPECT_NEAR(x[7], std::cos(1.0f), 1e-6f);
  std::vector<float> y{1, 2, 3, 4};
  const std::vector<std::int64_t> zero{0};
  a.x = y.data();
  a.positions = zero.data();
  a.heads = 1;
  a.offset = 0;
  a.dim = 4;
  rope_ref(a);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3, 4}));
}

// The MLA kernel's plan, worked by hand: 2048 rows are 64 tiles of 32.
TEST(KernelsAttention, MlaDecodePlanFillsTheSmsOnceAndCoversTheRows) {
  auto plan = plan_mla_decode_attention(1, 64, 2048, 132);  // one CTA per split: 64 tiles
  EXPECT_EQ(plan.splits, 64);
  EXPECT_EQ(plan.rows_per_split, 32);
  plan = plan_mla_decode_attention(8, 64, 2048, 132);  // 16 splits wanted: 4 tiles each
  EXPECT_EQ(plan.rows_per_split, 128);
  EXPECT_EQ(plan.splits, 16);
  plan = plan_mla_decode_attention(64, 64, 2048, 132);  // 2 wanted: 32 tiles each
  EXPECT_EQ(plan.rows_per_split, 1024);
  EXPECT_EQ(plan.splits, 2);
  plan = plan_mla_decode_attention(5, 64, 2048, 132);  // 26 wanted: 3 tiles each, 22 splits
  EXPECT_EQ(plan.rows_per_split, 96);
  EXPECT_EQ(plan.splits, 22);
  plan = plan_mla_decode_attention(64, 128, 2048, 132);  // 128 CTAs already: one split
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.rows_per_split, 2048);
  plan = plan_mla_decode_attention(2, 4, 0, 132);  // no rows: one empty tile
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.rows_per_split, 32);
  EXPECT_EQ(mla_decode_workspace_floats(2, 64, 512, 3), 2u * 64u * 3u * 514u);
  // The workspace bound: no plan of a batch has more splits, however many rows.
  EXPECT_EQ(mla_decode_max_splits(8, 64, 132), 16);
  EXPECT_EQ(mla_decode_max_splits(64, 128, 132), 1);
  for (const std::int64_t rows : {0, 31, 2048, 1 << 20})
    EXPECT_LE(plan_mla_decode_attention(8, 64, rows, 132).splits,
              mla_decode_max_splits(8, 64, 132));
}

TEST(KernelsAttention, MlaDecodeSupportsOnlyLatentBf16Rows) {
  alignas(16) static std::uint16_t rows[64];
  alignas(16) static float queries[8], outputs[8];
  DecodeAttentionArgs a;
  a.q = queries;
  a.out = outputs;
  a.kv_heads = 1;
  a.qk_dim = 576;
  a.v_dim = 512;
  a.k_row_stride = a.v_row_stride = 576;
  a.k_bf16 = a.v_bf16 = rows;
  EXPECT_TRUE(mla_decode_attention_supports(a));
  DecodeAttentionArgs b = a;
  b.kv_heads = 2;  // GQA
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.v_bf16 = rows + 8;  // values apart from the keys
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.qk_dim = 584;  // wider than the kernel
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.k_bf16 = b.v_bf16 = rows + 1;  // not 16-byte aligned
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.k_bf16 = b.v_bf16 = nullptr;  // float rows
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.q = queries + 1;  // read as float4
  EXPECT_FALSE(mla_decode_attention_supports(b));
  b = a;
  b.out = outputs + 2;  // written as float4
  EXPECT_FALSE(mla_decode_attention_supports(b));
}

}  // namespace
}  // namespace hisparse::kernels
