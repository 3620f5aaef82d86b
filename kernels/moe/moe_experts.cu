// CUDA launchers of moe_experts.hpp, two paths.
//
// Tensor cores (bf16, hidden and width multiples of 64), four launches:
//   1. plan: each expert's token mask, its first pair and its pairs' tokens (one block), and the
//      input rounded to bf16 (every block);
//   2. gate/up: CTA (64 rows, expert e), warp = 16 rows streamed by weight_rows_mma
//      (kernels/common: 16-byte weight loads straight into mma.m16n8k16) against the expert's
//      tokens as n8 tiles (all in one pass), SwiGLU in registers, bf16 activations per pair;
//   3. down: the same over hidden rows and width, fp32 partial outputs per pair;
//   4. combine: x[t] += sum over e (in expert order) of r[t][e] * partial[pair(t, e)].
// Every launch reads only what the experts routed to need; weights are read once.
//
// CUDA cores (fp32, other shapes), two launches. One warp per output row: its lanes stream the
// row's weights in 16-byte (bf16) or 32-byte (fp32) pieces, 8 elements per lane and step, and
// multiply each piece by up to 8 routed tokens' activations at once (per-lane partial sums,
// reduced by shuffles at the end of a pass). Which tokens an expert serves is a 64-bit ballot
// mask over the router's weights, made by every warp from the [tokens x experts] table (L1/L2
// resident), so no block waits for another and an expert no token chose exits at once.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/common/block_scan.cuh"
#include "kernels/common/weight_rows_mma.cuh"
#include "kernels/moe/detail/moe_workspace.hpp"
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

// ---- tensor-core path -------------------------------------------------------------------------

using detail::MoeWorkspace;

constexpr int kMmaWarps = 4;              ///< warps per CTA, 16 output rows each
constexpr int kMmaRows = 16 * kMmaWarps;  ///< output rows per CTA
constexpr int kPlanThreads = 256;
constexpr int kCombineThreads = 256;  ///< 4 outputs each

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  return static_cast<std::uint32_t>(float_to_bf16(lo)) |
         static_cast<std::uint32_t>(float_to_bf16(hi)) << 16;
}

// Every block rounds a share of h to bf16; block 0 also plans the pairs: expert e's pairs are
// offsets[e] .. + popcount(masks[e]), its tokens in increasing order.
__global__ void __launch_bounds__(kPlanThreads) moe_plan_kernel(MoeExpertsArgs a, MoeWorkspace w) {
  const std::int64_t n = static_cast<std::int64_t>(a.tokens) * a.hidden;
  for (std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * kPlanThreads + threadIdx.x) * 8;
       i < n; i += static_cast<std::int64_t>(gridDim.x) * kPlanThreads * 8) {
    const float4 lo = *reinterpret_cast<const float4*>(a.h + i);
    const float4 hi = *reinterpret_cast<const float4*>(a.h + i + 4);
    *reinterpret_cast<uint4*>(w.h_bf16 + i) = make_uint4(
        pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y), pack_bf16(hi.z, hi.w));
  }
  if (blockIdx.x != 0) return;
  __shared__ int area[32];
  int carry = 0;
  for (int e0 = 0; e0 < a.experts; e0 += kPlanThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    std::uint64_t mask = 0;
    for (int t = 0; e < a.experts && t < a.tokens; ++t)
      if (a.route_weights[static_cast<std::int64_t>(t) * a.experts + e] != 0.0f)
        mask |= std::uint64_t{1} << t;
    int total = 0;
    const int offset = carry + block_exclusive_sum_one_barrier(__popcll(mask), area, total);
    if (e < a.experts) {
      w.masks[e] = mask;
      w.offsets[e] = offset;
      for (int j = 0; mask != 0; ++j, mask &= mask - 1)
        w.pair_tokens[offset + j] = __ffsll(static_cast<long long>(mask)) - 1;
    }
    carry += total;
    __syncthreads();  // `area` is written again by the next round's scan
  }
}

// The warp's first output row (warps past the matrix's rows have nothing to do).
__device__ __forceinline__ int warp_row0() {
  return static_cast<int>(blockIdx.x) * kMmaRows + static_cast<int>(threadIdx.x >> 5) * 16;
}

