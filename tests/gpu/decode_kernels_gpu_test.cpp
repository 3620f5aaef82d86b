// The decode step's CUDA kernels against their CPU twins on random shapes: GEMM (cuBLASLt),
// RMSNorm, SwiGLU, RoPE, decode attention (dense, sparse, GQA groups, MLA-sized rows), the GQA
// group attention mass, top-k (ties, NaN, -0, short rows), and the small ops of decode_ops.hpp
// (the non-finite check included); the tensor-core kernels are in decode_tensor_core_gpu_test.cpp. Float results within stated tolerances (the GPU
// sums in another order); selections, argmax, routing choices and codes exactly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/mla_decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/moe/moe_experts.hpp"
#include "kernels/topk/topk.hpp"
#include "support/error_message.hpp"
#include "support/gpu.hpp"
#include "support/kernel_mirror.hpp"

namespace hisparse {
namespace {

#if HISPARSE_WITH_CUDA

using test::Mirror;
using test::normal;
using test::scaled_error;

class DecodeKernelsGpu : public test::GpuStreamTest {};

TEST_F(DecodeKernelsGpu, GemmMatchesTheTwinWithStridesAlphaAndBeta) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 12; ++trial) {
    const int m = 1 + static_cast<int>(rng() % 9), n = 1 + static_cast<int>(rng() % 300),
              k = 1 + static_cast<int>(rng() % 700);
    const int ldx = k + static_cast<int>(rng() % 3), ldy = n + static_cast<int>(rng() % 5);
    const float beta = trial % 2 ? 1.0f : 0.0f, alpha = trial % 3 ? 1.0f : 0.5f;
    Mirror<float> x(normal(static_cast<std::size_t>(m) * ldx, rng));
    Mirror<float> w(normal(static_cast<std::size_t>(n) * k, rng, 0.05f));
    Mirror<float> y(normal(static_cast<std::size_t>(m) * ldy, rng));
    kernels::GemmArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.ldx = ldx;
    a.ldy = ldy;
    a.alpha = alpha;
    a.beta = beta;
    a.x = x.dev();
    a.w = w.dev();
    a.y = y.dev();
    kernels::launch_gemm(a, s());
    const auto got = y.fetch();
    a.x = x.host();
    a.w = w.host();
    a.y = y.host();
    kernels::gemm_ref(a);
    EXPECT_LT(scaled_error(got, std::vector<float>(y.host(), y.host() + got.size())), 1e-5)
        << m << "x" << n << "x" << k;
  }
}

TEST_F(DecodeKernelsGpu, Bf16WeightGemmMatchesTheTwin) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 8; ++trial) {
    const int m = 1 + static_cast<int>(rng() % 17), n = 8 * (1 + static_cast<int>(rng() % 60)),
              k = 8 * (1 + static_cast<int>(rng() % 90));
    const int ldx = k + 8 * static_cast<int>(rng() % 2);
    const float beta = trial % 2 ? 1.0f : 0.0f;
    Mirror<float> x(normal(static_cast<std::size_t>(m) * ldx, rng));
    std::vector<std::uint16_t> wb(static_cast<std::size_t>(n) * k);
    const auto wf = normal(wb.size(), rng, 0.05f);
    std::transform(wf.begin(), wf.end(), wb.begin(), float_to_bf16);
    Mirror<std::uint16_t> w(wb),
        scratch(std::vector<std::uint16_t>(static_cast<std::size_t>(m) * k));
    Mirror<float> y(normal(static_cast<std::size_t>(m) * n, rng));
    kernels::GemmArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.ldx = ldx;
    a.beta = beta;
    a.x = x.dev();
    a.w_bf16 = w.dev();
    a.x_bf16 = scratch.dev();
    a.y = y.dev();
    kernels::launch_gemm(a, s());
    const auto got = y.fetch();
    a.x = x.host();
    a.w_bf16 = w.host();
    a.x_bf16 = nullptr;
    a.y = y.host();
    kernels::gemm_ref(a);
    EXPECT_LT(scaled_error(got, std::vector<float>(y.host(), y.host() + got.size())), 1e-5)
        << m << "x" << n << "x" << k;
  }
  kernels::GemmArgs no_scratch;
  no_scratch.m = no_scratch.n = no_scratch.k = 8;
  no_scratch.w_bf16 = reinterpret_cast<const std::uint16_t*>(16);
  EXPECT_THROW(kernels::launch_gemm(no_scratch, s()), Error);
}

