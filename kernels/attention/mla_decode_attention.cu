// launch_mla_decode_attention (see the header): 8 warps per CTA over 64 heads x one split of a
// request's rows. Per tile of 32 rows:
//   1. the rows are gathered into shared memory (16-byte loads; rows not listed are zeros);
//   2. logits S[64 x 32] = Q K^T with mma.m16n8k16 (warp w: heads 16 (w % 4) .., tile rows
//      16 (w / 4) ..), Q split into bf16 high and residual parts (two MMAs per fragment);
//   3. an online softmax per head (a warp per 8 heads, a lane per row) gives the weights P, split
//      the same way, and each head's rescale factor;
//   4. O[64 x v_dim] = O * alpha + P V with the accumulators in registers (warp w: heads as in 2,
//      half w / 4 of the value columns).
// Shared-memory rows are padded by 16 bytes so that a fragment's 8 rows fall on distinct banks.
// The merge kernel combines the splits' (O, max, sum) as flash-decoding does.
#include <cmath>
#include <string>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/attention/mla_decode_attention.hpp"
#include "kernels/common/block_reduce.cuh"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/common/mma.cuh"

namespace hisparse::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kHeads = kMlaDecodeHeadsPerCta;
constexpr int kRows = kMlaDecodeTileRows;
constexpr int kMaxValueTiles = kMlaDecodeMaxVDim / 16;  // n8 tiles per warp (half of v_dim)
constexpr int kLogitStride = kRows + 1;                 // floats
constexpr int kWeightStride = kRows + 8;                // bf16 elements

struct Layout {
  int dim_pad;  ///< qk_dim rounded up to 16
  int stride;   ///< bf16 elements per row of Q and of the tile: dim_pad + 8
  __host__ __device__ explicit Layout(int qk_dim)
      : dim_pad((qk_dim + 15) / 16 * 16), stride((qk_dim + 15) / 16 * 16 + 8) {}
  __host__ __device__ std::size_t q_elems() const { return std::size_t{kHeads} * stride; }
  __host__ __device__ std::size_t tile_elems() const { return std::size_t{kRows} * stride; }
  __host__ __device__ std::size_t bytes() const {
    return (2 * q_elems() + tile_elems()) * 2 + sizeof(float) * kHeads * kLogitStride +
           2 * 2 * std::size_t{kHeads} * kWeightStride + sizeof(float) * 3 * kHeads +
           sizeof(int) * kRows;
  }
};

__device__ __forceinline__ std::uint32_t load_pair(const std::uint16_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

__device__ __forceinline__ void split_bf16(float x, std::uint16_t& hi, std::uint16_t& lo) {
  hi = float_to_bf16(x);
  lo = float_to_bf16(x - bf16_to_float(hi));
}

// The A fragment of rows `row0` .. +15, columns k0 .. k0 + 15 of a row-major bf16 matrix.
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const std::uint16_t* m, int stride,
                                       int row0, int k0, int g, int t) {
  const std::uint16_t* p = m + (row0 + g) * stride + k0 + 2 * t;
  a[0] = load_pair(p);
  a[1] = load_pair(p + 8 * stride);
  a[2] = load_pair(p + 8);
  a[3] = load_pair(p + 8 * stride + 8);
}

__global__ void __launch_bounds__(kWarps * 32, 1)
    mla_decode_kernel(DecodeAttentionArgs a, int rows_per_split, int splits, float* part_out,
                      float* part_max_sum) {
  const int split = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int head0 = static_cast<int>(blockIdx.z) * kHeads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3, mt = warp & 3, half = warp >> 2;
  const int D = a.qk_dim, DV = a.v_dim;
  const Layout L(D);
  const int S = L.stride;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* q_hi = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* q_lo = q_hi + L.q_elems();
  std::uint16_t* tile = q_lo + L.q_elems();
  auto* logits = reinterpret_cast<float*>(tile + L.tile_elems());
  auto* p_hi = reinterpret_cast<std::uint16_t*>(logits + kHeads * kLogitStride);
  std::uint16_t* p_lo = p_hi + kHeads * kWeightStride;
  auto* run_max = reinterpret_cast<float*>(p_lo + kHeads * kWeightStride);
  float* run_sum = run_max + kHeads;
  float* rescale = run_sum + kHeads;
  auto* tile_row = reinterpret_cast<int*>(rescale + kHeads);

  for (int i = tid; i < kHeads * L.dim_pad; i += kWarps * 32) {
    const int h = i / L.dim_pad, c = i - h * L.dim_pad;
    float x = 0.0f;
    if (head0 + h < a.q_heads && c < D)
      x = a.q[(static_cast<std::ptrdiff_t>(b) * a.q_heads + head0 + h) * D + c];
    split_bf16(x, q_hi[h * S + c], q_lo[h * S + c]);
  }
  if (tid < kHeads) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }

  const std::int64_t count =
      a.indices != nullptr ? a.top_k : (a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity);
  const std::int64_t begin = std::int64_t{split} * rows_per_split;
  const std::int64_t end = count < begin + rows_per_split ? count : begin + rows_per_split;
  const std::int32_t* idx =
      a.indices != nullptr ? a.indices + static_cast<std::ptrdiff_t>(b) * a.top_k : nullptr;
  const std::ptrdiff_t base = static_cast<std::ptrdiff_t>(b) * a.capacity;
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : D;
  const int value_tiles = DV / 16, v0 = half * (DV / 2);
  float acc[kMaxValueTiles][4];
