// weight_rows_mma: one warp multiplies 16 rows of a row-major bf16 weight matrix by up to
// kTiles x 8 activation rows (decode tokens) with mma.m16n8k16, streaming the weights straight
// from global memory into the A registers. Per k step of 64 each lane loads 8 bf16 at k + 8c and
// k + 32 + 8c of rows g and g + 8 (lane = 4 g + c) and the same columns of its tile's g-th token:
// a dot product may visit k in any order as long as both operands visit it in the same one, so
// the 16-byte loads feed the MMAs as they lie, with no shuffle or shared-memory staging. The
// weight-bound decode projections (the MoE experts, MLA's absorbed key and value projections)
// read each weight once for the whole batch this way.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtypes.hpp"
#include "kernels/common/mma.cuh"

namespace hisparse::kernels {

/// A lane's place in its warp's fragments: lane = 4 g + c.
struct MmaLane {
  int lane, g, c;
  __device__ __forceinline__ static MmaLane current() {
    const int lane = static_cast<int>(threadIdx.x & 31);
    return {lane, lane >> 2, lane & 3};
  }
};

/// Activations already in bf16: x[i] points at element 8c of tile i's g-th row (nullptr: zeros).
template <int kTiles>
struct Bf16Rows {
  static constexpr int kParts = 1;
  const std::uint16_t* x[kTiles];
  __device__ __forceinline__ void load(int i, int k, std::uint32_t (&b)[kParts][4]) const {
    const uint4 v =
        x[i] != nullptr ? *reinterpret_cast<const uint4*>(x[i] + k) : make_uint4(0, 0, 0, 0);
    b[0][0] = v.x, b[0][1] = v.y, b[0][2] = v.z, b[0][3] = v.w;
  }
};

/// fp32 activations split into a bf16 high part and the bf16 of the residual (two MMAs per
/// fragment, about 16 bits of the mantissa kept, so the products match an fp32 twin within
/// fp32-sized rounding): x[i] points at element 8c of tile i's g-th row (nullptr: zeros).
template <int kTiles>
struct SplitF32Rows {
  static constexpr int kParts = 2;
  const float* x[kTiles];
  __device__ __forceinline__ void load(int i, int k, std::uint32_t (&b)[kParts][4]) const {
    float v[8] = {};
    if (x[i] != nullptr) {
      const float4 lo = *reinterpret_cast<const float4*>(x[i] + k);
      const float4 hi = *reinterpret_cast<const float4*>(x[i] + k + 4);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z,
      v[7] = hi.w;
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) split_bf16_pair(v[2 * p], v[2 * p + 1], b[0][p], b[1][p]);
  }
};

namespace detail {

// kPieces 8-element pieces at k, k + 32: the weights of rows g and g + 8 of every matrix first
// (all loads in flight together), then every live tile against each matrix.
template <int kPieces, int kMats, int kTiles, class Source>
__device__ __forceinline__ void weight_rows_step(float (&acc)[kMats][kTiles][4],
                                                 const std::uint16_t* const (&w)[kMats],
                                                 std::int64_t row8, const Source& src, int tiles,
                                                 int k) {
  uint4 wa[kMats][kPieces], wb[kMats][kPieces];
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      wa[m][p] = __ldcs(reinterpret_cast<const uint4*>(w[m] + k + 32 * p));
      wb[m][p] = __ldcs(reinterpret_cast<const uint4*>(w[m] + row8 + k + 32 * p));
    }
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    if (i >= tiles) break;
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      std::uint32_t b[Source::kParts][4];
      src.load(i, k + 32 * p, b);
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const std::uint32_t lo[4] = {wa[m][p].x, wb[m][p].x, wa[m][p].y, wb[m][p].y};
        const std::uint32_t hi[4] = {wa[m][p].z, wb[m][p].z, wa[m][p].w, wb[m][p].w};
#pragma unroll
        for (int part = 0; part < Source::kParts; ++part) {
          mma_bf16_m16n8k16(acc[m][i], lo, b[part][0], b[part][1]);
          mma_bf16_m16n8k16(acc[m][i], hi, b[part][2], b[part][3]);
        }
      }
    }
  }
}

}  // namespace detail

/// acc[m][i] += W_m[rows g, g + 8] . X[tile i]^T over k < depth (a multiple of 32), for each of
/// kMats matrices of the same shape read against the same activations (the MoE's gate and up
/// projections: one pass keeps both matrices' loads in flight), for the tiles below `tiles` (the
/// rest untouched). `w[m]` points at element 8c of the lane's row g of matrix m, `row8` is the
/// element distance to row g + 8. The accumulators follow mma's C layout: acc[m][i][r] is row
/// g + 8 (r >> 1) and token 8 i + 2 c + (r & 1) of the tile. Weights are loaded as streaming
/// (read once), activations through L1 (every warp of the batch reads them).
template <int kMats, int kTiles, class Source>
__device__ __forceinline__ void weight_rows_mma(float (&acc)[kMats][kTiles][4],
                                                const std::uint16_t* const (&w)[kMats],
                                                std::int64_t row8, const Source& src, int tiles,
                                                int depth) {
  int k = 0;
#pragma unroll 2
  for (; k + 64 <= depth; k += 64) detail::weight_rows_step<2>(acc, w, row8, src, tiles, k);
  if (k < depth) detail::weight_rows_step<1>(acc, w, row8, src, tiles, k);
}

}  // namespace hisparse::kernels
