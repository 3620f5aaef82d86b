// The host side of the MLA decode attention: which arguments it takes, its splits, its workspace.
#include <algorithm>
#include <cstdint>

#include "kernels/attention/mla_decode_attention.hpp"

namespace hisparse::kernels {

bool mla_decode_attention_supports(const DecodeAttentionArgs& a) {
  const int k_stride = a.k_row_stride ? a.k_row_stride : a.qk_dim;
  const int v_stride = a.v_row_stride ? a.v_row_stride : a.v_dim;
  return a.kv_heads == 1 && a.index_groups == 1 && a.k_bf16 != nullptr && a.v_bf16 == a.k_bf16 &&
         v_stride == k_stride && a.qk_dim > 0 && a.qk_dim % 8 == 0 &&
         a.qk_dim <= kMlaDecodeMaxQkDim && a.v_dim > 0 && a.v_dim % 16 == 0 &&
         a.v_dim <= kMlaDecodeMaxVDim && a.v_dim <= a.qk_dim && k_stride % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(a.k_bf16) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(a.q) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(a.out) % 16 == 0;
}

int mla_decode_max_splits(int batch, int q_heads, int multiprocessors) {
  const std::int64_t groups =
      (std::max(q_heads, 1) + kMlaDecodeHeadsPerCta - 1) / kMlaDecodeHeadsPerCta;
  const std::int64_t ctas = std::max<std::int64_t>(1, std::int64_t{batch} * groups);
  return static_cast<int>(std::max<std::int64_t>(1, multiprocessors / ctas));
}

MlaDecodePlan plan_mla_decode_attention(int batch, int q_heads, std::int64_t max_rows,
                                        int multiprocessors) {
  const std::int64_t tiles =
      std::max<std::int64_t>(1, (max_rows + kMlaDecodeTileRows - 1) / kMlaDecodeTileRows);
  const std::int64_t want =
      std::min<std::int64_t>(mla_decode_max_splits(batch, q_heads, multiprocessors), tiles);
  const std::int64_t tiles_per_split = (tiles + want - 1) / want;
  MlaDecodePlan plan;
  plan.rows_per_split = static_cast<int>(tiles_per_split * kMlaDecodeTileRows);
  plan.splits = static_cast<int>((tiles + tiles_per_split - 1) / tiles_per_split);
  return plan;
}

std::size_t mla_decode_workspace_floats(int batch, int q_heads, int v_dim, int splits) {
  return static_cast<std::size_t>(std::max(batch, 0)) *
         static_cast<std::size_t>(std::max(q_heads, 0)) *
         static_cast<std::size_t>(std::max(splits, 0)) *
         (static_cast<std::size_t>(std::max(v_dim, 0)) + 2);
}

}  // namespace hisparse::kernels
