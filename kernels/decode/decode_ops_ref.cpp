#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

#include "core/dtypes.hpp"
#include "kernels/decode/decode_ops.hpp"

namespace hisparse::kernels {
namespace {
[[nodiscard]] std::size_t zu(std::int64_t v) {
  return static_cast<std::size_t>(v);
}
}  // namespace

void gather_rows_ref(const GatherRowsArgs& a) {
  for (int r = 0; r < a.rows; ++r)
    std::copy_n(a.table + zu(a.ids[r]) * zu(a.width), a.width, a.out + zu(r) * zu(a.width));
}

void blend_queries_ref(const BlendQueriesArgs& a) {
  for (int r = 0; r < a.rows; ++r) {
    const float* wl = a.workload + zu(r) * zu(a.n);
    float* q = a.q + zu(r) * zu(a.n);
    double wl_sq = 0, q_sq = 0;
    for (int i = 0; i < a.n; ++i) {
      wl_sq += static_cast<double>(wl[i]) * wl[i];
      q_sq += static_cast<double>(q[i]) * q[i];
    }
    const float gain =
        a.share == 0.0f || q_sq <= 0 ? 0.0f : static_cast<float>(a.share * std::sqrt(wl_sq / q_sq));
    for (int i = 0; i < a.n; ++i) q[i] = gain == 0.0f ? wl[i] : wl[i] + gain * q[i];
  }
}

void mla_absorb_ref(const MlaAbsorbArgs& a) {
  const int qk = a.nope + a.rope, row = a.lora + a.rope;
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.heads; ++h) {
      const float* qn = a.q + (zu(b) * zu(a.heads) + zu(h)) * zu(qk);
      float* out = a.out + (zu(b) * zu(a.heads) + zu(h)) * zu(row);
      std::fill(out, out + a.lora, 0.0f);
      for (int n = 0; n < a.nope; ++n) {
        const float* uk = a.kv_b + (zu(h) * zu(a.nope + a.v_dim) + zu(n)) * zu(a.lora);
        for (int c = 0; c < a.lora; ++c) out[c] += qn[n] * uk[c];
      }
      std::copy_n(qn + a.nope, a.rope, out + a.lora);
    }
}

bool mla_projections_use_tensor_cores(int nope, int rope, int lora, int v_dim) {
  // Depths (nope for the absorb, lora for the up-projection) in pieces of 32, output rows (lora,
  // v_dim) in tiles of 16, and 16-byte loads of each query's nope part.
  return nope > 0 && lora > 0 && v_dim > 0 && rope >= 0 && nope % 32 == 0 && lora % 32 == 0 &&
         v_dim % 16 == 0 && (nope + rope) % 4 == 0;
}

void mla_transpose_uk_ref(const float* kv_b, int heads, int nope, int lora, int v_dim, float* out) {
  for (int h = 0; h < heads; ++h)
    for (int n = 0; n < nope; ++n) {
      const float* uk = kv_b + (zu(h) * zu(nope + v_dim) + zu(n)) * zu(lora);
      for (int c = 0; c < lora; ++c) out[(zu(h) * zu(lora) + zu(c)) * zu(nope) + zu(n)] = uk[c];
    }
}

void mla_up_project_ref(const MlaUpProjectArgs& a) {
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.heads; ++h) {
      const float* lat = a.latent + (zu(b) * zu(a.heads) + zu(h)) * zu(a.lora);
      for (int j = 0; j < a.v_dim; ++j) {
        const float* uv = a.kv_b + (zu(h) * zu(a.nope + a.v_dim) + zu(a.nope + j)) * zu(a.lora);
        float acc = 0.0f;
        for (int c = 0; c < a.lora; ++c) acc += lat[c] * uv[c];
        a.out[(zu(b) * zu(a.heads) + zu(h)) * zu(a.v_dim) + zu(j)] = acc;
      }
    }
}

void moe_route_ref(const MoeRouteArgs& a) {
  std::vector<int> order(zu(a.experts));
  for (int t = 0; t < a.tokens; ++t) {
    const float* lg = a.logits + zu(t) * zu(a.experts);
    float* w = a.weights + zu(t) * zu(a.experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return lg[x] > lg[y]; });
    const int active = std::min(a.active, a.experts);
    float mx = -INFINITY, denom = 0.0f;
    for (int i = 0; i < active; ++i) mx = std::max(mx, lg[order[zu(i)]]);
    for (int i = 0; i < active; ++i) denom += std::exp(lg[order[zu(i)]] - mx);
    std::fill(w, w + a.experts, 0.0f);
    for (int i = 0; i < active; ++i) w[order[zu(i)]] = std::exp(lg[order[zu(i)]] - mx) / denom;
  }
}

void scale_rows_ref(const ScaleRowsArgs& a) {
  const int ldx = a.ldx ? a.ldx : a.width;
  for (int r = 0; r < a.rows; ++r)
    for (int c = 0; c < a.width; ++c)
      a.x[zu(r) * zu(ldx) + zu(c)] *= a.factors[zu(r) * zu(a.factor_stride)];
}

void add_bias_ref(const AddBiasArgs& a) {
  for (int r = 0; r < a.rows; ++r)
    for (int c = 0; c < a.width; ++c) a.x[zu(r) * zu(a.width) + zu(c)] += a.bias[c];
}

void store_bf16_rows_ref(const StoreBf16RowsArgs& a) {
  const int src_stride = a.src_stride ? a.src_stride : a.width;
  for (int r = 0; r < a.rows; ++r)
    for (int c = 0; c < a.width; ++c) {
      float& v = a.src[zu(r) * zu(src_stride) + zu(c)];
      const std::uint16_t h = float_to_bf16(v);
      v = bf16_to_float(h);
      a.dst[store_row_offset(a, r) + c] = h;
    }
}

void append_rows_ref(const AppendRowsArgs& a) {
  for (int r = 0; r < a.rows; ++r) {
    const std::uint8_t* src = a.src + zu(r) * zu(a.bytes);
    std::copy_n(src, a.bytes, append_pool_row(a, r));
    std::copy_n(src, a.bytes, append_hot_row(a, r));
  }
}

void mark_non_finite_ref(const MarkNonFiniteArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i)
    if (!std::isfinite(a.x[i])) {
      *a.first_site = std::min(*a.first_site, a.site);
      return;
    }
}

void indexer_head_weights_ref(const IndexerHeadWeightsArgs& a) {
  for (int i = 0; i < a.rows * a.heads; ++i)
    a.w[i] = (1.0f + a.share * std::tanh(a.w[i])) / static_cast<float>(a.heads);
}

void argmax_ref(const ArgmaxArgs& a) {
  for (int r = 0; r < a.rows; ++r) {
    const float* row = a.x + zu(r) * zu(a.n);
    a.out[r] = static_cast<std::int32_t>(std::max_element(row, row + a.n) - row);
  }
}

void slots_from_physical_ref(const SlotsFromPhysicalArgs& a) {
  for (int r = 0; r < a.rows; ++r)
    for (int i = 0; i < a.width; ++i) {
      const std::size_t at = zu(r) * zu(a.width) + zu(i);
      a.slots[at] = a.physical[at] < 0 ? -1 : a.physical[at] - r * (a.hot + 1);
    }
}

}  // namespace hisparse::kernels
