// launch_mla_decode_attention (see the header): 8 warps per CTA over 64 heads x one split of a
// request's rows. Per tile of 32 rows:
//   1. the rows, loaded into registers while the previous tile was being multiplied, are stored
//      into shared memory (16-byte loads; rows not listed are zeros), and the next tile's loads
//      are issued (Q takes most of shared memory, so a register stage stands in for a second tile);
//   2. logits S[64 x 32] = Q K^T with mma.m16n8k16 (warp w: heads 16 (w % 4) .., tile rows
//      16 (w / 4) ..), Q split into bf16 high and residual parts (two MMAs per fragment);
//   3. an online softmax per head (a warp per 8 heads, a lane per row) gives the weights P, split
//      the same way, and each head's rescale factor;
//   4. O[64 x v_dim] = O * alpha + P V with the accumulators in registers (warp w: heads as in 2,
//      half w / 4 of the value columns).
// Fragments come from shared memory by ldmatrix (V transposed). Shared-memory rows are padded by
// 16 bytes so that the 8 rows of an 8x8 matrix fall on distinct banks.
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
constexpr int kThreads = kWarps * 32;
constexpr int kHeads = kMlaDecodeHeadsPerCta;
constexpr int kRows = kMlaDecodeTileRows;
constexpr int kMaxValueTiles = kMlaDecodeMaxVDim / 16;  // n8 tiles per warp (half of v_dim)
constexpr int kLogitStride = kRows + 1;                 // floats
constexpr int kWeightStride = kRows + 8;                // bf16 elements
constexpr int kMaxRowVectors = (kMlaDecodeMaxQkDim + 15) / 16 * 2;  // 16-byte vectors per row
constexpr int kStaged = (kRows * kMaxRowVectors + kThreads - 1) / kThreads;  // per thread
constexpr int kMergeThreads = 128;

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

__global__ void __launch_bounds__(kThreads, 1)
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

  const std::int64_t count =
      a.indices != nullptr ? a.top_k : (a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity);
  const std::int64_t begin = std::int64_t{split} * rows_per_split;
  const std::int64_t end = count < begin + rows_per_split ? count : begin + rows_per_split;
  const std::int32_t* idx =
      a.indices != nullptr ? a.indices + static_cast<std::ptrdiff_t>(b) * a.top_k : nullptr;
  const std::ptrdiff_t base = static_cast<std::ptrdiff_t>(b) * a.capacity;
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : D;
  auto row_of = [&](std::int64_t pos) -> std::int64_t {  // -1: not listed
    if (pos >= end) return -1;
    const std::int64_t row = idx != nullptr ? __ldg(idx + pos) : pos;
    return row >= 0 && row < a.capacity ? row : -1;
  };

  // This thread's share of a tile's rows, held in registers between its load and its store.
  const int vectors = L.dim_pad / 8;
  uint4 staged[kStaged];
  auto fetch = [&](std::int64_t r0) {
#pragma unroll
    for (int j = 0; j < kStaged; ++j) {
      const int i = tid + j * kThreads, r = i / vectors, v = i - r * vectors;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r < kRows && v * 8 < D) {
        const std::int64_t row = row_of(r0 + r);
        if (row >= 0)
          x = __ldg(reinterpret_cast<const uint4*>(a.k_bf16 + (base + row) * k_stride) + v);
      }
      staged[j] = x;
    }
  };
  if (begin < end) fetch(begin);

  const int quads = L.dim_pad / 4;
  for (int i = tid; i < kHeads * quads; i += kThreads) {
    const int h = i / quads, c = (i - h * quads) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (head0 + h < a.q_heads && c < D)
      x = __ldg(reinterpret_cast<const float4*>(
          a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + head0 + h) * D + c));
    uint2 hi, lo;
    split_bf16_pair(x.x, x.y, hi.x, lo.x);
    split_bf16_pair(x.z, x.w, hi.y, lo.y);
    *reinterpret_cast<uint2*>(q_hi + h * S + c) = hi;
    *reinterpret_cast<uint2*>(q_lo + h * S + c) = lo;
  }
  if (tid < kHeads) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }

  const int value_tiles = DV / 16, v0 = half * (DV / 2);
  float acc[kMaxValueTiles][4];
