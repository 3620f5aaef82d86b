// MLA's absorbed projections on tensor cores. Both are, per head, a weight matrix times the
// batch's vectors, so they are weight_rows_mma (kernels/common) over CTAs of (64 output rows,
// head, 64 requests): every weight is read once per 64 requests instead of once per request, and
// the fp32 activations enter as a bf16 high part and a bf16 residual (two MMAs per fragment), so
// the sums match the fp32 twin within fp32-sized rounding.
//   absorb:     out[b][h][c] = W_uk^T[h][c] . q_nope[b][h]  (W_uk^T [lora x nope] per head)
//   up-project: out[b][h][j] = W_uv[h][j] . latent[b][h]    (W_uv [v_dim x lora], rows of kv_b)
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/weight_rows_mma.cuh"
#include "kernels/decode/detail/mla_projections.hpp"

namespace hisparse::kernels::detail {
namespace {

constexpr int kWarps = 4;           ///< warps per CTA, 16 output rows each
constexpr int kRows = 16 * kWarps;  ///< output rows per CTA
constexpr int kRequests = 64;       ///< requests per CTA: up to 8 n8 tiles
constexpr int kMaxTiles = kRequests / 8;

// One warp's 16 rows of `weights` (row stride `depth`) against requests b0 .. b0 + count of
// `vectors` (request b at vectors + b * vector_stride, `depth` floats), into out[b * out_stride +
// row] for row < rows.
template <int kTiles>
__device__ __forceinline__ void project(const std::uint16_t* weights, int rows, int depth,
                                        const float* vectors, std::int64_t vector_stride,
                                        float* out, std::int64_t out_stride, int count) {
  const int row0 = static_cast<int>(blockIdx.x) * kRows + static_cast<int>(threadIdx.x >> 5) * 16;
  if (row0 >= rows) return;
  const MmaLane ln = MmaLane::current();
  SplitF32Rows<kTiles> x;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int b = 8 * i + ln.g;
    x.x[i] = b < count ? vectors + b * vector_stride + 8 * ln.c : nullptr;
  }
  float acc[1][kTiles][4] = {};
  const std::uint16_t* const w[1] = {weights + static_cast<std::int64_t>(row0 + ln.g) * depth +
                                     8 * ln.c};
  weight_rows_mma<1, kTiles>(acc, w, 8 * static_cast<std::int64_t>(depth), x, (count + 7) / 8,
                             depth);
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int b = 8 * i + 2 * ln.c + (r & 1);
      if (b < count) out[b * out_stride + row0 + ln.g + 8 * (r >> 1)] = acc[0][i][r];
    }
}

// grid (lora / 64 rounded up, heads, batch / 64 rounded up); the first row block of each head
// also copies the rope part of the query.
template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) mla_absorb_mma_kernel(MlaAbsorbArgs a) {
  const int h = static_cast<int>(blockIdx.y), b0 = static_cast<int>(blockIdx.z) * kRequests;
  const int count = a.batch - b0 < kRequests ? a.batch - b0 : kRequests;
  const int qk = a.nope + a.rope, row = a.lora + a.rope;
  const float* q = a.q + (static_cast<std::int64_t>(b0) * a.heads + h) * qk;
  float* out = a.out + (static_cast<std::int64_t>(b0) * a.heads + h) * row;
  if (blockIdx.x == 0)
    for (int i = static_cast<int>(threadIdx.x); i < count * a.rope; i += kWarps * 32) {
      const std::int64_t b = i / a.rope;
      out[b * a.heads * row + a.lora + i % a.rope] = q[b * a.heads * qk + a.nope + i % a.rope];
    }
  project<kTiles>(a.uk_t_bf16 + static_cast<std::int64_t>(h) * a.lora * a.nope, a.lora, a.nope, q,
                  static_cast<std::int64_t>(a.heads) * qk, out,
                  static_cast<std::int64_t>(a.heads) * row, count);
}

// grid (v_dim / 64 rounded up, heads, batch / 64 rounded up).
template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) mla_up_project_mma_kernel(MlaUpProjectArgs a) {
  const int h = static_cast<int>(blockIdx.y), b0 = static_cast<int>(blockIdx.z) * kRequests;
  const int count = a.batch - b0 < kRequests ? a.batch - b0 : kRequests;
  project<kTiles>(
      a.kv_b_bf16 + (static_cast<std::int64_t>(h) * (a.nope + a.v_dim) + a.nope) * a.lora, a.v_dim,
      a.lora, a.latent + (static_cast<std::int64_t>(b0) * a.heads + h) * a.lora,
      static_cast<std::int64_t>(a.heads) * a.lora,
      a.out + (static_cast<std::int64_t>(b0) * a.heads + h) * a.v_dim,
      static_cast<std::int64_t>(a.heads) * a.v_dim, count);
}

// The kernel instance whose tiles cover min(batch, 64) requests.
template <template <int> class Kernel, class Args>
void launch_tiles(const Args& a, int rows, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>((a.batch + kRequests - 1) / kRequests));
  const int tiles = (std::min(a.batch, kRequests) + 7) / 8;
  if (tiles <= 1)
    Kernel<1>::launch(grid, a, s);
  else if (tiles <= 2)
    Kernel<2>::launch(grid, a, s);
  else if (tiles <= 4)
    Kernel<4>::launch(grid, a, s);
  else
    Kernel<kMaxTiles>::launch(grid, a, s);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

template <int kTiles>
struct Absorb {
  static void launch(dim3 grid, const MlaAbsorbArgs& a, cudaStream_t s) {
    mla_absorb_mma_kernel<kTiles><<<grid, kWarps * 32, 0, s>>>(a);
  }
};
template <int kTiles>
struct UpProject {
  static void launch(dim3 grid, const MlaUpProjectArgs& a, cudaStream_t s) {
    mla_up_project_mma_kernel<kTiles><<<grid, kWarps * 32, 0, s>>>(a);
  }
};

}  // namespace

void launch_mla_absorb_tensor_cores(const MlaAbsorbArgs& a, cudaStream_t s) {
  launch_tiles<Absorb>(a, a.lora, s);
}
void launch_mla_up_project_tensor_cores(const MlaUpProjectArgs& a, cudaStream_t s) {
  launch_tiles<UpProject>(a, a.v_dim, s);
}

}  // namespace hisparse::kernels::detail