TEST_F(DecodeKernelsGpu, RmsNormSwigluAndRopeMatchTheTwin) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 6; ++trial) {
    const int rows = 1 + static_cast<int>(rng() % 7), n = 8 + static_cast<int>(rng() % 600);
    Mirror<float> x(normal(static_cast<std::size_t>(rows) * n, rng, 3.0f));
    Mirror<float> wt(normal(static_cast<std::size_t>(n), rng));
    Mirror<float> y(std::vector<float>(x.fetch().size()));
    kernels::RmsNormArgs r;
    r.rows = rows;
    r.n = n;
    r.x = x.dev();
    r.weight = trial % 2 ? wt.dev() : nullptr;
    r.y = y.dev();
    kernels::launch_rmsnorm(r, s());
    const auto got = y.fetch();
    r.x = x.host();
    r.weight = trial % 2 ? wt.host() : nullptr;
    r.y = y.host();
    kernels::rmsnorm_ref(r);
    EXPECT_LT(scaled_error(got, std::vector<float>(y.host(), y.host() + got.size())), 1e-5);

    const int width = 1 + static_cast<int>(rng() % 300);
    Mirror<float> gu(normal(static_cast<std::size_t>(rows) * 2 * width, rng, 2.0f));
    Mirror<float> out(std::vector<float>(static_cast<std::size_t>(rows) * width));
    kernels::SwigluArgs sw{gu.dev(), out.dev(), rows, width};
    kernels::launch_swiglu(sw, s());
    const auto got_sw = out.fetch();
    sw = {gu.host(), out.host(), rows, width};
    kernels::swiglu_ref(sw);
    EXPECT_LT(scaled_error(got_sw, std::vector<float>(out.host(), out.host() + got_sw.size())),
              1e-6);

    const int heads = 1 + static_cast<int>(rng() % 5), dim = 2 * (2 + static_cast<int>(rng() % 32));
    const int offset = static_cast<int>(rng() % 8), head_stride = offset + dim + 3;
    Mirror<float> q(normal(static_cast<std::size_t>(rows) * heads * head_stride, rng));
    std::vector<std::int64_t> positions(static_cast<std::size_t>(rows));
    for (auto& p : positions) p = static_cast<std::int64_t>(rng() % 200000);
    Mirror<std::int64_t> pos(positions);
    kernels::RopeArgs ro;
    ro.x = q.dev();
    ro.positions = pos.dev();
    ro.rows = rows;
    ro.heads = heads;
    ro.head_stride = head_stride;
    ro.offset = offset;
    ro.dim = dim;
    ro.theta = 1000000.0f;
    kernels::launch_rope(ro, s());
    const auto got_rope = q.fetch();
    ro.x = q.host();
    ro.positions = pos.host();
    kernels::rope_ref(ro);
    EXPECT_LT(scaled_error(got_rope, std::vector<float>(q.host(), q.host() + got_rope.size())),
              1e-5);
  }
}

TEST_F(DecodeKernelsGpu, DecodeAttentionDenseSparseAndMlaRowsMatchTheTwin) {
  std::mt19937 rng(3);
  struct Case {
    int q_heads, kv_heads, qk_dim, v_dim, stride;
    bool sparse, groups;
  };
  const Case cases[] = {{8, 2, 64, 64, 0, false, false},      {8, 2, 64, 64, 0, true, true},
                        {16, 1, 576, 512, 576, false, false}, {16, 1, 576, 512, 576, true, false},
                        {4, 4, 128, 128, 0, true, true},      {2, 1, 40, 24, 40, true, false}};
  for (const Case& c : cases) {
    const int batch = 3, top_k = 37;
    const std::int64_t capacity = 300;
    const int k_stride = c.stride ? c.stride : c.qk_dim, v_stride = c.stride ? c.stride : c.v_dim;
    const std::size_t rows = static_cast<std::size_t>(batch) * c.kv_heads * capacity;
    Mirror<float> q(normal(static_cast<std::size_t>(batch) * c.q_heads * c.qk_dim, rng, 0.2f));
    Mirror<float> k(normal(rows * static_cast<std::size_t>(k_stride), rng));
    Mirror<float> v(c.stride ? std::vector<float>(1) : normal(rows * c.v_dim, rng));
    std::vector<std::int64_t> lens = {1, 177, 300};
    Mirror<std::int64_t> len(lens);
    const int groups = c.groups ? c.kv_heads : 1;
    std::vector<std::int32_t> idx(static_cast<std::size_t>(batch) * groups * top_k);
    for (auto& i : idx) i = static_cast<std::int32_t>(rng() % 340) - 20;  // -1.. and past the end
    Mirror<std::int32_t> ix(idx);
    Mirror<float> out(std::vector<float>(static_cast<std::size_t>(batch) * c.q_heads * c.v_dim));
    kernels::DecodeAttentionArgs a;
    a.batch = batch;
    a.q_heads = c.q_heads;
    a.kv_heads = c.kv_heads;
    a.qk_dim = c.qk_dim;
    a.v_dim = c.v_dim;
    a.capacity = capacity;
    a.k_row_stride = c.stride;
    a.v_row_stride = c.stride;
    a.top_k = top_k;
    a.index_groups = groups;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.qk_dim));
    a.q = q.dev();
    a.k = k.dev();
    a.v = c.stride ? k.dev() : v.dev();
    a.seq_lens = len.dev();
    a.indices = c.sparse ? ix.dev() : nullptr;
    a.out = out.dev();
    kernels::launch_decode_attention(a, s());
    const auto got = out.fetch();
    a.q = q.host();
    a.k = k.host();
    a.v = c.stride ? k.host() : v.host();
    a.seq_lens = len.host();
    a.indices = c.sparse ? ix.host() : nullptr;
    a.out = out.host();
    kernels::decode_attention_ref(a);
    EXPECT_LT(scaled_error(got, std::vector<float>(out.host(), out.host() + got.size())), 2e-5)
        << c.q_heads << "/" << c.kv_heads << " dim " << c.qk_dim << (c.sparse ? " sparse" : "");
    (void)v_stride;
  }
}

