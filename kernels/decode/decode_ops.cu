// CUDA launchers of decode_ops.hpp: plain kernels (one thread per output element, one warp or
// block per row where a row is reduced); each matches its twin within float rounding, argmax and
// the router's choice exactly on distinct values.
#include <algorithm>
#include <cfloat>
#include <string>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/common/block_reduce.cuh"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/decode/detail/mla_projections.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kThreads = 256;

[[nodiscard]] unsigned blocks_for(std::int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min<std::int64_t>((n + threads - 1) / threads, 65535)));
}

#define HISPARSE_GRID_STRIDE(i, n)                                                                 \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void gather_rows_kernel(GatherRowsArgs a) {
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.width) {
    const std::int64_t r = i / a.width, c = i % a.width;
    a.out[i] = a.table[static_cast<std::int64_t>(a.ids[r]) * a.width + c];
  }
}

// One warp per row; sums in double, as the twin.
__global__ void blend_queries_kernel(BlendQueriesArgs a) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (r >= a.rows) return;
  const float* wl = a.workload + r * a.n;
  float* q = a.q + r * a.n;
  double wl_sq = 0, q_sq = 0;
  for (int i = lane; i < a.n; i += 32) {
    wl_sq += static_cast<double>(wl[i]) * wl[i];
    q_sq += static_cast<double>(q[i]) * q[i];
  }
  for (int o = 16; o > 0; o >>= 1) {
    wl_sq += __shfl_xor_sync(0xffffffffu, wl_sq, o);
    q_sq += __shfl_xor_sync(0xffffffffu, q_sq, o);
  }
  const float gain =
      a.share == 0.0f || q_sq <= 0 ? 0.0f : static_cast<float>(a.share * sqrt(wl_sq / q_sq));
  for (int i = lane; i < a.n; i += 32) q[i] = gain == 0.0f ? wl[i] : wl[i] + gain * q[i];
}

__global__ void mla_absorb_kernel(MlaAbsorbArgs a) {
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int qk = a.nope + a.rope, row = a.lora + a.rope;
  const float* qn = a.q + (static_cast<std::int64_t>(b) * a.heads + h) * qk;
  float* out = a.out + (static_cast<std::int64_t>(b) * a.heads + h) * row;
  for (int c = threadIdx.x; c < a.lora; c += blockDim.x) {
    float acc = 0.0f;
    for (int n = 0; n < a.nope; ++n)
      acc += qn[n] * a.kv_b[(static_cast<std::int64_t>(h) * (a.nope + a.v_dim) + n) * a.lora + c];
    out[c] = acc;
  }
  for (int c = threadIdx.x; c < a.rope; c += blockDim.x) out[a.lora + c] = qn[a.nope + c];
}

// One warp per output value.
__global__ void mla_up_project_kernel(MlaUpProjectArgs a) {
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int j = static_cast<int>(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
  if (j >= a.v_dim) return;
  const float* lat = a.latent + (static_cast<std::int64_t>(b) * a.heads + h) * a.lora;
  const float* uv =
      a.kv_b + (static_cast<std::int64_t>(h) * (a.nope + a.v_dim) + a.nope + j) * a.lora;
  float acc = 0.0f;
  for (int c = lane; c < a.lora; c += 32) acc += lat[c] * uv[c];
  acc = warp_sum(acc);
  if (lane == 0) a.out[(static_cast<std::int64_t>(b) * a.heads + h) * a.v_dim + j] = acc;
}

// One thread per token: `active` passes of a max search (the lower expert wins a tie, as the
// twin's stable sort orders them).
__global__ void moe_route_kernel(MoeRouteArgs a) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= a.tokens) return;
  const float* lg = a.logits + static_cast<std::int64_t>(t) * a.experts;
  float* w = a.weights + static_cast<std::int64_t>(t) * a.experts;
  for (int e = 0; e < a.experts; ++e) w[e] = -1.0f;  // -1: not chosen yet
  const int active = a.active < a.experts ? a.active : a.experts;
  float mx = -INFINITY;
  for (int i = 0; i < active; ++i) {
    int best = -1;
    for (int e = 0; e < a.experts; ++e)
      if (w[e] < 0.0f && (best < 0 || lg[e] > lg[best])) best = e;
    w[best] = 0.0f;  // chosen; weight below
    mx = fmaxf(mx, lg[best]);
  }
  float denom = 0.0f;
  for (int e = 0; e < a.experts; ++e)
    if (w[e] == 0.0f) denom += expf(lg[e] - mx);
  for (int e = 0; e < a.experts; ++e) w[e] = w[e] == 0.0f ? expf(lg[e] - mx) / denom : 0.0f;
}

