// CUDA launchers of moe_experts.hpp. One warp per output row: its lanes stream the row's weights
// in 16-byte (bf16) or 32-byte (fp32) pieces, 8 elements per lane and step, and multiply each
// piece by up to 8 routed tokens' activations at once (per-lane partial sums, reduced by shuffles
// at the end of a pass). Which tokens an expert serves is a 64-bit ballot mask over the router's
// weights, made by every warp from the [tokens x experts] table (L1/L2 resident), so no block
// waits for another and an expert no token chose exits at once.
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/moe/moe_experts.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kWarps = 8;  ///< output rows per block, one per warp
constexpr int kGroup = 8;  ///< tokens a warp accumulates in one pass over a weight row
constexpr int kVec = 8;    ///< elements per lane and step

// 8 weights from element k of a row, as floats.
__device__ __forceinline__ void load_weights(const float* row, int k, float (&w)[kVec]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(row + k));
  const float4 b = __ldg(reinterpret_cast<const float4*>(row + k + 4));
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
__device__ __forceinline__ void load_weights(const std::uint16_t* row, int k, float (&w)[kVec]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + k));
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[2 * i] = __uint_as_float(words[i] << 16);
    w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// 8 activations from element k, rounded to bf16 values when kBf16.
template <bool kBf16>
__device__ __forceinline__ void load_activations(const float* row, int k, float (&v)[kVec]) {
  const float4 a = *reinterpret_cast<const float4*>(row + k);
  const float4 b = *reinterpret_cast<const float4*>(row + k + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  if constexpr (kBf16) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = bf16_to_float(float_to_bf16(v[i]));
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Tokens routed to expert e (bit t set where route_weights[t][e] != 0), the same in every lane.
__device__ __forceinline__ std::uint64_t routed_tokens(const MoeExpertsArgs& a, int e, int lane) {
  const bool lo = lane < a.tokens && a.route_weights[lane * a.experts + e] != 0.0f;
  const bool hi = lane + 32 < a.tokens && a.route_weights[(lane + 32) * a.experts + e] != 0.0f;
  return static_cast<std::uint64_t>(__ballot_sync(0xffffffffu, lo)) |
         static_cast<std::uint64_t>(__ballot_sync(0xffffffffu, hi)) << 32;
}

// Takes up to kGroup tokens off `mask` into t; returns how many.
__device__ __forceinline__ int next_group(std::uint64_t& mask, int (&t)[kGroup]) {
  int count = 0;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    t[j] = 0;
    if (mask != 0) {
      t[j] = __ffsll(static_cast<long long>(mask)) - 1;
      mask &= mask - 1;
      count = j + 1;
    }
  }
  return count;
}

// grid (width / kWarps, experts): row n of expert e's gate and up projections for its tokens.
template <class W, bool kBf16>
__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_kernel(MoeExpertsArgs a) {
  const int e = static_cast<int>(blockIdx.y), lane = static_cast<int>(threadIdx.x & 31);
  const int n = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5);
  std::uint64_t mask = routed_tokens(a, e, lane);
  if (mask == 0 || n >= a.width) return;
  const W* gate = static_cast<const W*>(a.gate[e]) + static_cast<std::int64_t>(n) * a.hidden;
  const W* up = static_cast<const W*>(a.up[e]) + static_cast<std::int64_t>(n) * a.hidden;
  while (mask != 0) {
    int t[kGroup];
    const int count = next_group(mask, t);
    float g[kGroup] = {}, u[kGroup] = {};
#pragma unroll 2
    for (int k = lane * kVec; k < a.hidden; k += 32 * kVec) {
      float wg[kVec], wu[kVec];
      load_weights(gate, k, wg);
      load_weights(up, k, wu);
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (j >= count) break;
        float x[kVec];
        load_activations<kBf16>(a.h + static_cast<std::int64_t>(t[j]) * a.hidden, k, x);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          g[j] = fmaf(wg[i], x[i], g[j]);
          u[j] = fmaf(wu[i], x[i], u[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j >= count) break;
      const float gs = warp_sum(g[j]), us = warp_sum(u[j]);
      if (lane == 0)
        a.act[(static_cast<std::int64_t>(e) * a.tokens + t[j]) * a.width + n] =
            gs / (1.0f + expf(-gs)) * us;
    }
  }
}

// grid (hidden / kWarps): row n of every routed expert's down projection, weighted and summed per
// token in expert order, then added to x.
template <class W, bool kBf16>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(MoeExpertsArgs a) {
  __shared__ float sums[kWarps][kMoeExpertsMaxTokens];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int n = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (n >= a.hidden) return;  // whole warps: no block barrier below
  float* sum = sums[warp];
  for (int t = lane; t < a.tokens; t += 32) sum[t] = 0.0f;
  __syncwarp();
  std::uint64_t any = 0;
  for (int e = 0; e < a.experts; ++e) {
    std::uint64_t mask = routed_tokens(a, e, lane);
    any |= mask;
    if (mask == 0) continue;
    const W* down = static_cast<const W*>(a.down[e]) + static_cast<std::int64_t>(n) * a.width;
    const float* act = a.act + static_cast<std::int64_t>(e) * a.tokens * a.width;
    while (mask != 0) {
      int t[kGroup];
      const int count = next_group(mask, t);
      float d[kGroup] = {};
#pragma unroll 2
      for (int k = lane * kVec; k < a.width; k += 32 * kVec) {
        float w[kVec];
        load_weights(down, k, w);
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          if (j >= count) break;
          float v[kVec];
          load_activations<kBf16>(act + static_cast<std::int64_t>(t[j]) * a.width, k, v);
#pragma unroll
          for (int i = 0; i < kVec; ++i) d[j] = fmaf(w[i], v[i], d[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (j >= count) break;
        const float ds = warp_sum(d[j]);
        if (lane == 0) sum[t[j]] += a.route_weights[t[j] * a.experts + e] * ds;
      }
    }
  }
  __syncwarp();
  for (int t = lane; t < a.tokens; t += 32)
    if ((any >> t) & 1u) a.x[static_cast<std::int64_t>(t) * a.hidden + n] += sum[t];
}

template <class W, bool kBf16>
void launch_typed(const MoeExpertsArgs& a, cudaStream_t s) {
  const dim3 gate_up_grid(static_cast<unsigned>((a.width + kWarps - 1) / kWarps),
                          static_cast<unsigned>(a.experts));
  moe_gate_up_kernel<W, kBf16><<<gate_up_grid, kWarps * 32, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
  moe_down_kernel<W, kBf16>
      <<<static_cast<unsigned>((a.hidden + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_moe_experts(const MoeExpertsArgs& a, cudaStream_t s) {
  if (a.tokens <= 0 || a.experts <= 0) return;
  if (a.tokens > kMoeExpertsMaxTokens || a.hidden % kVec != 0 || a.width % kVec != 0)
    throw Error("moe experts",
                std::to_string(a.tokens) + " tokens, hidden " + std::to_string(a.hidden) +
                    ", width " + std::to_string(a.width) + ": the fused experts take at most " +
                    std::to_string(kMoeExpertsMaxTokens) + " tokens and multiples of " +
                    std::to_string(kVec) + " wide",
                "run the experts as GEMMs for this shape");
  if (a.bf16)
    launch_typed<std::uint16_t, true>(a, s);
  else
    launch_typed<float, false>(a, s);
}

}  // namespace hisparse::kernels