// The tensor-core MLA attention against decode_attention_ref on bf16 rows: the GLM-5.1 row
// (576 / 512, 64 heads, top_k 2048 with entries out of range), 128 and 20 heads (two CTAs of
// heads, a partial one), the tiny-dsa row (80 / 64), dense over per-request lengths, and plans
// with one or many splits. Split-bf16 products: within 1e-4 of the fp32 twin.
TEST_F(DecodeKernelsGpu, MlaDecodeAttentionMatchesTheTwin) {
  std::mt19937 rng(21);
  struct Case {
    int heads, qk_dim, v_dim, batch, top_k;
    std::int64_t capacity;
    bool sparse;
    int multiprocessors;
  };
  const Case cases[] = {
      {64, 576, 512, 2, 2048, 5000, true, 132}, {64, 576, 512, 3, 2048, 4096, true, 1},
      {128, 576, 512, 1, 300, 700, true, 132},  {20, 576, 512, 2, 77, 400, true, 132},
      {4, 80, 64, 3, 64, 600, true, 132},       {4, 80, 64, 3, 0, 600, false, 132},
      {64, 576, 512, 2, 0, 1000, false, 8}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.heads) + " heads, dim " + std::to_string(c.qk_dim) +
                 (c.sparse ? ", sparse" : ", dense") + ", batch " + std::to_string(c.batch));
    const std::size_t rows =
        static_cast<std::size_t>(c.batch) * static_cast<std::size_t>(c.capacity);
    std::vector<std::uint16_t> kv(rows * static_cast<std::size_t>(c.qk_dim));
    {
      const auto values = normal(kv.size(), rng);
      for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = float_to_bf16(values[i]);
    }
    Mirror<std::uint16_t> k(kv);
    Mirror<float> q(normal(static_cast<std::size_t>(c.batch) * c.heads * c.qk_dim, rng, 0.3f));
    std::vector<std::int64_t> lens(static_cast<std::size_t>(c.batch));
    for (std::size_t b = 0; b < lens.size(); ++b)
      lens[b] =
          b == 0 ? 1 : static_cast<std::int64_t>(rng() % static_cast<unsigned>(c.capacity + 50));
    Mirror<std::int64_t> len(lens);
    std::vector<std::int32_t> idx(static_cast<std::size_t>(c.batch) * std::max(c.top_k, 1));
    for (auto& i : idx)
      i = static_cast<std::int32_t>(rng() % static_cast<unsigned>(c.capacity + 40)) - 20;
    Mirror<std::int32_t> ix(idx);
    Mirror<float> out(
        std::vector<float>(static_cast<std::size_t>(c.batch) * c.heads * c.v_dim, -7.0f));
    kernels::DecodeAttentionArgs a;
    a.batch = c.batch;
    a.q_heads = c.heads;
    a.kv_heads = 1;
    a.qk_dim = c.qk_dim;
    a.v_dim = c.v_dim;
    a.capacity = c.capacity;
    a.k_row_stride = c.qk_dim;
    a.v_row_stride = c.qk_dim;
    a.top_k = c.top_k;
    a.scale = 1.0f / std::sqrt(192.0f);
    a.q = q.dev();
    a.k_bf16 = a.v_bf16 = k.dev();
    a.seq_lens = len.dev();
    a.indices = c.sparse ? ix.dev() : nullptr;
    a.out = out.dev();
    ASSERT_TRUE(kernels::mla_decode_attention_supports(a));
    const auto plan = kernels::plan_mla_decode_attention(
        c.batch, c.heads, c.sparse ? c.top_k : c.capacity, c.multiprocessors);
    const std::size_t floats =
        kernels::mla_decode_workspace_floats(c.batch, c.heads, c.v_dim, plan.splits);
    auto workspace = Buffer<float>::device(floats, Backend::cuda, "test workspace");
    kernels::launch_mla_decode_attention(a, plan, workspace.device_data(), floats, s());
    EXPECT_THROW(
        kernels::launch_mla_decode_attention(a, plan, workspace.device_data(), floats - 1, s()),
        Error);
    const auto got = out.fetch();
    a.q = q.host();
    a.k_bf16 = a.v_bf16 = k.host();
    a.seq_lens = len.host();
    a.indices = c.sparse ? ix.host() : nullptr;
    a.out = out.host();
    kernels::decode_attention_ref(a);
    EXPECT_LT(scaled_error(got, std::vector<float>(out.host(), out.host() + got.size())), 1e-4)
        << plan.splits << " splits of " << plan.rows_per_split;
  }
}

