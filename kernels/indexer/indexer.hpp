// DSA lightning indexer: scores every cached token of a request for the new query,
//   score[t] = scale[t] * sum_h w[h] * relu(q[h] . key[t])
// where key[t] is the fp8 e4m3 index key of token t and scale[t] its fp32 dequantisation scale
// (128 fp8 + 4 B = 132 B per token at head_dim 128). Tokens t >= seq_len score -infinity, so a
// top-k over the whole row never picks them.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/config.hpp"
#include "core/dtypes.hpp"
#include "core/stream.hpp"

namespace hisparse::kernels {

struct IndexerArgs {
  const float* q = nullptr;                ///< [batch x heads x dim]
  const float* weights = nullptr;          ///< [batch x heads] per-head weights w[h]
  const std::uint8_t* keys = nullptr;      ///< [batch x capacity x dim] fp8 e4m3
  const float* key_scales = nullptr;       ///< [batch x capacity]
  const std::int64_t* seq_lens = nullptr;  ///< [batch]
  float* scores = nullptr;                 ///< [batch x capacity]
  int batch = 0;
  int heads = 0;
  int dim = 0;
  std::int64_t capacity = 0;
};

/// At most this many heads take the indexer's tensor-core kernel.
inline constexpr int kIndexerMmaMaxHeads = 64;

/// Whether launch_indexer scores this shape on tensor cores (16-byte aligned keys and queries):
/// dim a multiple of 64, heads a multiple of 8 up to kIndexerMmaMaxHeads. Those scores match the
/// twin within float rounding (queries split in two bf16 parts), the CUDA-core kernels' within
/// the twin's own channel order.
[[nodiscard]] constexpr bool indexer_uses_tensor_cores(int heads, int dim) {
  return dim > 0 && dim % 64 == 0 && heads > 0 && heads % 8 == 0 && heads <= kIndexerMmaMaxHeads;
}

#if HISPARSE_WITH_CUDA
void launch_indexer(const IndexerArgs& args, cudaStream_t stream);
#endif
void indexer_ref(const IndexerArgs& args);

/// Quantises one index key to fp8 e4m3 with one scale: scale = absmax / 448 (1 for a zero key),
/// code[i] = fp8(key[i] / scale).
HISPARSE_HD void quantize_index_key(const float* key, int dim, std::uint8_t* codes, float* scale) {
  float absmax = 0.0f;
  for (int i = 0; i < dim; ++i) absmax = fmaxf(absmax, fabsf(key[i]));
  const float s = absmax > 0.0f ? absmax / 448.0f : 1.0f;
  for (int i = 0; i < dim; ++i) codes[i] = float_to_fp8e4m3(key[i] / s);
  *scale = s;
}

/// The new index keys of a step, one per request: key r (at keys + r * key_stride, dim floats)
/// quantised into row r * dest_row_stride + dest_offset of `codes` / `scales` (the cache row of
/// the new token: request r's rows start at r * capacity, the token sits at its position).
struct QuantizeIndexKeysArgs {
  const float* keys = nullptr;
  std::uint8_t* codes = nullptr;  ///< [.. x dim] fp8 e4m3
  float* scales = nullptr;        ///< [..]
  int rows = 0;
  int dim = 0;
  int key_stride = 0;
  std::int64_t dest_row_stride = 0;
  std::int64_t dest_offset = 0;
  /// Optional, in place of dest_offset (a step replayed from a CUDA graph reads its positions when
  /// it runs): row r's key goes to row dest_positions[r] of its request (device memory on CUDA).
  const std::int64_t* dest_positions = nullptr;
};
/// The destination row of QuantizeIndexKeysArgs key r.
HISPARSE_HD std::int64_t quantize_dest_row(const QuantizeIndexKeysArgs& a, int r) {
  return static_cast<std::int64_t>(r) * a.dest_row_stride +
         (a.dest_positions ? a.dest_positions[r] : a.dest_offset);
}
#if HISPARSE_WITH_CUDA
void launch_quantize_index_keys(const QuantizeIndexKeysArgs& args, cudaStream_t stream);
#endif
void quantize_index_keys_ref(const QuantizeIndexKeysArgs& args);

}  // namespace hisparse::kernels