// Expert e's pairs: offsets[e] .. + count (count 0 where no token chose e), in n8 tiles.
struct ExpertPairs {
  int count, offset, tiles;
};
__device__ __forceinline__ ExpertPairs expert_pairs(const MoeWorkspace& w, int e) {
  const int count = __popcll(w.masks[e]);
  return {count, w.offsets[e], (count + 7) / 8};
}

// The B operand: tile i's g-th pair j reads row row_of(j) of `rows` (`stride` elements apart).
template <int kTiles, class RowOf>
__device__ __forceinline__ Bf16Rows<kTiles> pair_rows(const ExpertPairs& p, const MmaLane& ln,
                                                      const std::uint16_t* rows, int stride,
                                                      RowOf row_of) {
  Bf16Rows<kTiles> x;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int j = 8 * i + ln.g;
    x.x[i] =
        j < p.count ? rows + static_cast<std::int64_t>(row_of(j)) * stride + 8 * ln.c : nullptr;
  }
  return x;
}

// grid (width / 64 rounded up, experts): gate and up rows of expert e for all its tokens,
// SwiGLU, bf16 activations per pair (and the fp32 ones per (expert, token) when a.act is set).
template <int kTiles>
__global__ void __launch_bounds__(kMmaWarps * 32)
    moe_gate_up_mma_kernel(MoeExpertsArgs a, MoeWorkspace w) {
  const int e = static_cast<int>(blockIdx.y), row0 = warp_row0();
  const ExpertPairs p = expert_pairs(w, e);
  if (p.count == 0 || row0 >= a.width) return;
  const MmaLane ln = MmaLane::current();
  const auto x = pair_rows<kTiles>(p, ln, w.h_bf16, a.hidden,
                                   [&](int j) { return w.pair_tokens[p.offset + j]; });
  const std::int64_t row = static_cast<std::int64_t>(row0 + ln.g) * a.hidden + 8 * ln.c;
  float acc[2][kTiles][4] = {};
  const std::uint16_t* const w_gate_up[2] = {static_cast<const std::uint16_t*>(a.gate[e]) + row,
                                             static_cast<const std::uint16_t*>(a.up[e]) + row};
  weight_rows_mma<2, kTiles>(acc, w_gate_up, 8 * a.hidden, x, p.tiles, a.hidden);
  const auto& g = acc[0];
  const auto& u = acc[1];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    if (i >= p.tiles) break;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = 8 * i + 2 * ln.c + (r & 1), n = row0 + ln.g + 8 * (r >> 1);
      if (j >= p.count) continue;
      const float v = g[i][r] / (1.0f + expf(-g[i][r])) * u[i][r];
      w.act_bf16[static_cast<std::int64_t>(p.offset + j) * a.width + n] = float_to_bf16(v);
      if (a.act != nullptr)
        a.act[(static_cast<std::int64_t>(e) * a.tokens + w.pair_tokens[p.offset + j]) * a.width +
              n] = v;
    }
  }
}

// grid (hidden / 64 rounded up, experts): down rows of expert e for all its pairs, fp32
// partials per pair.
template <int kTiles>
__global__ void __launch_bounds__(kMmaWarps * 32)
    moe_down_mma_kernel(MoeExpertsArgs a, MoeWorkspace w) {
  const int e = static_cast<int>(blockIdx.y), row0 = warp_row0();
  const ExpertPairs p = expert_pairs(w, e);
  if (p.count == 0 || row0 >= a.hidden) return;
  const MmaLane ln = MmaLane::current();
  const auto x = pair_rows<kTiles>(p, ln, w.act_bf16, a.width, [&](int j) { return p.offset + j; });
  float acc[1][kTiles][4] = {};
  const std::uint16_t* const down[1] = {static_cast<const std::uint16_t*>(a.down[e]) +
                                        static_cast<std::int64_t>(row0 + ln.g) * a.width +
                                        8 * ln.c};
  weight_rows_mma<1, kTiles>(acc, down, 8 * a.width, x, p.tiles, a.width);
  const auto& d = acc[0];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    if (i >= p.tiles) break;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = 8 * i + 2 * ln.c + (r & 1);
      if (j < p.count)
        w.partial[static_cast<std::int64_t>(p.offset + j) * a.hidden + row0 + ln.g + 8 * (r >> 1)] =
            d[i][r];
    }
  }
}