TEST_F(DecodeKernelsGpu, GroupAttentionMassMatchesTheTwin) {
  std::mt19937 rng(4);
  const int batch = 2, q_heads = 8, kv_heads = 2, dim = 64;
  const std::int64_t capacity = 513;
  Mirror<float> q(normal(static_cast<std::size_t>(batch) * q_heads * dim, rng, 0.3f));
  Mirror<float> k(normal(static_cast<std::size_t>(batch) * kv_heads * capacity * dim, rng));
  Mirror<std::int64_t> len(std::vector<std::int64_t>{513, 200});
  Mirror<float> mass(std::vector<float>(static_cast<std::size_t>(batch) * kv_heads * capacity));
  kernels::GroupAttentionMassArgs m;
  m.batch = batch;
  m.q_heads = q_heads;
  m.kv_heads = kv_heads;
  m.qk_dim = dim;
  m.capacity = capacity;
  m.scale = 0.125f;
  m.q = q.dev();
  m.k = k.dev();
  m.seq_lens = len.dev();
  m.mass = mass.dev();
  kernels::launch_group_attention_mass(m, s());
  const auto got = mass.fetch();
  m.q = q.host();
  m.k = k.host();
  m.seq_lens = len.host();
  m.mass = mass.host();
  kernels::group_attention_mass_ref(m);
  EXPECT_LT(scaled_error(got, std::vector<float>(mass.host(), mass.host() + got.size())), 1e-5);
}

// Every fifth trial's rows are longer than the keys the kernel holds in shared memory (49152), so
// both of its paths are checked.
TEST_F(DecodeKernelsGpu, TopkIsExactlyTheTwinsSelection) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 25; ++trial) {
    const int rows = 1 + static_cast<int>(rng() % 5);
    const std::int64_t stride =
        (trial % 5 == 4 ? 49153 : 1) + static_cast<std::int64_t>(rng() % 20000);
    const int k = 1 + static_cast<int>(rng() % 3000);
    std::vector<float> sc(static_cast<std::size_t>(rows) * stride);
    // Coarse values so that ties are common; NaN, infinities and both zeros mixed in.
    for (float& x : sc) {
      const auto r = rng() % 100;
      x = r == 0   ? std::numeric_limits<float>::quiet_NaN()
          : r == 1 ? -std::numeric_limits<float>::infinity()
          : r == 2 ? std::numeric_limits<float>::infinity()
          : r == 3 ? -0.0f
          : r == 4 ? 0.0f
                   : static_cast<float>(static_cast<int>(rng() % 64) - 32) / 4.0f;
    }
    std::vector<std::int64_t> lens(static_cast<std::size_t>(rows));
    for (auto& l : lens) l = static_cast<std::int64_t>(rng() % (stride + 1));
    Mirror<float> scores(sc);
    Mirror<std::int64_t> len(lens);
    Mirror<std::int32_t> out(std::vector<std::int32_t>(static_cast<std::size_t>(rows) * k, 7));
    kernels::TopkArgs t;
    t.rows = rows;
    t.stride = stride;
    t.k = k;
    t.scores = scores.dev();
    t.lengths = len.dev();
    t.out = out.dev();
    kernels::launch_topk(t, s());
    const auto got = out.fetch();
    t.scores = scores.host();
    t.lengths = len.host();
    t.out = out.host();
    kernels::topk_ref(t);
    ASSERT_EQ(got, std::vector<std::int32_t>(out.host(), out.host() + got.size()))
        << "rows " << rows << " stride " << stride << " k " << k;
  }
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), float_to_bf16);
  return out;
}

