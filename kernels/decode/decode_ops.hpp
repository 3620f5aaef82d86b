// The small steps of a decode step that are not a GEMM, a norm or attention: the embedding gather,
// mixing a workload's queries with the model's, MLA's per-head absorption and up-projection, the
// MoE router's choice, row scaling, bias, the greedy argmax, the hot-buffer slot numbering, the
// HiSparse append and the non-finite check of --verify.
// Each has a CPU twin (the DecodeEngine's CPU arithmetic) and a CUDA launcher; all pointers are
// device memory on CUDA.
#pragma once

#include <cstdint>

#include "core/config.hpp"
#include "core/stream.hpp"

namespace hisparse::kernels {

/// out[r] = table[ids[r]] (width floats per row): the embedding lookup.
struct GatherRowsArgs {
  const float* table = nullptr;
  const std::int32_t* ids = nullptr;
  float* out = nullptr;
  int rows = 0;
  int width = 0;
};

/// Per row of n floats: q = workload + gain * q, gain = share * rms(workload) / rms(q) (sums in
/// double); q = workload where share is 0 or q is all zeros. The synthetic workload sets the
/// selection's structure, the model makes the output depend on the weights.
struct BlendQueriesArgs {
  const float* workload = nullptr;  ///< [rows x n]
  float* q = nullptr;               ///< [rows x n], in place
  int rows = 0;
  int n = 0;
  float share = 0.0f;
};

/// MLA, absorbed: per request b and head h, out[b][h] = [W_uk[h]^T q_nope | q_rope] where
/// W_uk[h] is rows h * (nope + v_dim) .. + nope of kv_b ([heads * (nope + v_dim)] x lora).
/// With `uk_t_bf16` (and mla_projections_use_tensor_cores) the CUDA launcher takes tensor cores
/// and reads no `kv_b`: the same values in bf16, W_uk[h] transposed (mla_transpose_uk_ref).
struct MlaAbsorbArgs {
  const float* q = nullptr;     ///< [batch x heads x (nope + rope)]
  const float* kv_b = nullptr;  ///< [heads * (nope + v_dim) x lora]
  float* out = nullptr;         ///< [batch x heads x (lora + rope)]
  int batch = 0;
  int heads = 0;
  int nope = 0;
  int rope = 0;
  int lora = 0;
  int v_dim = 0;
  const std::uint16_t* uk_t_bf16 = nullptr;  ///< optional [heads x lora x nope]
};

/// MLA: per request b and head h, out[b][h][j] = W_uv[h][j] . latent[b][h] where W_uv[h] is rows
/// h * (nope + v_dim) + nope .. + v_dim of kv_b. With `kv_b_bf16` (kv_b's values in bf16, and
/// mla_projections_use_tensor_cores) the CUDA launcher takes tensor cores and reads no `kv_b`.
struct MlaUpProjectArgs {
  const float* latent = nullptr;  ///< [batch x heads x lora]
  const float* kv_b = nullptr;
  float* out = nullptr;  ///< [batch x heads x v_dim]
  int batch = 0;
  int heads = 0;
  int nope = 0;
  int lora = 0;
  int v_dim = 0;
  const std::uint16_t* kv_b_bf16 = nullptr;  ///< optional, kv_b's values in bf16
};

/// MoE router of one rank: per token, the `active` experts of largest logit (ties: lower expert)
/// and their softmax weights; weights[t][e] is 0 for an expert not chosen.
struct MoeRouteArgs {
  const float* logits = nullptr;  ///< [tokens x experts]
  float* weights = nullptr;       ///< [tokens x experts]
  int tokens = 0;
  int experts = 0;
  int active = 0;
};

/// x[r][c] *= factors[r * factor_stride] for c < width (row stride ldx).
struct ScaleRowsArgs {
  float* x = nullptr;
  const float* factors = nullptr;
  int rows = 0;
  int width = 0;
  int ldx = 0;  ///< 0: width
  int factor_stride = 1;
};

/// x[r][c] += bias[c].
struct AddBiasArgs {
  float* x = nullptr;
  const float* bias = nullptr;
  int rows = 0;
  int width = 0;
};

/// DSA head weights from the model's projection: w = (1 + share * tanh(w)) / heads, in place.
struct IndexerHeadWeightsArgs {
  float* w = nullptr;  ///< [rows x heads]
  int rows = 0;
  int heads = 0;
  float share = 0.0f;
};

/// Greedy decoding: out[r] = the index of row r's largest value (ties: the lower index).
struct ArgmaxArgs {
  const float* x = nullptr;  ///< [rows x n]
  std::int32_t* out = nullptr;
  int rows = 0;
  int n = 0;
};

/// Hot-buffer slots from the swap-in's physical rows: slot = physical - r * (hot + 1), -1 kept.
struct SlotsFromPhysicalArgs {
  const std::int32_t* physical = nullptr;  ///< [rows x width]
  std::int32_t* slots = nullptr;           ///< [rows x width]
  int rows = 0;
  int width = 0;
  int hot = 0;
};

/// New KV rows into a bf16 cache: src[r][c] rounded to bf16 in place (so later readers of src see
/// what the cache holds) and written to dst[r * dst_stride + c].
struct StoreBf16RowsArgs {
  float* src = nullptr;          ///< [rows x width], row stride src_stride
  std::uint16_t* dst = nullptr;  ///< bf16 rows
  int rows = 0;
  int width = 0;
  int src_stride = 0;           ///< 0: width
  std::int64_t dst_stride = 0;  ///< elements between dst rows (0: width)
  /// Optional (a step replayed from a CUDA graph reads its position when it runs): row r goes
  /// dst_positions[r] rows of `width` further (device memory on CUDA).
  const std::int64_t* dst_positions = nullptr;
};
/// Element offset of row r's first value in StoreBf16RowsArgs::dst.
HISPARSE_HD std::int64_t store_row_offset(const StoreBf16RowsArgs& a, int r) {
  const std::int64_t stride = a.dst_stride ? a.dst_stride : a.width;
  const std::int64_t at = static_cast<std::int64_t>(r) * stride;
  return a.dst_positions ? at + a.dst_positions[r] * a.width : at;
}

/// The HiSparse append: the newest KV row of every stream into the host pool and into the hot
/// buffer's newest-token slot at once, src row r to pool + r * pool_stride and to
/// hot + r * hot_stride (`bytes` each). On CUDA the pool address is the mapped pinned memory's
/// device address, so one launch replaces two copies per stream.
struct AppendRowsArgs {
  const std::uint8_t* src = nullptr;  ///< [rows][bytes]
  std::uint8_t* pool = nullptr;
  std::size_t pool_stride = 0;
  std::uint8_t* hot = nullptr;
  std::size_t hot_stride = 0;
  int rows = 0;
  int bytes = 0;
  /// Optional (a step replayed from a CUDA graph): the new token's position per row, read when
  /// the kernel runs; pool and hot then address the row's token 0 and slot 0, and the row goes
  /// positions[r] pool rows of pool_row_stride further and into slot min(positions[r],
  /// newest_slot_max) (HotBuffer::newest_slot), slots hot_slot_stride bytes apart.
  const std::int64_t* positions = nullptr;
  std::size_t pool_row_stride = 0;
  std::size_t hot_slot_stride = 0;
  std::int64_t newest_slot_max = 0;
};
/// Where AppendRowsArgs row r goes in the pool and in the hot buffer.
HISPARSE_HD std::uint8_t* append_pool_row(const AppendRowsArgs& a, int r) {
  std::uint8_t* at = a.pool + static_cast<std::size_t>(r) * a.pool_stride;
  return a.positions ? at + static_cast<std::size_t>(a.positions[r]) * a.pool_row_stride : at;
}
HISPARSE_HD std::uint8_t* append_hot_row(const AppendRowsArgs& a, int r) {
  std::uint8_t* at = a.hot + static_cast<std::size_t>(r) * a.hot_stride;
  if (!a.positions) return at;
  const std::int64_t slot = a.positions[r] < a.newest_slot_max ? a.positions[r] : a.newest_slot_max;
  return at + static_cast<std::size_t>(slot) * a.hot_slot_stride;
}

/// Numerical health: *first_site = min(*first_site, site) when any of the n floats of x is NaN or
/// Inf. A step numbers its check points in order, so the smallest marked site is where a
/// non-finite value first appeared; *first_site starts at INT_MAX.
struct MarkNonFiniteArgs {
  const float* x = nullptr;
  std::int64_t n = 0;
  int site = 0;
  int* first_site = nullptr;  ///< one int
};

/// Whether the absorbed MLA projections of this shape take tensor cores when given bf16 weights.
[[nodiscard]] bool mla_projections_use_tensor_cores(int nope, int rope, int lora, int v_dim);

/// W_uk transposed per head, as MlaAbsorbArgs::uk_t_bf16 holds it: out[h][c][n] =
/// kv_b[h * (nope + v_dim) + n][c] for c < lora, n < nope.
void mla_transpose_uk_ref(const float* kv_b, int heads, int nope, int lora, int v_dim, float* out);

#if HISPARSE_WITH_CUDA
void launch_gather_rows(const GatherRowsArgs& args, cudaStream_t stream);
void launch_blend_queries(const BlendQueriesArgs& args, cudaStream_t stream);
void launch_mla_absorb(const MlaAbsorbArgs& args, cudaStream_t stream);
void launch_mla_up_project(const MlaUpProjectArgs& args, cudaStream_t stream);
void launch_moe_route(const MoeRouteArgs& args, cudaStream_t stream);
void launch_scale_rows(const ScaleRowsArgs& args, cudaStream_t stream);
void launch_add_bias(const AddBiasArgs& args, cudaStream_t stream);
void launch_indexer_head_weights(const IndexerHeadWeightsArgs& args, cudaStream_t stream);
void launch_argmax(const ArgmaxArgs& args, cudaStream_t stream);
void launch_slots_from_physical(const SlotsFromPhysicalArgs& args, cudaStream_t stream);
void launch_store_bf16_rows(const StoreBf16RowsArgs& args, cudaStream_t stream);
void launch_mark_non_finite(const MarkNonFiniteArgs& args, cudaStream_t stream);
void launch_append_rows(const AppendRowsArgs& args, cudaStream_t stream);
#endif
void gather_rows_ref(const GatherRowsArgs& args);
void blend_queries_ref(const BlendQueriesArgs& args);
void mla_absorb_ref(const MlaAbsorbArgs& args);
void mla_up_project_ref(const MlaUpProjectArgs& args);
void moe_route_ref(const MoeRouteArgs& args);
void scale_rows_ref(const ScaleRowsArgs& args);
void add_bias_ref(const AddBiasArgs& args);
void indexer_head_weights_ref(const IndexerHeadWeightsArgs& args);
void argmax_ref(const ArgmaxArgs& args);
void slots_from_physical_ref(const SlotsFromPhysicalArgs& args);
void store_bf16_rows_ref(const StoreBf16RowsArgs& args);
void mark_non_finite_ref(const MarkNonFiniteArgs& args);
void append_rows_ref(const AppendRowsArgs& args);

}  // namespace hisparse::kernels
