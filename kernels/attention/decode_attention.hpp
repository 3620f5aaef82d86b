// Decode attention of one new query token per request over rows of a KV cache, dense or sparse.
//
// Rows: the key of row r of (request b, KV head g) starts at
//   k + ((b * kv_heads + g) * capacity + r) * k_row_stride
// and its value likewise in v with v_row_stride. The same contract covers
//  - GQA: K and V caches per KV head, qk_dim = v_dim = head_dim, q_heads / kv_heads query heads
//    share a KV head;
//  - absorbed MLA: one "KV head" whose row is [latent c (kv_lora) | rope key], q = [W_uk^T q_nope |
//    q_rope] per query head, v == k with v_dim = kv_lora (the output is the attended latent);
//  - HiSparse: rows are hot-buffer slots and `indices` the slot each selected entry resolved to.
// Selection: indices == nullptr attends to rows 0 .. seq_lens[b]-1 in order (dense). Otherwise
// `indices` [batch x index_groups x top_k] lists row numbers, -1 = none (skipped); index_groups is
// 1 (one selection shared by all heads, DSA) or kv_heads (one per KV head, GQA exact top-k).
// Rows are floats (k, v) or bf16 (k_bf16, v_bf16: read exactly as their float values).
// Math: softmax(scale * q.k) over the rows taken in the listed order, fp32, max-subtracted; the
// output of a head with no row is zero. Deterministic: one sequential pass per head.
#pragma once

#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

struct DecodeAttentionArgs {
  const float* q = nullptr;  ///< [batch x q_heads x qk_dim]
  const float* k = nullptr;  ///< rows, see above
  const float* v = nullptr;  ///< rows, see above (may alias k)
  /// bf16 rows instead of k / v (the engines' storage of bf16 KV layouts); strides in elements
  const std::uint16_t* k_bf16 = nullptr;
  const std::uint16_t* v_bf16 = nullptr;
  const std::int32_t* indices = nullptr;   ///< [batch x index_groups x top_k] or nullptr (dense)
  const std::int64_t* seq_lens = nullptr;  ///< [batch], rows valid per request (dense mode)
  float* out = nullptr;                    ///< [batch x q_heads x v_dim]
  int batch = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int qk_dim = 0;
  int v_dim = 0;
  std::int64_t capacity = 0;  ///< rows per (request, KV head)
  int k_row_stride = 0;       ///< floats; 0: qk_dim
  int v_row_stride = 0;       ///< floats; 0: v_dim
  int top_k = 0;              ///< entries per selection (sparse)
  int index_groups = 1;       ///< 1 or kv_heads
  float scale = 1.0f;         ///< softmax scale, usually 1/sqrt(qk_dim)
};

/// Exact selection scores of the sparse-gpu baseline on GQA models: for each (request, KV head)
/// and row t < seq_len, the attention probability of t summed over the query heads of the group,
///   mass[b][g][t] = sum_{h in g} softmax_t(scale * q_h . k_t);
/// rows t >= seq_len get -infinity (never selected). Keys as in DecodeAttentionArgs.
struct GroupAttentionMassArgs {
  const float* q = nullptr;                ///< [batch x q_heads x qk_dim]
  const float* k = nullptr;                ///< rows
  const std::uint16_t* k_bf16 = nullptr;   ///< bf16 rows instead of k
  const std::int64_t* seq_lens = nullptr;  ///< [batch]
  float* mass = nullptr;                   ///< [batch x kv_heads x capacity]
  int batch = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int qk_dim = 0;
  std::int64_t capacity = 0;
  int k_row_stride = 0;  ///< 0: qk_dim
  float scale = 1.0f;
};

#if HISPARSE_WITH_CUDA
void launch_decode_attention(const DecodeAttentionArgs& args, cudaStream_t stream);
#endif
void decode_attention_ref(const DecodeAttentionArgs& args);
#if HISPARSE_WITH_CUDA
void launch_group_attention_mass(const GroupAttentionMassArgs& args, cudaStream_t stream);
#endif
void group_attention_mass_ref(const GroupAttentionMassArgs& args);

}  // namespace hisparse::kernels