TEST_F(DecodeKernelsGpu, AttentionAndGroupMassOverBf16RowsMatchTheTwin) {
  std::mt19937 rng(9);
  struct Case {
    int q_heads, kv_heads, dim, v_dim, stride;
    bool sparse;
  };
  for (const Case& c : {Case{8, 2, 128, 128, 0, true}, Case{16, 1, 576, 512, 576, false},
                        Case{16, 1, 576, 512, 576, true}}) {
    const int batch = 2, top_k = 64;
    const std::int64_t capacity = 400;
    const std::size_t rows = static_cast<std::size_t>(batch) * c.kv_heads * capacity;
    Mirror<float> q(normal(static_cast<std::size_t>(batch) * c.q_heads * c.dim, rng, 0.2f));
    Mirror<std::uint16_t> k(to_bf16(normal(rows * (c.stride ? c.stride : c.dim), rng)));
    Mirror<std::uint16_t> v(c.stride ? std::vector<std::uint16_t>(1)
                                     : to_bf16(normal(rows * c.v_dim, rng)));
    Mirror<std::int64_t> len(std::vector<std::int64_t>{400, 123});
    std::vector<std::int32_t> idx(static_cast<std::size_t>(batch) * top_k);
    for (auto& i : idx) i = static_cast<std::int32_t>(rng() % 420) - 10;
    Mirror<std::int32_t> ix(idx);
    Mirror<float> out(std::vector<float>(static_cast<std::size_t>(batch) * c.q_heads * c.v_dim));
    kernels::DecodeAttentionArgs a;
    a.batch = batch;
    a.q_heads = c.q_heads;
    a.kv_heads = c.kv_heads;
    a.qk_dim = c.dim;
    a.v_dim = c.v_dim;
    a.capacity = capacity;
    a.k_row_stride = a.v_row_stride = c.stride;
    a.top_k = top_k;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    auto bind = [&](bool device) {
      a.q = device ? q.dev() : q.host();
      a.k_bf16 = device ? k.dev() : k.host();
      a.v_bf16 = c.stride ? a.k_bf16 : device ? v.dev() : v.host();
      a.seq_lens = device ? len.dev() : len.host();
      a.indices = !c.sparse ? nullptr : device ? ix.dev() : ix.host();
      a.out = device ? out.dev() : out.host();
    };
    bind(true);
    kernels::launch_decode_attention(a, s());
    const auto got = out.fetch();
    bind(false);
    kernels::decode_attention_ref(a);
    EXPECT_LT(scaled_error(got, std::vector<float>(out.host(), out.host() + got.size())), 2e-5)
        << "dim " << c.dim << (c.sparse ? " sparse" : " dense");
    if (c.stride) continue;
    Mirror<float> mass{std::vector<float>(rows)};
    kernels::GroupAttentionMassArgs m;
    m.batch = batch;
    m.q_heads = c.q_heads;
    m.kv_heads = c.kv_heads;
    m.qk_dim = c.dim;
    m.capacity = capacity;
    m.scale = a.scale;
    m.q = q.dev();
    m.k_bf16 = k.dev();
    m.seq_lens = len.dev();
    m.mass = mass.dev();
    kernels::launch_group_attention_mass(m, s());
    const auto got_mass = mass.fetch();
    m.q = q.host();
    m.k_bf16 = k.host();
    m.seq_lens = len.host();
    m.mass = mass.host();
    kernels::group_attention_mass_ref(m);
    EXPECT_LT(scaled_error(got_mass, std::vector<float>(mass.host(), mass.host() + rows)), 1e-5);
  }
  // The new rows into a bf16 cache: rounded in place, written with the cache's stride.
  Mirror<float> src(normal(6 * 40, rng));
  Mirror<std::uint16_t> dst(std::vector<std::uint16_t>(6 * 100, 7));
  kernels::StoreBf16RowsArgs st{src.dev(), dst.dev(), 6, 40, 0, 100};
  kernels::launch_store_bf16_rows(st, s());
  const auto got_src = src.fetch();
  const auto got_dst = dst.fetch();
  st = {src.host(), dst.host(), 6, 40, 0, 100};
  kernels::store_bf16_rows_ref(st);
  EXPECT_EQ(got_src, std::vector<float>(src.host(), src.host() + got_src.size()));
  EXPECT_EQ(got_dst, std::vector<std::uint16_t>(dst.host(), dst.host() + got_dst.size()));
  // At positions read from device memory (a replayed graph's way): 3 requests x 2 KV heads, each
  // (request, head) a cache of 64 rows, each at its request's position.
  Mirror<float> src2(normal(6 * 40, rng));
  Mirror<std::uint16_t> cache(std::vector<std::uint16_t>(6 * 64 * 40, 9));
  Mirror<std::int64_t> position(std::vector<std::int64_t>{63, 63, 0, 0, 17, 17});
  kernels::StoreBf16RowsArgs at{src2.dev(), cache.dev(), 6, 40, 0, 64 * 40, position.dev()};
  kernels::launch_store_bf16_rows(at, s());
  const auto got_cache = cache.fetch();
  at.src = src2.host();
  at.dst = cache.host();
  at.dst_positions = position.host();
  kernels::store_bf16_rows_ref(at);
  EXPECT_EQ(got_cache, std::vector<std::uint16_t>(cache.host(), cache.host() + got_cache.size()));
  EXPECT_EQ(got_cache[(3 * 64 + 0) * 40 + 5], float_to_bf16(src2.host()[3 * 40 + 5]));
}