#pragma unroll
  for (int n = 0; n < kMaxValueTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  // ldmatrix row addresses of this lane (see ldmatrix_x4): A fragments of Q and P take rows
  // lane % 16, columns 8 (lane / 16); K's B fragments for two n8 blocks take rows lane % 8 +
  // 8 (lane / 16), columns 8 (lane / 8 % 2); V's (transposed) rows lane % 8 + 8 (lane / 8 % 2),
  // columns 8 (lane / 16).
  const int a_row = 16 * mt + (lane & 15), a_col = (lane >> 4) * 8;
  const std::uint16_t* qh_frag = q_hi + a_row * S + a_col;
  const std::uint16_t* ql_frag = q_lo + a_row * S + a_col;
  const std::uint16_t* k_frag =
      tile + (16 * half + (lane & 7) + (lane >> 4) * 8) * S + ((lane >> 3) & 1) * 8;
  const std::uint16_t* ph_frag = p_hi + a_row * kWeightStride + a_col;
  const std::uint16_t* pl_frag = p_lo + a_row * kWeightStride + a_col;
  const std::uint16_t* v_frag =
      tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * S + v0 + (lane >> 4) * 8;

  for (std::int64_t r0 = begin; r0 < end; r0 += kRows) {
    __syncthreads();  // Q is written, and the last tile's readers are done
#pragma unroll
    for (int j = 0; j < kStaged; ++j) {
      const int i = tid + j * kThreads, r = i / vectors, v = i - r * vectors;
      if (r < kRows) *reinterpret_cast<uint4*>(tile + r * S + v * 8) = staged[j];
    }
    if (tid < kRows) tile_row[tid] = static_cast<int>(row_of(r0 + tid));
    __syncthreads();
    if (r0 + kRows < end) fetch(r0 + kRows);  // lands while this tile is multiplied
    {                                         // logits of 16 heads x 16 rows per warp
      float s[2][4] = {};
      for (int k0 = 0; k0 < L.dim_pad; k0 += 16) {
        std::uint32_t ah[4], al[4], kf[4];
        ldmatrix_x4(ah, qh_frag + k0);
        ldmatrix_x4(al, ql_frag + k0);
        ldmatrix_x4(kf, k_frag + k0);
        mma_bf16_m16n8k16(s[0], ah, kf[0], kf[1]);
        mma_bf16_m16n8k16(s[0], al, kf[0], kf[1]);
        mma_bf16_m16n8k16(s[1], ah, kf[2], kf[3]);
        mma_bf16_m16n8k16(s[1], al, kf[2], kf[3]);
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
      const std::uint16_t hi = float_to_bf16(p);
      p_hi[h * kWeightStride + lane] = hi;
      p_lo[h * kWeightStride + lane] = float_to_bf16(p - bf16_to_float(hi));
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
        ldmatrix_x4(ah, ph_frag + k0);
        ldmatrix_x4(al, pl_frag + k0);
        const std::uint16_t* vr = v_frag + k0 * S;
#pragma unroll
        for (int n = 0; n < kMaxValueTiles; n += 2) {
          if (n >= value_tiles) break;
          std::uint32_t vf[4];  // an odd last tile reads 8 columns it does not use (in the row)
          ldmatrix_x4_trans(vf, vr + 8 * n);
          mma_bf16_m16n8k16(acc[n], ah, vf[0], vf[1]);
          mma_bf16_m16n8k16(acc[n], al, vf[0], vf[1]);
          if (n + 1 < value_tiles) {
            mma_bf16_m16n8k16(acc[n + 1], ah, vf[2], vf[3]);
            mma_bf16_m16n8k16(acc[n + 1], al, vf[2], vf[3]);
          }
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

// out[b][h] = sum_s O_s exp(m_s - m) / sum_s l_s exp(m_s - m); zero for a head with no row. The
// splits' weights are computed once per head, then each thread sums 4 columns over the splits.
__global__ void __launch_bounds__(kMergeThreads)
    mla_decode_merge_kernel(DecodeAttentionArgs a, int splits, const float* part_out,
                            const float* part_max_sum) {
  extern __shared__ float weight[];  // [splits]
  __shared__ float scratch[32];
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const std::ptrdiff_t head = static_cast<std::ptrdiff_t>(b) * a.q_heads + h;
  const float* ms = part_max_sum + head * splits * 2;
  const float* o = part_out + head * splits * a.v_dim;
  float top = -INFINITY;
  for (int s = tid; s < splits; s += kMergeThreads) top = fmaxf(top, ms[2 * s]);
  top = block_max(top, scratch);
  float total = 0.0f;
  for (int s = tid; s < splits; s += kMergeThreads) {
    const float w = ms[2 * s] != -INFINITY ? expf(ms[2 * s] - top) : 0.0f;
    weight[s] = w;
    total += w * ms[2 * s + 1];
  }
  total = block_sum(total, scratch);  // its barriers also publish weight[]
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int c = 4 * tid; c < a.v_dim; c += 4 * kMergeThreads) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float w = weight[s];
      if (w == 0.0f) continue;
      const float4 x = __ldg(reinterpret_cast<const float4*>(o + s * a.v_dim + c));
      sum.x += w * x.x;
      sum.y += w * x.y;
      sum.z += w * x.z;
      sum.w += w * x.w;
    }
    *reinterpret_cast<float4*>(a.out + head * a.v_dim + c) =
        make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv);
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
                            kMergeThreads, sizeof(float) * plan.splits, stream>>>(
      a, plan.splits, part_out, part_max_sum);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
