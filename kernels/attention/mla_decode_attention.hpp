// Tensor-core decode attention for MLA: one latent row per token shared by every query head
// (kv_heads == 1, the value is the row's first v_dim elements), bf16 rows, read in the listed
// order (sparse: `indices`, dense: rows 0 .. seq_len - 1). The result is decode_attention's
// (decode_attention_ref is the twin), computed with bf16 MMAs on split operands: each query and
// each softmax weight is a bf16 value plus a bf16 residual, so the products keep about 16 bits of
// mantissa (relative error about 1e-5) while the rows are read exactly as stored.
//
// Work: a CTA takes 64 heads of one request and one contiguous share of its rows (a split),
// 32 rows at a time (one tile in shared memory, read once for all 64 heads), with an online
// softmax; a second kernel merges the splits' partial sums. The plan sizes the splits so that the
// CTAs fill the GPU once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stream.hpp"
#include "kernels/attention/decode_attention.hpp"

namespace hisparse::kernels {

constexpr int kMlaDecodeHeadsPerCta = 64;
constexpr int kMlaDecodeTileRows = 32;
constexpr int kMlaDecodeMaxQkDim = 576;
constexpr int kMlaDecodeMaxVDim = 512;

struct MlaDecodePlan {
  int splits = 1;          ///< CTAs per (request, 64 heads)
  int rows_per_split = 0;  ///< a multiple of kMlaDecodeTileRows
};

/// Whether the arguments fit this kernel: kv_heads 1, one selection per request, bf16 rows with
/// v aliasing k (same stride), qk_dim a multiple of 8 up to 576, v_dim a multiple of 16 up to 512
/// and at most qk_dim, rows, queries and outputs 16-byte aligned (float4 and uint4 accesses).
/// Otherwise use launch_decode_attention.
[[nodiscard]] bool mla_decode_attention_supports(const DecodeAttentionArgs& a);

/// The most splits any plan for this batch and head count has, whatever its rows: as many as one
/// wave of CTAs holds (one CTA per SM fits its shared memory). Size the workspace with it.
[[nodiscard]] int mla_decode_max_splits(int batch, int q_heads, int multiprocessors);

/// Splits for `max_rows` rows per request (top_k, or the longest dense context) over
/// `multiprocessors` SMs.
[[nodiscard]] MlaDecodePlan plan_mla_decode_attention(int batch, int q_heads, std::int64_t max_rows,
                                                      int multiprocessors);

/// Floats of workspace a launch with `splits` needs (partial outputs, maxima and sums).
[[nodiscard]] std::size_t mla_decode_workspace_floats(int batch, int q_heads, int v_dim,
                                                      int splits);

#if HISPARSE_WITH_CUDA
/// Throws hisparse::Error when the arguments are not supported, the plan does not cover the rows
/// or the workspace is too small.
void launch_mla_decode_attention(const DecodeAttentionArgs& a, const MlaDecodePlan& plan,
                                 float* workspace, std::size_t workspace_floats,
                                 cudaStream_t stream);
#endif

}  // namespace hisparse::kernels