TEST_F(DecodeKernelsGpu, SmallDecodeOpsMatchTheTwin) {
  std::mt19937 rng(7);
  const int batch = 3, heads = 4, nope = 24, rope = 8, lora = 40, vd = 16, experts = 12;
  // gather
  Mirror<float> table(normal(50 * 33, rng));
  Mirror<std::int32_t> ids(std::vector<std::int32_t>{7, 0, 49});
  Mirror<float> rows(std::vector<float>(3 * 33));
  kernels::GatherRowsArgs g{table.dev(), ids.dev(), rows.dev(), 3, 33};
  kernels::launch_gather_rows(g, s());
  const auto got_rows = rows.fetch();
  g = {table.host(), ids.host(), rows.host(), 3, 33};
  kernels::gather_rows_ref(g);
  EXPECT_EQ(got_rows, std::vector<float>(rows.host(), rows.host() + got_rows.size()));
  // blend (a zero row keeps the workload's query)
  auto model_q = normal(static_cast<std::size_t>(batch) * heads * 72, rng);
  std::fill(model_q.begin(), model_q.begin() + 72, 0.0f);
  Mirror<float> wl(normal(model_q.size(), rng)), mq(model_q);
  kernels::BlendQueriesArgs b{wl.dev(), mq.dev(), batch * heads, 72, 0.25f};
  kernels::launch_blend_queries(b, s());
  const auto got_blend = mq.fetch();
  b = {wl.host(), mq.host(), batch * heads, 72, 0.25f};
  kernels::blend_queries_ref(b);
  EXPECT_LT(scaled_error(got_blend, std::vector<float>(mq.host(), mq.host() + model_q.size())),
            1e-6);
  // MLA absorb and up-projection
  Mirror<float> q(normal(static_cast<std::size_t>(batch) * heads * (nope + rope), rng));
  Mirror<float> kv_b(normal(static_cast<std::size_t>(heads) * (nope + vd) * lora, rng, 0.2f));
  Mirror<float> absorbed(
      std::vector<float>(static_cast<std::size_t>(batch) * heads * (lora + rope)));
  kernels::MlaAbsorbArgs ab{q.dev(), kv_b.dev(), absorbed.dev(), batch, heads,
                            nope,    rope,       lora,           vd};
  kernels::launch_mla_absorb(ab, s());
  const auto got_ab = absorbed.fetch();
  ab = {q.host(), kv_b.host(), absorbed.host(), batch, heads, nope, rope, lora, vd};
  kernels::mla_absorb_ref(ab);
  EXPECT_LT(
      scaled_error(got_ab, std::vector<float>(absorbed.host(), absorbed.host() + got_ab.size())),
      1e-5);
  Mirror<float> lat(normal(static_cast<std::size_t>(batch) * heads * lora, rng));
  Mirror<float> up(std::vector<float>(static_cast<std::size_t>(batch) * heads * vd));
  kernels::MlaUpProjectArgs u{lat.dev(), kv_b.dev(), up.dev(), batch, heads, nope, lora, vd};
  kernels::launch_mla_up_project(u, s());
  const auto got_up = up.fetch();
  u = {lat.host(), kv_b.host(), up.host(), batch, heads, nope, lora, vd};
  kernels::mla_up_project_ref(u);
  EXPECT_LT(scaled_error(got_up, std::vector<float>(up.host(), up.host() + got_up.size())), 1e-5);
  // router: ties go to the lower expert
  auto lg = normal(static_cast<std::size_t>(batch) * experts, rng);
  lg[3] = lg[5] = lg[9] = 4.0f;  // token 0: three-way tie for the top
  Mirror<float> logits(lg), weights(std::vector<float>(lg.size()));
  kernels::MoeRouteArgs r{logits.dev(), weights.dev(), batch, experts, 2};
  kernels::launch_moe_route(r, s());
  const auto got_w = weights.fetch();
  r = {logits.host(), weights.host(), batch, experts, 2};
  kernels::moe_route_ref(r);
  for (std::size_t i = 0; i < lg.size(); ++i)
    EXPECT_EQ(got_w[i] == 0.0f, weights.host()[i] == 0.0f) << i;
  EXPECT_GT(got_w[3], 0.0f);
  EXPECT_GT(got_w[5], 0.0f);
  EXPECT_EQ(got_w[9], 0.0f);
  EXPECT_LT(scaled_error(got_w, std::vector<float>(weights.host(), weights.host() + lg.size())),
            1e-6);
  // argmax: ties go to the lower index
  auto lx = normal(static_cast<std::size_t>(batch) * 3001, rng);
  lx[100] = lx[2000] = 99.0f;
  Mirror<float> lxm(lx);
  Mirror<std::int32_t> best{std::vector<std::int32_t>(batch)};
  kernels::ArgmaxArgs am{lxm.dev(), best.dev(), batch, 3001};
  kernels::launch_argmax(am, s());
  const auto got_best = best.fetch();
  am = {lxm.host(), best.host(), batch, 3001};
  kernels::argmax_ref(am);
  EXPECT_EQ(got_best, std::vector<std::int32_t>(best.host(), best.host() + batch));
  EXPECT_EQ(got_best[0], 100);
  // scale rows, bias, head weights, slots
  Mirror<float> act(normal(static_cast<std::size_t>(batch) * 20, rng)), fac(normal(batch * 5, rng));
  kernels::ScaleRowsArgs sr{act.dev(), fac.dev() + 2, batch, 20, 0, 5};
  kernels::launch_scale_rows(sr, s());
  const auto got_sr = act.fetch();
  sr = {act.host(), fac.host() + 2, batch, 20, 0, 5};
  kernels::scale_rows_ref(sr);
  EXPECT_EQ(got_sr, std::vector<float>(act.host(), act.host() + got_sr.size()));
  Mirror<float> hw(normal(static_cast<std::size_t>(batch) * heads, rng));
  kernels::IndexerHeadWeightsArgs h{hw.dev(), batch, heads, 0.25f};
  kernels::launch_indexer_head_weights(h, s());
  const auto got_hw = hw.fetch();
  h = {hw.host(), batch, heads, 0.25f};
  kernels::indexer_head_weights_ref(h);
  EXPECT_LT(scaled_error(got_hw, std::vector<float>(hw.host(), hw.host() + got_hw.size())), 1e-6);
  Mirror<std::int32_t> phys(std::vector<std::int32_t>{0, 5, -1, 9, 17, -1}),
      slots(std::vector<std::int32_t>(6));
  kernels::SlotsFromPhysicalArgs sp{phys.dev(), slots.dev(), 2, 3, 8};
  kernels::launch_slots_from_physical(sp, s());
  EXPECT_EQ(slots.fetch(), (std::vector<std::int32_t>{0, 5, -1, 0, 8, -1}));
}