#pragma unroll
  for (int n = 0; n < kMaxValueTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (std::int64_t r0 = begin; r0 < end; r0 += kRows) {
    __syncthreads();  // Q is written, and the last tile's readers are done
    if (tid < kRows) {
      const std::int64_t pos = r0 + tid;
      std::int64_t row = -1;
      if (pos < end) {
        row = idx != nullptr ? idx[pos] : pos;
        if (row < 0 || row >= a.capacity) row = -1;
      }
      tile_row[tid] = static_cast<int>(row);
    }
    __syncthreads();
    const int vectors = L.dim_pad / 8;
    for (int i = tid; i < kRows * vectors; i += kWarps * 32) {
      const int r = i / vectors, v = i - r * vectors, row = tile_row[r];
      uint4 x = make_uint4(0, 0, 0, 0);
      if (row >= 0 && v * 8 < D)
        x = *reinterpret_cast<const uint4*>(a.k_bf16 + (base + row) * k_stride + v * 8);
      *reinterpret_cast<uint4*>(tile + r * S + v * 8) = x;
    }
    __syncthreads();
    {  // logits of 16 heads x 16 rows per warp
      float s[2][4] = {};
      for (int k0 = 0; k0 < L.dim_pad; k0 += 16) {
        std::uint32_t ah[4], al[4];
        load_a(ah, q_hi, S, 16 * mt, k0, g, t);
        load_a(al, q_lo, S, 16 * mt, k0, g, t);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const std::uint16_t* kr = tile + (16 * half + 8 * j + g) * S + k0 + 2 * t;
          const std::uint32_t b0 = load_pair(kr), b1 = load_pair(kr + 8);
          mma_bf16_m16n8k16(s[j], ah, b0, b1);
          mma_bf16_m16n8k16(s[j], al, b0, b1);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = 16 * half + 8 * j + 2 * t;
        float* lo_row = logits + (16 * mt + g) * kLogitStride + col;
        float* hi_row = lo_row + 8 * kLogitStride;
        lo_row[0] = s[j][0];
        lo_row[1] = s[j][1];
        hi_row[0] = s[j][2];
        hi_row[1] = s[j][3];
      }
    }
    __syncthreads();
    for (int i = 0; i < kHeads / kWarps; ++i) {  // online softmax: a warp per 8 heads
      const int h = warp * (kHeads / kWarps) + i;
      const bool listed = tile_row[lane] >= 0;
      const float old_max = run_max[h];
      const float x = listed ? logits[h * kLogitStride + lane] * a.scale : -INFINITY;
      const float new_max = fmaxf(old_max, warp_max(x));
      float p = 0.0f, keep = 1.0f;
      if (new_max != -INFINITY) {
        p = listed ? expf(x - new_max) : 0.0f;
        keep = expf(old_max - new_max);
      }
      const float sum = warp_sum(p);
      split_bf16(p, p_hi[h * kWeightStride + lane], p_lo[h * kWeightStride + lane]);
      if (lane == 0) {
        run_max[h] = new_max;
        run_sum[h] = run_sum[h] * keep + sum;
        rescale[h] = keep;
      }
    }
    __syncthreads();
    {  // O = O * keep + P V: 16 heads x v_dim / 2 columns per warp
      const float keep_lo = rescale[16 * mt + g], keep_hi = rescale[16 * mt + g + 8];
#pragma unroll
      for (int n = 0; n < kMaxValueTiles; ++n) {
        if (n >= value_tiles) break;
        acc[n][0] *= keep_lo;
        acc[n][1] *= keep_lo;
        acc[n][2] *= keep_hi;
        acc[n][3] *= keep_hi;
      }
#pragma unroll
      for (int k0 = 0; k0 < kRows; k0 += 16) {
        std::uint32_t ah[4], al[4];
        load_a(ah, p_hi, kWeightStride, 16 * mt, k0, g, t);
        load_a(al, p_lo, kWeightStride, 16 * mt, k0, g, t);
        const std::uint16_t* vr = tile + (k0 + 2 * t) * S + v0 + g;
#pragma unroll
        for (int n = 0; n < kMaxValueTiles; ++n) {
          if (n >= value_tiles) break;
          const std::uint16_t* p = vr + 8 * n;
          const std::uint32_t b0 = std::uint32_t{p[0]} | (std::uint32_t{p[S]} << 16);
          const std::uint32_t b1 = std::uint32_t{p[8 * S]} | (std::uint32_t{p[9 * S]} << 16);
          mma_bf16_m16n8k16(acc[n], ah, b0, b1);
          mma_bf16_m16n8k16(acc[n], al, b0, b1);
        }
      }
    }
  }
  __syncthreads();  // the last softmax's maxima and sums (or the initial ones) are written

  const int h_lo = head0 + 16 * mt + g, h_hi = h_lo + 8;
  auto out_of = [&](int h) {
    return part_out + ((static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * splits + split) * DV;
  };
#pragma unroll
  for (int n = 0; n < kMaxValueTiles; ++n) {
    if (n >= value_tiles) break;
    const int col = v0 + 8 * n + 2 * t;
    if (h_lo < a.q_heads) {
      out_of(h_lo)[col] = acc[n][0];
      out_of(h_lo)[col + 1] = acc[n][1];
    }
    if (h_hi < a.q_heads) {
      out_of(h_hi)[col] = acc[n][2];
      out_of(h_hi)[col + 1] = acc[n][3];
    }
  }
  if (tid < kHeads && head0 + tid < a.q_heads) {
    float* ms = part_max_sum +
                ((static_cast<std::ptrdiff_t>(b) * a.q_heads + head0 + tid) * splits + split) * 2;
    ms[0] = run_max[tid];
    ms[1] = run_sum[tid];
  }
}

// out[b][h] = sum_s O_s exp(m_s - m) / sum_s l_s exp(m_s - m); zero for a head with no row.
__global__ void mla_decode_merge_kernel(DecodeAttentionArgs a, int splits, const float* part_out,
                                        const float* part_max_sum) {
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const std::ptrdiff_t head = static_cast<std::ptrdiff_t>(b) * a.q_heads + h;
  const float* ms = part_max_sum + head * splits * 2;
  const float* o = part_out + head * splits * a.v_dim;
  float top = -INFINITY;
  for (int s = 0; s < splits; ++s) top = fmaxf(top, ms[2 * s]);
  float total = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (ms[2 * s] != -INFINITY) total += ms[2 * s + 1] * expf(ms[2 * s] - top);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int c = static_cast<int>(threadIdx.x); c < a.v_dim; c += static_cast<int>(blockDim.x)) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (ms[2 * s] != -INFINITY) sum += o[s * a.v_dim + c] * expf(ms[2 * s] - top);
    a.out[head * a.v_dim + c] = sum * inv;
  }
}

}  // namespace

