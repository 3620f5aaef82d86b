// The decode step's tensor-core kernels against their CPU twins on random shapes: the MoE experts
// (both paths), MLA's absorbed projections, and the DSA indexer with its key quantisation. Float
// results within stated tolerances (other summation orders, split-bf16 activations); codes
// exactly.
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
#include "kernels/decode/decode_ops.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/moe/moe_experts.hpp"
#include "support/error_message.hpp"
#include "support/gpu.hpp"
#include "support/kernel_mirror.hpp"

namespace hisparse {
namespace {

#if HISPARSE_WITH_CUDA

using test::Mirror;
using test::normal;
using test::scaled_error;

class DecodeTensorCoreGpu : public test::GpuStreamTest {};

// Tensor-core shapes (8 heads of 64 channels, 16, 32 and 64 heads of 128), the thread-per-token
// kernel (4 x 32, the tiny model's, and 12 x 64: heads not a multiple of 8) and the
// warp-per-token fallback (40 channels; 72 heads). A capacity of 1000 leaves a partial last pass.
TEST_F(DecodeTensorCoreGpu, IndexerAndKeyQuantisationMatchTheTwin) {
  std::mt19937 rng(5);
  for (const auto& [heads, dim] :
       {std::pair{8, 64}, {16, 128}, {32, 128}, {64, 128}, {4, 32}, {12, 64}, {4, 40}, {72, 32}}) {
    SCOPED_TRACE(std::to_string(heads) + " heads x " + std::to_string(dim));
    const int batch = 3, new_keys = 3;
    const std::int64_t capacity = 1000;
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(batch) * capacity * dim);
    std::vector<float> scales(static_cast<std::size_t>(batch) * capacity);
    const auto keys = normal(static_cast<std::size_t>(batch) * capacity * dim, rng, 2.0f);
    for (std::size_t t = 0; t < scales.size(); ++t)
      kernels::quantize_index_key(keys.data() + t * dim, dim, codes.data() + t * dim, &scales[t]);
    Mirror<std::uint8_t> c(codes);
    Mirror<float> sc(scales);
    // The new token's key of each request, quantised on the GPU into row 999 of each request.
    Mirror<float> fresh(normal(static_cast<std::size_t>(new_keys) * dim, rng, 5.0f));
    kernels::QuantizeIndexKeysArgs qa;
    qa.rows = new_keys;
    qa.dim = dim;
    qa.key_stride = dim;
    qa.dest_row_stride = capacity;
    qa.dest_offset = 999;
    // The kernel on the device copies, its twin on the host ones, then both compared.
    auto quantize_both = [&](Mirror<std::int64_t>* position) {
      qa.keys = fresh.dev();
      qa.codes = c.dev();
      qa.scales = sc.dev();
      qa.dest_positions = position ? position->dev() : nullptr;
      kernels::launch_quantize_index_keys(qa, s());
      qa.keys = fresh.host();
      qa.codes = c.host();
      qa.scales = sc.host();
      qa.dest_positions = position ? position->host() : nullptr;
      kernels::quantize_index_keys_ref(qa);
      EXPECT_EQ(c.fetch(), std::vector<std::uint8_t>(c.host(), c.host() + codes.size()));
      EXPECT_EQ(sc.fetch(), std::vector<float>(sc.host(), sc.host() + scales.size()));
    };
    quantize_both(nullptr);
    // Each request's own position, read from device memory (a replayed graph's way).
    Mirror<std::int64_t> position(std::vector<std::int64_t>{0, 517, 998});
    qa.dest_offset = -1;  // unused with positions
    quantize_both(&position);

    Mirror<float> q(normal(static_cast<std::size_t>(batch) * heads * dim, rng, 0.1f));
    Mirror<float> w(normal(static_cast<std::size_t>(batch) * heads, rng));
    Mirror<std::int64_t> len(std::vector<std::int64_t>{1000, 1, 517});
    Mirror<float> scores(std::vector<float>(static_cast<std::size_t>(batch) * capacity));
    kernels::IndexerArgs a;
    a.batch = batch;
    a.heads = heads;
    a.dim = dim;
    a.capacity = capacity;
    a.q = q.dev();
    a.weights = w.dev();
    a.keys = c.dev();
    a.key_scales = sc.dev();
    a.seq_lens = len.dev();
    a.scores = scores.dev();
    kernels::launch_indexer(a, s());
    const auto got = scores.fetch();
    a.q = q.host();
    a.weights = w.host();
    a.keys = c.host();
    a.key_scales = sc.host();
    a.seq_lens = len.host();
    a.scores = scores.host();
    kernels::indexer_ref(a);
    // Tensor cores: queries split in two bf16 parts keep about 16 bits of each, and the sums run
    // in another order; a wrong channel, head or token is off by O(1).
    EXPECT_LT(scaled_error(got, std::vector<float>(scores.host(), scores.host() + got.size())),
              kernels::indexer_uses_tensor_cores(heads, dim) ? 1e-4 : 1e-5);
    for (int r = 0; r < batch; ++r)  // past each request's length: -infinity
      for (std::int64_t t = len.host()[r]; t < capacity; ++t)
        ASSERT_EQ(got[static_cast<std::size_t>(r * capacity + t)],
                  -std::numeric_limits<float>::infinity());
  }
}

// MLA's absorbed projections on tensor cores (bf16 weights, fp32 activations split in two bf16
// parts) against the fp32 twins over the same weight values: the tiny model's shape (a k tail of
// 32, a CTA with half its rows), an odd one, and GLM-5.1's with more requests than one CTA takes.
TEST_F(DecodeTensorCoreGpu, MlaProjectionsOnTensorCoresMatchTheTwin) {
  struct Shape {
    int batch, heads, nope, rope, lora, vd;
  };
  std::mt19937 rng(17);
  for (const Shape c : {Shape{1, 4, 32, 16, 64, 32}, Shape{13, 3, 96, 8, 160, 48},
                        Shape{70, 2, 192, 64, 512, 256}}) {
    SCOPED_TRACE(fmt::format("batch {}, heads {}, nope {}, rope {}, lora {}, v_dim {}", c.batch,
                             c.heads, c.nope, c.rope, c.lora, c.vd));
    ASSERT_TRUE(kernels::mla_projections_use_tensor_cores(c.nope, c.rope, c.lora, c.vd));
    auto kv_b = normal(static_cast<std::size_t>(c.heads) * (c.nope + c.vd) * c.lora, rng, 0.2f);
    std::vector<std::uint16_t> kv_b_bf16(kv_b.size());
    for (std::size_t i = 0; i < kv_b.size(); ++i) {
      kv_b_bf16[i] = float_to_bf16(kv_b[i]);
      kv_b[i] = bf16_to_float(kv_b_bf16[i]);
    }
    std::vector<float> uk_t(static_cast<std::size_t>(c.heads) * c.lora * c.nope);
    kernels::mla_transpose_uk_ref(kv_b.data(), c.heads, c.nope, c.lora, c.vd, uk_t.data());
    std::vector<std::uint16_t> uk_t_bf16(uk_t.size());
    std::transform(uk_t.begin(), uk_t.end(), uk_t_bf16.begin(), float_to_bf16);
    Mirror<std::uint16_t> d_kv_b(kv_b_bf16), d_uk_t(uk_t_bf16);
    Mirror<float> q(normal(static_cast<std::size_t>(c.batch) * c.heads * (c.nope + c.rope), rng));
    Mirror<float> absorbed(
        std::vector<float>(static_cast<std::size_t>(c.batch) * c.heads * (c.lora + c.rope), -3.0f));
    kernels::MlaAbsorbArgs ab{q.dev(), nullptr, absorbed.dev(), c.batch, c.heads,
                              c.nope,  c.rope,  c.lora,         c.vd,    d_uk_t.dev()};
    kernels::launch_mla_absorb(ab, s());
    const auto got_ab = absorbed.fetch();
    ab = {q.host(), kv_b.data(), absorbed.host(), c.batch, c.heads, c.nope, c.rope, c.lora, c.vd};
    kernels::mla_absorb_ref(ab);
    // Split activations keep about 16 bits of each mantissa: errors near 1e-5 of the output's
    // scale; a wrong head, row or request is off by O(1).
    EXPECT_LT(
        scaled_error(got_ab, std::vector<float>(absorbed.host(), absorbed.host() + got_ab.size())),
        1e-4);
    Mirror<float> lat(normal(static_cast<std::size_t>(c.batch) * c.heads * c.lora, rng));
    Mirror<float> up(std::vector<float>(static_cast<std::size_t>(c.batch) * c.heads * c.vd, -3.0f));
    kernels::MlaUpProjectArgs u{lat.dev(), nullptr, up.dev(), c.batch,     c.heads,
                                c.nope,    c.lora,  c.vd,     d_kv_b.dev()};
    kernels::launch_mla_up_project(u, s());
    const auto got_up = up.fetch();
    u = {lat.host(), kv_b.data(), up.host(), c.batch, c.heads, c.nope, c.lora, c.vd};
    kernels::mla_up_project_ref(u);
    EXPECT_LT(scaled_error(got_up, std::vector<float>(up.host(), up.host() + got_up.size())), 1e-4);
  }
  kernels::MlaUpProjectArgs odd;
  odd.batch = odd.heads = 1;
  odd.nope = 16;
  odd.lora = 48;  // not a multiple of 32
  odd.v_dim = 16;
  std::vector<std::uint16_t> none(1);
  odd.kv_b_bf16 = none.data();
  EXPECT_NE(test::error_message([&] {
              kernels::launch_mla_up_project(odd, s());
            }).find("mla_projections_use_tensor_cores"),
            std::string::npos);
}

// The fused MoE experts against their twin on both paths: the CUDA-core kernels (fp32 and bf16
// weights, widths that are multiples of 8 but not of a lane pass) and the tensor-core path (bf16,
// multiples of 32: a k tail of 32 and a last CTA with 32 of its 64 rows, every tile count from 1
// to 8, and a batch whose every token picks one expert,
// so that expert's 64 tokens fill all 8 n8 tiles); 1 up to 64 tokens, an expert nobody chose.
TEST_F(DecodeTensorCoreGpu, MoeExpertsMatchTheTwin) {
  struct Shape {
    int experts, hidden, width;
    bool bf16, crowded;
  };
  std::mt19937 rng(13);
  for (const Shape shape : {Shape{10, 264, 136, false, false}, Shape{10, 264, 136, true, false},
                            Shape{12, 352, 224, true, false}, Shape{12, 352, 224, true, true}})
    for (int tokens : {1, 7, 20, 40, kernels::kMoeExpertsMaxTokens}) {
      const auto [experts, hidden, width, bf16, crowded] = shape;
      SCOPED_TRACE(fmt::format("{} experts, hidden {}, width {}, {}{}, {} tokens", experts, hidden,
                               width, bf16 ? "bf16" : "fp32", crowded ? ", crowded" : "", tokens));
      std::vector<Mirror<float>> wf;
      std::vector<Mirror<std::uint16_t>> wb;
      for (int i = 0; i < 3 * experts; ++i) {
        auto m = normal(static_cast<std::size_t>(hidden) * width, rng, 0.1f);
        std::vector<std::uint16_t> b(m.size());
        for (std::size_t j = 0; j < m.size(); ++j) {
          b[j] = float_to_bf16(m[j]);
          m[j] = bf16_to_float(b[j]);
        }
        wf.emplace_back(std::move(m));
        wb.emplace_back(std::move(b));
      }
      // Table order: gate of every expert, then up, then down (i = 3 e + p holds expert e's p).
      std::vector<const void*> host_table, device_table;
      for (int p = 0; p < 3; ++p)
        for (int e = 0; e < experts; ++e) {
          const std::size_t i = static_cast<std::size_t>(3 * e + p);
          host_table.push_back(bf16 ? static_cast<const void*>(wb[i].host())
                                    : static_cast<const void*>(wf[i].host()));
          device_table.push_back(bf16 ? static_cast<const void*>(wb[i].dev())
                                      : static_cast<const void*>(wf[i].dev()));
        }
      Mirror<const void*> table(device_table);
      auto logits = normal(static_cast<std::size_t>(tokens) * experts, rng);
      for (int t = 0; t < tokens; ++t) {
        logits[static_cast<std::size_t>(t * experts + 4)] = -99.0f;
        if (crowded) logits[static_cast<std::size_t>(t * experts + 1)] = 99.0f;
      }
      std::vector<float> route(logits.size());
      kernels::MoeRouteArgs r{logits.data(), route.data(), tokens, experts, 3};
      kernels::moe_route_ref(r);
      Mirror<float> h(normal(static_cast<std::size_t>(tokens) * hidden, rng)), rw(route),
          x(normal(static_cast<std::size_t>(tokens) * hidden, rng)),
          act(std::vector<float>(static_cast<std::size_t>(experts) * tokens * width));
      kernels::MoeExpertsArgs a{h.dev(),
                                rw.dev(),
                                table.dev(),
                                table.dev() + experts,
                                table.dev() + 2 * experts,
                                bf16,
                                act.dev(),
                                x.dev(),
                                tokens,
                                experts,
                                hidden,
                                width};
      EXPECT_EQ(kernels::moe_experts_use_tensor_cores(a), bf16 && hidden % 32 == 0);
      const std::size_t workspace_bytes = kernels::moe_experts_workspace_bytes(a);
      EXPECT_EQ(workspace_bytes > 0, kernels::moe_experts_use_tensor_cores(a));
      auto workspace = Buffer<std::uint8_t>::device(std::max<std::size_t>(workspace_bytes, 1),
                                                    Backend::cuda, "moe workspace");
      a.workspace = workspace.device_data();
      a.workspace_bytes = workspace_bytes;
      const std::vector<float> x_before(x.host(),
                                        x.host() + static_cast<std::size_t>(tokens) * hidden);
      kernels::launch_moe_experts(a, s());
      const auto got_x = x.fetch(), got_act = act.fetch();
      a = {h.host(),
           rw.host(),
           host_table.data(),
           host_table.data() + experts,
           host_table.data() + 2 * experts,
           bf16,
           act.host(),
           x.host(),
           tokens,
           experts,
           hidden,
           width};
      kernels::moe_experts_ref(a);
      // bf16: the activation is rounded to bf16 before the down projection, and a different
      // summation order can move it to the neighbouring bf16 value (2^-8 of that activation;
      // on an H100 1.2e-4 to 3.1e-4 of the output's scale at 40-64 tokens, where many such
      // flips add up); a wrong expert, token or weight would be off by O(1). So the down
      // projection and combine are also checked exactly against the GPU's own activations.
      EXPECT_LT(scaled_error(got_x, std::vector<float>(x.host(), x.host() + got_x.size())),
                bf16 ? 1e-3 : 1e-5);
      std::vector<float> from_act = x_before;
      for (int t = 0; t < tokens; ++t) {
        std::vector<float> sum(static_cast<std::size_t>(hidden), 0.0f),
            v(static_cast<std::size_t>(width));
        for (int e = 0; e < experts; ++e) {
          const float rt = route[static_cast<std::size_t>(t * experts + e)];
          if (rt == 0.0f) continue;
          const float* got = got_act.data() + (static_cast<std::size_t>(e) * tokens + t) * width;
          for (int k = 0; k < width; ++k)
            v[static_cast<std::size_t>(k)] = bf16 ? bf16_to_float(float_to_bf16(got[k])) : got[k];
          const float* down = wf[static_cast<std::size_t>(3 * e + 2)].host();  // bf16 values
          for (int n = 0; n < hidden; ++n) {
            double d = 0;
            for (int k = 0; k < width; ++k)
              d += static_cast<double>(down[static_cast<std::size_t>(n) * width + k]) *
                   v[static_cast<std::size_t>(k)];
            sum[static_cast<std::size_t>(n)] += rt * static_cast<float>(d);
          }
        }
        for (int n = 0; n < hidden; ++n)
          from_act[static_cast<std::size_t>(t) * hidden + n] += sum[static_cast<std::size_t>(n)];
      }
      EXPECT_LT(scaled_error(got_x, from_act), 1e-5) << "down projection and combine";
      for (int t = 0; t < tokens; ++t)
        for (int e = 0; e < experts; ++e) {
          if (route[static_cast<std::size_t>(t * experts + e)] == 0.0f) continue;
          ASSERT_NE(e, 4);  // never chosen
          const std::size_t row = (static_cast<std::size_t>(e) * tokens + t) * width;
          const std::vector<float> got(got_act.begin() + static_cast<std::ptrdiff_t>(row),
                                       got_act.begin() + static_cast<std::ptrdiff_t>(row + width));
          EXPECT_LT(
              scaled_error(got, std::vector<float>(act.host() + row, act.host() + row + width)),
              1e-5)
              << "token " << t << " expert " << e;
        }
    }
  kernels::MoeExpertsArgs too_many;
  too_many.tokens = kernels::kMoeExpertsMaxTokens + 1;
  too_many.experts = 1;
  EXPECT_THROW(kernels::launch_moe_experts(too_many, s()), Error);
  kernels::MoeExpertsArgs no_workspace;
  no_workspace.bf16 = true;
  no_workspace.tokens = no_workspace.experts = 1;
  no_workspace.hidden = no_workspace.width = 64;
  EXPECT_NE(test::error_message([&] {
              kernels::launch_moe_experts(no_workspace, s());
            }).find("moe_experts_workspace_bytes"),
            std::string::npos);
}

#else
TEST(DecodeTensorCoreGpu, NeedsACudaBuild) {
  GTEST_SKIP() << "GPU test skipped: this build has no CUDA backend";
}
#endif

}  // namespace
}  // namespace hisparse
