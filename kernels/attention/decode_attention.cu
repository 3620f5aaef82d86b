// launch_decode_attention: one block of 4 warps per (query head, request). Each warp takes every
// 4th listed row: a warp-wide dot product, then an online softmax (running max, running sum and
// the weighted value sum, v_dim / 32 floats per lane). The warps' partial results are merged at
// the end. A plain kernel: correct against the twin within float rounding (the rows are summed
// in another order), not yet tuned.
//
// launch_group_attention_mass: one block per (KV head, request); for each query head of the
// group, a max pass, a sum pass and an accumulate pass over the rows, each thread owning the same
// rows in all three (no atomics).
#include <string>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/common/block_reduce.cuh"

namespace hisparse::kernels {
namespace {

// One element of a float or a bf16 row, as a float.
__device__ __forceinline__ float element(const float* p, std::ptrdiff_t i) {
  return p[i];
}
__device__ __forceinline__ float element(const std::uint16_t* p, std::ptrdiff_t i) {
  return bf16_to_float(p[i]);
}

constexpr int kWarps = 4;
constexpr int kMaxQkDim = 1024;
constexpr int kMaxValuesPerLane = 16;  // v_dim <= 512

template <class Row>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_kernel(DecodeAttentionArgs a, const Row* k, const Row* v) {
  const int h = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int group = a.q_heads / a.kv_heads, g = h / group;
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : a.qk_dim;
  const std::ptrdiff_t v_stride = a.v_row_stride ? a.v_row_stride : a.v_dim;
  __shared__ float q[kMaxQkDim];
  __shared__ float warp_max_[kWarps], warp_sum_[kWarps];
  extern __shared__ float warp_acc[];  // [kWarps][v_dim]
  const float* qg = a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.qk_dim;
  for (int c = threadIdx.x; c < a.qk_dim; c += blockDim.x) q[c] = qg[c];
  __syncthreads();

  const std::ptrdiff_t base = (static_cast<std::ptrdiff_t>(b) * a.kv_heads + g) * a.capacity;
  const std::int32_t* idx = nullptr;
  std::int64_t entries = 0;
  if (a.indices == nullptr) {
    entries = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
  } else {
    const int sel = a.index_groups == 1 ? 0 : g;
    idx = a.indices + (static_cast<std::ptrdiff_t>(b) * a.index_groups + sel) * a.top_k;
    entries = a.top_k;
  }
  float m = -INFINITY, l = 0.0f, acc[kMaxValuesPerLane];
#pragma unroll
  for (int j = 0; j < kMaxValuesPerLane; ++j) acc[j] = 0.0f;
  for (std::int64_t i = warp; i < entries; i += kWarps) {
    std::int64_t row = i;
    if (idx != nullptr) {
      row = idx[i];
      if (row < 0 || row >= a.capacity) continue;
    }
    const Row* key = k + (base + row) * k_stride;
    float dot = 0.0f;
    for (int c = lane; c < a.qk_dim; c += 32) dot += q[c] * element(key, c);
    const float logit = warp_sum(dot) * a.scale;
    const float next = fmaxf(m, logit);
    const float keep = expf(m - next), p = expf(logit - next);
    l = l * keep + p;
    const Row* value = v + (base + row) * v_stride;
#pragma unroll
    for (int j = 0; j < kMaxValuesPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c < a.v_dim) acc[j] = acc[j] * keep + p * element(value, c);
    }
    m = next;
  }
  if (lane == 0) {
    warp_max_[warp] = m;
    warp_sum_[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kMaxValuesPerLane; ++j) {
    const int c = lane + 32 * j;
    if (c < a.v_dim) warp_acc[warp * a.v_dim + c] = acc[j];
  }
  __syncthreads();
  float total_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) total_max = fmaxf(total_max, warp_max_[w]);
  float denom = 0.0f, factor[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = warp_sum_[w] > 0.0f ? expf(warp_max_[w] - total_max) : 0.0f;
    denom += warp_sum_[w] * factor[w];
  }
  float* out = a.out + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.v_dim;
  for (int c = threadIdx.x; c < a.v_dim; c += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += warp_acc[w * a.v_dim + c] * factor[w];
    out[c] = denom > 0.0f ? v / denom : 0.0f;  // a head with no row reads zero
  }
}

constexpr int kMassThreads = 256;

template <class Row>
__global__ void __launch_bounds__(kMassThreads)
    group_mass_kernel(GroupAttentionMassArgs a, const Row* k) {
  const int g = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int group = a.q_heads / a.kv_heads;
  const std::ptrdiff_t k_stride = a.k_row_stride ? a.k_row_stride : a.qk_dim;
  const std::int64_t n = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
  const std::ptrdiff_t base = (static_cast<std::ptrdiff_t>(b) * a.kv_heads + g) * a.capacity;
  float* mass = a.mass + base;
  __shared__ float q[kMaxQkDim];
  __shared__ float scratch[32];
  auto logit = [&](std::int64_t t) {
    const Row* key = k + (base + t) * k_stride;
    float dot = 0.0f;
    for (int c = 0; c < a.qk_dim; ++c) dot += q[c] * element(key, c);
    return dot * a.scale;
  };
  for (int hh = 0; hh < group; ++hh) {
    const int h = g * group + hh;
    __syncthreads();  // q of the previous head is no longer read
    const float* qh = a.q + (static_cast<std::ptrdiff_t>(b) * a.q_heads + h) * a.qk_dim;
    for (int c = threadIdx.x; c < a.qk_dim; c += blockDim.x) q[c] = qh[c];
    __syncthreads();
    float mx = -INFINITY;
    for (std::int64_t t = threadIdx.x; t < n; t += blockDim.x) mx = fmaxf(mx, logit(t));
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (std::int64_t t = threadIdx.x; t < n; t += blockDim.x) sum += expf(logit(t) - mx);
    sum = block_sum(sum, scratch);
    for (std::int64_t t = threadIdx.x; t < n; t += blockDim.x) {
      const float p = expf(logit(t) - mx) / sum;
      mass[t] = hh == 0 ? p : mass[t] + p;
    }
  }
  for (std::int64_t t = n + threadIdx.x; t < a.capacity; t += blockDim.x) mass[t] = -INFINITY;
}

}  // namespace