// grid (hidden / 1024 rounded up, tokens): x[t] += the router-weighted partials, expert order.
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(MoeExpertsArgs a, MoeWorkspace w) {
  const int t = static_cast<int>(blockIdx.y);
  const int n =
      (static_cast<int>(blockIdx.x) * kCombineThreads + static_cast<int>(threadIdx.x)) * 4;
  if (n >= a.hidden) return;
  const std::uint64_t below = (std::uint64_t{1} << t) - 1;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  bool routed = false;
  for (int e = 0; e < a.experts; ++e) {
    const std::uint64_t mask = w.masks[e];
    if (((mask >> t) & 1u) == 0) continue;
    routed = true;
    const float r = a.route_weights[static_cast<std::int64_t>(t) * a.experts + e];
    const int pair = w.offsets[e] + __popcll(mask & below);
    const float4 p = *reinterpret_cast<const float4*>(
        w.partial + static_cast<std::int64_t>(pair) * a.hidden + n);
    sum.x += r * p.x, sum.y += r * p.y, sum.z += r * p.z, sum.w += r * p.w;
  }
  if (!routed) return;
  float4* x = reinterpret_cast<float4*>(a.x + static_cast<std::int64_t>(t) * a.hidden + n);
  float4 v = *x;
  v.x += sum.x, v.y += sum.y, v.z += sum.z, v.w += sum.w;
  *x = v;
}

template <int kTiles>
void launch_mma_tiles(const MoeExpertsArgs& a, const MoeWorkspace& w, cudaStream_t s) {
  const auto experts = static_cast<unsigned>(a.experts);
  const auto blocks = [](int rows) {
    return static_cast<unsigned>((rows + kMmaRows - 1) / kMmaRows);
  };
  moe_gate_up_mma_kernel<kTiles><<<dim3(blocks(a.width), experts), kMmaWarps * 32, 0, s>>>(a, w);
  HISPARSE_CUDA_CHECK_LAUNCH();
  moe_down_mma_kernel<kTiles><<<dim3(blocks(a.hidden), experts), kMmaWarps * 32, 0, s>>>(a, w);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void launch_tensor_cores(const MoeExpertsArgs& a, cudaStream_t s) {
  const std::size_t need = moe_experts_workspace_bytes(a);
  if (a.workspace == nullptr || a.workspace_bytes < need)
    throw Error("moe experts",
                "the tensor-core path needs " + std::to_string(need) + " bytes of workspace, got " +
                    std::to_string(a.workspace_bytes),
                "allocate moe_experts_workspace_bytes(args) bytes and pass them as workspace");
  const MoeWorkspace w =
      detail::carve_moe_workspace(a.workspace, a.tokens, a.experts, a.hidden, a.width);
  const std::int64_t pieces = static_cast<std::int64_t>(a.tokens) * a.hidden / 8;
  const auto plan_blocks =
      static_cast<unsigned>(std::min<std::int64_t>(64, (pieces + kPlanThreads - 1) / kPlanThreads));
  moe_plan_kernel<<<plan_blocks, kPlanThreads, 0, s>>>(a, w);
  HISPARSE_CUDA_CHECK_LAUNCH();
  // Every token can fall on one expert, so the tiles cover the whole batch in one pass.
  const int tiles = (a.tokens + 7) / 8;
  if (tiles <= 1)
    launch_mma_tiles<1>(a, w, s);
  else if (tiles <= 2)
    launch_mma_tiles<2>(a, w, s);
  else if (tiles <= 4)
    launch_mma_tiles<4>(a, w, s);
  else
    launch_mma_tiles<8>(a, w, s);
  moe_combine_kernel<<<dim3(static_cast<unsigned>((a.hidden / 4 + kCombineThreads - 1) /
                                                  kCombineThreads),
                            static_cast<unsigned>(a.tokens)),
                       kCombineThreads, 0, s>>>(a, w);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

// ---- CUDA-core path ---------------------------------------------------------------------------

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
  if (moe_experts_use_tensor_cores(a)) {
    launch_tensor_cores(a, s);
    return;
  }
  if (a.act == nullptr)
    throw Error("moe experts", "no activation scratch (MoeExpertsArgs::act) for this shape",
                "pass experts x tokens x width floats as act");
  if (a.bf16)
    launch_typed<std::uint16_t, true>(a, s);
  else
    launch_typed<float, false>(a, s);
}

}  // namespace hisparse::kernels