void launch_mla_decode_attention(const DecodeAttentionArgs& a, const MlaDecodePlan& plan,
                                 float* workspace, std::size_t workspace_floats,
                                 cudaStream_t stream) {
  if (!mla_decode_attention_supports(a))
    throw Error("MLA decode attention",
                "arguments outside the kernel (kv_heads " + std::to_string(a.kv_heads) +
                    ", qk_dim " + std::to_string(a.qk_dim) + ", v_dim " + std::to_string(a.v_dim) +
                    ", bf16 rows with v aliasing k)",
                "check mla_decode_attention_supports first, else use launch_decode_attention");
  if (a.batch <= 0 || a.q_heads <= 0) return;
  const std::int64_t rows = a.indices != nullptr ? a.top_k : a.capacity;
  if (plan.splits <= 0 || plan.rows_per_split <= 0 || plan.rows_per_split % kMlaDecodeTileRows ||
      std::int64_t{plan.splits} * plan.rows_per_split < rows)
    throw Error("MLA decode attention",
                "the plan (" + std::to_string(plan.splits) + " splits of " +
                    std::to_string(plan.rows_per_split) + " rows) does not cover " +
                    std::to_string(rows) + " rows",
                "make the plan with plan_mla_decode_attention for these rows");
  const std::size_t need = mla_decode_workspace_floats(a.batch, a.q_heads, a.v_dim, plan.splits);
  if (workspace == nullptr || workspace_floats < need)
    throw Error("MLA decode attention",
                "workspace of " + std::to_string(workspace_floats) + " floats, " +
                    std::to_string(need) + " needed",
                "allocate mla_decode_workspace_floats() for the largest plan");
  const std::size_t shared = Layout(a.qk_dim).bytes();
  allow_dynamic_shared(mla_decode_kernel, shared);
  float* part_out = workspace;
  float* part_max_sum =
      workspace + static_cast<std::size_t>(a.batch) * a.q_heads * plan.splits * a.v_dim;
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(a.batch),
                  static_cast<unsigned>((a.q_heads + kHeads - 1) / kHeads));
  mla_decode_kernel<<<grid, kWarps * 32, shared, stream>>>(a, plan.rows_per_split, plan.splits,
                                                           part_out, part_max_sum);
  HISPARSE_CUDA_CHECK_LAUNCH();
  mla_decode_merge_kernel<<<dim3(static_cast<unsigned>(a.q_heads), static_cast<unsigned>(a.batch)),
                            128, 0, stream>>>(a, plan.splits, part_out, part_max_sum);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