// The HiSparse append into mapped pinned memory (the pool) and device memory (the hot buffer):
// 16-byte rows (1152 B, the MLA bf16 row) and odd ones (20 B), rows apart by the strides.
TEST_F(DecodeKernelsGpu, AppendRowsWritesPoolAndHotBufferAsTheTwin) {
  std::mt19937 rng(17);
  for (int bytes : {1152, 20}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    const int rows = 5;
    const std::size_t pool_stride = 3 * 1152 + 16, hot_stride = 2 * 1152 + 32;
    std::vector<std::uint8_t> src(static_cast<std::size_t>(rows) * bytes);
    for (auto& b : src) b = static_cast<std::uint8_t>(rng());
    Mirror<std::uint8_t> src_d(src);
    auto pool = Buffer<std::uint8_t>::pinned(rows * pool_stride, Backend::cuda, "test pool");
    std::fill_n(pool.host_data(), pool.size(), std::uint8_t{0xAB});
    Mirror<std::uint8_t> hot(std::vector<std::uint8_t>(rows * hot_stride, 0xCD));
    kernels::AppendRowsArgs a{
        src_d.dev(), pool.device_data() + 7, pool_stride, hot.dev() + 64, hot_stride, rows, bytes};
    if (bytes % 16 == 0) a.pool = pool.device_data() + 16;
    kernels::launch_append_rows(a, s());
    const auto got_hot = hot.fetch();  // synchronises
    std::vector<std::uint8_t> want_pool(pool.size(), 0xAB), want_hot(rows * hot_stride, 0xCD);
    const std::ptrdiff_t pool_at = a.pool - pool.device_data();
    a.src = src.data();
    a.pool = want_pool.data() + pool_at;
    a.hot = want_hot.data() + 64;
    kernels::append_rows_ref(a);
    EXPECT_EQ(std::vector<std::uint8_t>(pool.host_data(), pool.host_data() + pool.size()),
              want_pool);
    EXPECT_EQ(got_hot, want_hot);
  }
  // Positions read from device memory: pool rows of 9 tokens per request, 4 hot slots + the
  // newest-token slot per request; positions below the hot size go to their own slot, later ones
  // to the reserved slot 4.
  const int rows = 4, bytes = 48, tokens = 9, hot_slots = 4;
  std::vector<std::uint8_t> src(static_cast<std::size_t>(rows) * bytes);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng());
  Mirror<std::uint8_t> src_d(src);
  const std::size_t pool_stride = tokens * bytes, hot_stride = (hot_slots + 1) * bytes;
  auto pool = Buffer<std::uint8_t>::pinned(rows * pool_stride, Backend::cuda, "test pool");
  std::fill_n(pool.host_data(), pool.size(), std::uint8_t{0xAB});
  Mirror<std::uint8_t> hot(std::vector<std::uint8_t>(rows * hot_stride, 0xCD));
  Mirror<std::int64_t> position(std::vector<std::int64_t>{0, 3, 4, 8});
  kernels::AppendRowsArgs a{
      src_d.dev(), pool.device_data(), pool_stride, hot.dev(), hot_stride, rows,
      bytes,       position.dev(),     bytes,       bytes,     hot_slots};
  kernels::launch_append_rows(a, s());
  const auto got_hot = hot.fetch();
  std::vector<std::uint8_t> want_pool(pool.size(), 0xAB), want_hot(rows * hot_stride, 0xCD);
  a.src = src.data();
  a.pool = want_pool.data();
  a.hot = want_hot.data();
  a.positions = position.host();
  kernels::append_rows_ref(a);
  EXPECT_EQ(std::vector<std::uint8_t>(pool.host_data(), pool.host_data() + pool.size()), want_pool);
  EXPECT_EQ(got_hot, want_hot);
  EXPECT_EQ(want_hot[3 * hot_stride + hot_slots * bytes], src[3 * bytes]);  // position 8: slot 4
  EXPECT_EQ(want_pool[3 * pool_stride + 8 * bytes], src[3 * bytes]);
}

