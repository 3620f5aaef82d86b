#include "kernels/indexer/indexer.hpp"

#include <cstddef>
#include <limits>
#include <vector>

namespace hisparse::kernels {

void indexer_ref(const IndexerArgs& a) {
  std::vector<float> key(static_cast<std::size_t>(a.dim));
  for (int b = 0; b < a.batch; ++b) {
    const float* q = a.q + static_cast<std::ptrdiff_t>(b) * a.heads * a.dim;
    const float* w = a.weights + static_cast<std::ptrdiff_t>(b) * a.heads;
    float* scores = a.scores + static_cast<std::ptrdiff_t>(b) * a.capacity;
    const std::int64_t n = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
    for (std::int64_t t = 0; t < n; ++t) {
      const std::uint8_t* codes =
          a.keys + (static_cast<std::ptrdiff_t>(b) * a.capacity + t) * a.dim;
      for (int i = 0; i < a.dim; ++i) key[static_cast<std::size_t>(i)] = fp8e4m3_to_float(codes[i]);
      float acc = 0.0f;
      for (int h = 0; h < a.heads; ++h) {
        float dot = 0.0f;
        for (int i = 0; i < a.dim; ++i) dot += q[h * a.dim + i] * key[static_cast<std::size_t>(i)];
        acc += w[h] * (dot > 0.0f ? dot : 0.0f);
      }
      scores[t] = acc * a.key_scales[static_cast<std::ptrdiff_t>(b) * a.capacity + t];
    }
    for (std::int64_t t = n; t < a.capacity; ++t)
      scores[t] = -std::numeric_limits<float>::infinity();
  }
}

void quantize_index_keys_ref(const QuantizeIndexKeysArgs& a) {
  for (int r = 0; r < a.rows; ++r) {
    const std::int64_t at = quantize_dest_row(a, r);
    quantize_index_key(a.keys + static_cast<std::ptrdiff_t>(r) * a.key_stride, a.dim,
                       a.codes + at * a.dim, a.scales + at);
  }
}

}  // namespace hisparse::kernels