__global__ void scale_rows_kernel(ScaleRowsArgs a) {
  const int ldx = a.ldx ? a.ldx : a.width;
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.width) {
    const std::int64_t r = i / a.width, c = i % a.width;
    a.x[r * ldx + c] *= a.factors[r * a.factor_stride];
  }
}

__global__ void add_bias_kernel(AddBiasArgs a) {
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.width) {
    a.x[i] += a.bias[i % a.width];
  }
}

__global__ void store_bf16_rows_kernel(StoreBf16RowsArgs a) {
  const int src_stride = a.src_stride ? a.src_stride : a.width;
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.width) {
    const std::int64_t r = i / a.width, c = i % a.width;
    float& v = a.src[r * src_stride + c];
    const std::uint16_t h = float_to_bf16(v);
    v = bf16_to_float(h);
    a.dst[store_row_offset(a, static_cast<int>(r)) + c] = h;
  }
}

// One block per row; 16-byte words where every address and the size allow, else bytes.
__global__ void append_rows_kernel(AppendRowsArgs a) {
  const std::uint8_t* src = a.src + static_cast<std::size_t>(blockIdx.x) * a.bytes;
  std::uint8_t* pool = append_pool_row(a, static_cast<int>(blockIdx.x));
  std::uint8_t* hot = append_hot_row(a, static_cast<int>(blockIdx.x));
  const bool words =
      ((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(pool) |
        reinterpret_cast<std::uintptr_t>(hot) | static_cast<std::uintptr_t>(a.bytes)) &
       15u) == 0;
  if (words) {
    for (int i = static_cast<int>(threadIdx.x); i < a.bytes / 16; i += blockDim.x) {
      const uint4 v = reinterpret_cast<const uint4*>(src)[i];
      reinterpret_cast<uint4*>(pool)[i] = v;
      reinterpret_cast<uint4*>(hot)[i] = v;
    }
    return;
  }
  for (int i = static_cast<int>(threadIdx.x); i < a.bytes; i += blockDim.x) {
    pool[i] = src[i];
    hot[i] = src[i];
  }
}

__global__ void mark_non_finite_kernel(MarkNonFiniteArgs a) {
  HISPARSE_GRID_STRIDE(i, a.n) {
    if (!isfinite(a.x[i])) atomicMin(a.first_site, a.site);  // rare: one atomic per bad value
  }
}

__global__ void indexer_head_weights_kernel(IndexerHeadWeightsArgs a) {
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.heads) {
    a.w[i] = (1.0f + a.share * tanhf(a.w[i])) / static_cast<float>(a.heads);
  }
}

// One block per row: each thread's best (value, lowest index), then a shared-memory tree.
__global__ void argmax_kernel(ArgmaxArgs a) {
  const float* row = a.x + static_cast<std::int64_t>(blockIdx.x) * a.n;
  float best = -INFINITY;
  int at = a.n;  // past the end: loses to every real index
  for (int i = threadIdx.x; i < a.n; i += blockDim.x)
    if (at == a.n || row[i] > best) {  // strict: this thread's earliest index wins a tie
      best = row[i];
      at = i;
    }
  __shared__ float values[kThreads];
  __shared__ int indices[kThreads];
  values[threadIdx.x] = best;
  indices[threadIdx.x] = at;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) {
      const float v = values[threadIdx.x + half];
      const int i = indices[threadIdx.x + half];
      const int mine = indices[threadIdx.x];
      if (i < a.n &&
          (mine >= a.n || v > values[threadIdx.x] || (v == values[threadIdx.x] && i < mine))) {
        values[threadIdx.x] = v;
        indices[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) a.out[blockIdx.x] = indices[0];
}

__global__ void slots_from_physical_kernel(SlotsFromPhysicalArgs a) {
  HISPARSE_GRID_STRIDE(i, static_cast<std::int64_t>(a.rows) * a.width) {
    const std::int64_t r = i / a.width;
    const std::int32_t p = a.physical[i];
    a.slots[i] = p < 0 ? -1 : p - static_cast<std::int32_t>(r) * (a.hot + 1);
  }
}

}  // namespace

