// Quality of a sparse step against the dense one, on the same layer inputs: how many of each query
// head's exact top-k tokens the selection kept (recall), and how far the attention output moved
// (relative L2 error). Pure functions over host rows in the DecodeAttentionArgs row convention.
#pragma once

#include <cstdint>

#include "core/metrics.hpp"  // mean_relative_l2_error, the error half of the quality

namespace hisparse {

/// Rows: the key of token t of (request b, KV head g) starts at
/// k + ((b * kv_heads + g) * capacity + t) * k_row_stride.
struct SelectionRecallArgs {
  const float* q = nullptr;  ///< [batch][q_heads][dim]
  const float* k = nullptr;
  int batch = 0;
  int q_heads = 0;
  int kv_heads = 1;
  int dim = 0;
  std::int64_t capacity = 0;
  int k_row_stride = 0;                    ///< floats; 0: dim
  std::int64_t seq_len = 0;                ///< tokens 0 .. seq_len-1 are candidates
  const std::int32_t* selected = nullptr;  ///< [batch][groups][width] positions, -1 none
  int groups = 1;                          ///< 1 (one selection per request) or kv_heads
  int width = 0;
  int top_k = 0;  ///< size of the exact set (capped at seq_len)
};

/// The positions of the k largest of scores[0 .. n) into out[0 .. k): kernels::topk_ref on one row
/// (increasing positions, ties to the lower one, -1 for each missing entry when n < k).
void top_k_positions(const float* scores, std::int64_t n, int k, std::int32_t* out);

/// Mean over (request, query head) of |S ∩ E_h| / |E_h|, where E_h is the head's exact top-k by
/// the logit q_h . k_t (ties to the lower position, as kernels::topk_ref) and S the selection of
/// the head's group. A selection larger than top_k is not penalised.
[[nodiscard]] double selection_recall(const SelectionRecallArgs& args);

}  // namespace hisparse
