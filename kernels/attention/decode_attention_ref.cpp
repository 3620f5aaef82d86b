#include "kernels/attention/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "core/dtypes.hpp"

namespace hisparse::kernels {
namespace {

float element(const float* p, std::ptrdiff_t i) {
  return p[i];
}
float element(const std::uint16_t* p, std::ptrdiff_t i) {
  return bf16_to_float(p[i]);
}

template <class Row>
void attention(const DecodeAttentionArgs& a, const Row* k, const Row* v) {
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : a.qk_dim;
  const std::ptrdiff_t v_stride = a.v_row_stride ? a.v_row_stride : a.v_dim;
  const int group = a.q_heads / a.kv_heads;
  std::vector<std::int64_t> rows;
  std::vector<float> logits;
  for (int b = 0; b < a.batch; ++b) {
    for (int h = 0; h < a.q_heads; ++h) {
      const int g = h / group;
      // The rows this head reads, in order.
      rows.clear();
      if (a.indices == nullptr) {
        const std::int64_t n = std::min(a.seq_lens[b], a.capacity);
        for (std::int64_t r = 0; r < n; ++r) rows.push_back(r);
      } else {
        const int sel = a.index_groups == 1 ? 0 : g;
        const std::int32_t* idx =
            a.indices + (static_cast<std::ptrdiff_t>(b) * a.index_groups + sel) * a.top_k;
        for (int i = 0; i < a.top_k; ++i)
          if (idx[i] >= 0 && idx[i] < a.capacity) rows.push_back(idx[i]);
      }
      const float* q = a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.qk_dim;
      const std::ptrdiff_t base = (static_cast<std::ptrdiff_t>(b) * a.kv_heads + g) * a.capacity;
      float* out = a.out + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.v_dim;
      std::fill(out, out + a.v_dim, 0.0f);
      if (rows.empty()) continue;
      logits.resize(rows.size());
      float max_logit = -std::numeric_limits<float>::infinity();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row* key = k + (base + rows[i]) * k_stride;
        float dot = 0.0f;
        for (int c = 0; c < a.qk_dim; ++c) dot += q[c] * element(key, c);
        logits[i] = dot * a.scale;
        max_logit = std::max(max_logit, logits[i]);
      }
      float denom = 0.0f;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const float p = std::exp(logits[i] - max_logit);
        denom += p;
        const Row* value = v + (base + rows[i]) * v_stride;
        for (int c = 0; c < a.v_dim; ++c) out[c] += p * element(value, c);
      }
      const float inv = 1.0f / denom;
      for (int c = 0; c < a.v_dim; ++c) out[c] *= inv;
    }
  }
}

template <class Row>
void group_mass(const GroupAttentionMassArgs& a, const Row* k) {
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : a.qk_dim;
  const int group = a.q_heads / a.kv_heads;
  std::vector<float> logits;
  for (int b = 0; b < a.batch; ++b) {
    const std::int64_t n = std::min(a.seq_lens[b], a.capacity);
    logits.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
    for (int g = 0; g < a.kv_heads; ++g) {
      const std::ptrdiff_t base = (static_cast<std::ptrdiff_t>(b) * a.kv_heads + g) * a.capacity;
      float* mass = a.mass + base;
      std::fill(mass, mass + n, 0.0f);
      std::fill(mass + n, mass + a.capacity, -std::numeric_limits<float>::infinity());
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const float* q = a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.qk_dim;
        float max_logit = -std::numeric_limits<float>::infinity();
        for (std::int64_t t = 0; t < n; ++t) {
          const Row* key = k + (base + t) * k_stride;
          float dot = 0.0f;
          for (int c = 0; c < a.qk_dim; ++c) dot += q[c] * element(key, c);
          logits[static_cast<std::size_t>(t)] = dot * a.scale;
          max_logit = std::max(max_logit, logits[static_cast<std::size_t>(t)]);
        }
        float denom = 0.0f;
        for (float& v : logits) denom += (v = std::exp(v - max_logit));
        for (std::int64_t t = 0; t < n; ++t) mass[t] += logits[static_cast<std::size_t>(t)] / denom;
      }
    }
  }
}

}  // namespace

void decode_attention_ref(const DecodeAttentionArgs& a) {
  if (a.k_bf16 != nullptr)
    attention(a, a.k_bf16, a.v_bf16);
  else
    attention(a, a.k, a.v);
}

void group_attention_mass_ref(const GroupAttentionMassArgs& a) {
  if (a.k_bf16 != nullptr)
    group_mass(a, a.k_bf16);
  else
    group_mass(a, a.k);
}

}  // namespace hisparse::kernels