void launch_gather_rows(const GatherRowsArgs& a, cudaStream_t s) {
  gather_rows_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.width), kThreads, 0, s>>>(
      a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_blend_queries(const BlendQueriesArgs& a, cudaStream_t s) {
  if (a.rows <= 0) return;
  blend_queries_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * 32), kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
// bf16 weights are held only where the tensor-core kernels take the shape.
static void require_tensor_core_shape(int nope, int rope, int lora, int v_dim) {
  if (!mla_projections_use_tensor_cores(nope, rope, lora, v_dim))
    throw Error("mla projections",
                "nope " + std::to_string(nope) + ", rope " + std::to_string(rope) + ", lora " +
                    std::to_string(lora) + ", v_dim " + std::to_string(v_dim) +
                    " do not fit the tensor-core kernels given bf16 weights",
                "pass fp32 kv_b for this shape (mla_projections_use_tensor_cores)");
}

void launch_mla_absorb(const MlaAbsorbArgs& a, cudaStream_t s) {
  if (a.batch <= 0 || a.heads <= 0) return;
  if (a.uk_t_bf16 != nullptr) {
    require_tensor_core_shape(a.nope, a.rope, a.lora, a.v_dim);
    detail::launch_mla_absorb_tensor_cores(a, s);
    return;
  }
  mla_absorb_kernel<<<dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch)),
                      kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_mla_up_project(const MlaUpProjectArgs& a, cudaStream_t s) {
  if (a.batch <= 0 || a.heads <= 0 || a.v_dim <= 0) return;
  if (a.kv_b_bf16 != nullptr) {
    require_tensor_core_shape(a.nope, 0, a.lora, a.v_dim);
    detail::launch_mla_up_project_tensor_cores(a, s);
    return;
  }
  const unsigned per_block = kThreads / 32;
  const dim3 grid((static_cast<unsigned>(a.v_dim) + per_block - 1) / per_block,
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch));
  mla_up_project_kernel<<<grid, kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_moe_route(const MoeRouteArgs& a, cudaStream_t s) {
  if (a.tokens <= 0) return;
  moe_route_kernel<<<(a.tokens + 63) / 64, 64, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_scale_rows(const ScaleRowsArgs& a, cudaStream_t s) {
  scale_rows_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.width), kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_add_bias(const AddBiasArgs& a, cudaStream_t s) {
  add_bias_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.width), kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_indexer_head_weights(const IndexerHeadWeightsArgs& a, cudaStream_t s) {
  indexer_head_weights_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.heads), kThreads,
                                0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_store_bf16_rows(const StoreBf16RowsArgs& a, cudaStream_t s) {
  if (a.rows <= 0 || a.width <= 0) return;
  store_bf16_rows_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.width), kThreads, 0,
                           s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_append_rows(const AppendRowsArgs& a, cudaStream_t s) {
  if (a.rows <= 0 || a.bytes <= 0) return;
  append_rows_kernel<<<static_cast<unsigned>(a.rows), 128, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_mark_non_finite(const MarkNonFiniteArgs& a, cudaStream_t s) {
  if (a.n <= 0) return;
  mark_non_finite_kernel<<<blocks_for(a.n), kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_argmax(const ArgmaxArgs& a, cudaStream_t s) {
  if (a.rows <= 0) return;
  argmax_kernel<<<a.rows, kThreads, 0, s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
void launch_slots_from_physical(const SlotsFromPhysicalArgs& a, cudaStream_t s) {
  slots_from_physical_kernel<<<blocks_for(static_cast<std::int64_t>(a.rows) * a.width), kThreads, 0,
                               s>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