// The non-finite check over random rows with NaN, +Inf and -Inf planted at random places (and
// none at all): every launch keeps the smallest marked site, as the twin does.
TEST_F(DecodeKernelsGpu, MarkNonFiniteKeepsTheFirstSiteAsTheTwinDoes) {
  std::mt19937 rng(11);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int sites = 6;
    std::vector<std::vector<float>> rows;
    for (int site = 0; site < sites; ++site) {
      auto v = normal(1000 + 4099 * static_cast<std::size_t>(site), rng, 1e30f);  // large, finite
      if (std::uniform_int_distribution<int>(0, 2)(rng) == 0)
        v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)] =
            bad[(trial + site) % 3];
      rows.push_back(std::move(v));
    }
    Mirror<std::int32_t> first(std::vector<std::int32_t>{0x7f7f7f7f});
    std::int32_t want = 0x7f7f7f7f;
    // Sites launched out of order: the smallest wins, not the last written.
    for (int site : {3, 5, 0, 4, 1, 2}) {
      Mirror<float> x(rows[static_cast<std::size_t>(site)]);
      kernels::MarkNonFiniteArgs a{x.dev(), static_cast<std::int64_t>(rows[site].size()), site,
                                   first.dev()};
      kernels::launch_mark_non_finite(a, s());
      HISPARSE_CUDA_CHECK(cudaStreamSynchronize(s()));
      a = {rows[static_cast<std::size_t>(site)].data(), a.n, site, &want};
      kernels::mark_non_finite_ref(a);
    }
    EXPECT_EQ(first.fetch()[0], want);
  }
}

#else
TEST(DecodeKernelsGpu, NeedsACudaBuild) {
  GTEST_SKIP() << "GPU test skipped: this build has no CUDA backend";
}
#endif

}  // namespace
}  // namespace hisparse
