// The routed experts of one MoE layer for a decode batch: gate and up projections with SwiGLU
// for the (expert, token) pairs the router chose, then the down projections weighted by the
// router and added to the residual stream. An expert no token is routed to costs nothing but its
// blocks' exit, and every routed expert's weights are streamed once, so a decode step reads the
// weights it uses in 2-4 launches instead of 3 GEMMs and 2 small kernels per expert.
//
// Two paths (moe_experts.cu): bf16 weights with hidden and width multiples of 32 take tensor
// cores (a plan of each expert's tokens, gate/up and down as mma.m16n8k16 with the expert's
// tokens as the n8 tiles, and a combine in expert order); other shapes and fp32 weights take
// warp-per-row kernels on the CUDA cores.
//
// For token t and expert e with router weight r = route_weights[t][e] != 0, in expert order:
//   g = W_gate[e] . h[t], u = W_up[e] . h[t]      (h rounded to bf16 first when bf16)
//   act[e][t] = silu(g) * u                         (silu(g) = g / (1 + exp(-g)))
//   x[t] += sum over e of r * (W_down[e] . act[e][t])   (act rounded to bf16 first when bf16)
// Weights are row-major [out x in] as checkpoints store them (W_gate, W_up [width x hidden],
// W_down [hidden x width]), fp32 or bf16; sums in fp32. The CPU twin sums each dot product in
// order; the kernels in lane-strided partial sums, so the two agree within float rounding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

/// Decode batches up to this many tokens take the fused experts (a 64-bit token mask per expert).
inline constexpr int kMoeExpertsMaxTokens = 64;

struct MoeExpertsArgs {
  const float* h = nullptr;              ///< [tokens x hidden], the FFN's normed input
  const float* route_weights = nullptr;  ///< [tokens x experts], 0 where not routed
  /// Per expert, its weights (const float* or, when bf16, const std::uint16_t*): device arrays
  /// of device pointers on CUDA, host arrays for the twin.
  const void* const* gate = nullptr;
  const void* const* up = nullptr;
  const void* const* down = nullptr;
  bool bf16 = false;  ///< bf16 weights, activations rounded to bf16 (GemmArgs::w_bf16)
  /// [experts x tokens x width], SwiGLU outputs (before the bf16 rounding); only routed rows
  /// written. Required on the CUDA-core path, optional (nullptr: not written) on the
  /// tensor-core path, which keeps its own bf16 copy in `workspace`.
  float* act = nullptr;
  float* x = nullptr;  ///< [tokens x hidden], the residual stream the experts add to
  int tokens = 0;      ///< at most kMoeExpertsMaxTokens
  int experts = 0;
  int hidden = 0;  ///< a multiple of 8
  int width = 0;   ///< expert width, a multiple of 8
  /// Device scratch of at least moe_experts_workspace_bytes(*this) bytes (the tensor-core path).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

/// Whether `args`' shape and weights take the tensor-core path.
[[nodiscard]] bool moe_experts_use_tensor_cores(const MoeExpertsArgs& args);

/// Bytes of `workspace` that launch_moe_experts needs for `args`' tokens, experts, hidden and
/// width: 0 on the CUDA-core path; on the tensor-core path the plan, the bf16 inputs and
/// activations and fp32 partial outputs of up to tokens x experts (expert, token) pairs.
[[nodiscard]] std::size_t moe_experts_workspace_bytes(const MoeExpertsArgs& args);

#if HISPARSE_WITH_CUDA
void launch_moe_experts(const MoeExpertsArgs& args, cudaStream_t stream);
#endif
void moe_experts_ref(const MoeExpertsArgs& args);

}  // namespace hisparse::kernels