void launch_decode_attention(const DecodeAttentionArgs& args, cudaStream_t stream) {
  if (args.qk_dim > kMaxQkDim || args.v_dim > 32 * kMaxValuesPerLane)
    throw Error("decode attention",
                "qk_dim " + std::to_string(args.qk_dim) + " / v_dim " + std::to_string(args.v_dim) +
                    " exceed the CUDA kernel's " + std::to_string(kMaxQkDim) + " / " +
                    std::to_string(32 * kMaxValuesPerLane),
                "use a model with smaller heads");
  if (args.batch <= 0 || args.q_heads <= 0) return;
  const dim3 grid(static_cast<unsigned>(args.q_heads), static_cast<unsigned>(args.batch));
  const std::size_t shared = sizeof(float) * kWarps * static_cast<std::size_t>(args.v_dim);
  if (args.k_bf16 != nullptr)
    decode_attention_kernel<<<grid, kWarps * 32, shared, stream>>>(args, args.k_bf16, args.v_bf16);
  else
    decode_attention_kernel<<<grid, kWarps * 32, shared, stream>>>(args, args.k, args.v);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void launch_group_attention_mass(const GroupAttentionMassArgs& args, cudaStream_t stream) {
  if (args.qk_dim > kMaxQkDim)
    throw Error("group attention mass",
                "qk_dim " + std::to_string(args.qk_dim) + " exceeds the CUDA kernel's " +
                    std::to_string(kMaxQkDim),
                "use a model with smaller heads");
  if (args.batch <= 0 || args.kv_heads <= 0) return;
  const dim3 grid(static_cast<unsigned>(args.kv_heads), static_cast<unsigned>(args.batch));
  if (args.k_bf16 != nullptr)
    group_mass_kernel<<<grid, kMassThreads, 0, stream>>>(args, args.k_bf16);
  else
    group_mass_kernel<<<grid, kMassThreads, 0, stream>>>(args, args.k);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
