// launch_indexer: one thread per cached token where the shape allows (dim a multiple of 16, at most
// 64 heads): the request's queries and head weights sit in shared memory (read as broadcasts), the
// thread reads its key 16 channels at a time and keeps one running dot product per head, summed
// in the twin's channel order. Otherwise one warp per token (a warp-wide dot product per head,
// about 10x slower at the GLM-5.1 indexer's 32 x 128: its shuffles dominate).
//
// launch_quantize_index_keys: one thread per key (the new token's key of each request), the
// twin's quantize_index_key() itself.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/block_reduce.cuh"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/indexer/indexer.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxDim = 256;            // 8 channels per lane
constexpr int kMaxQueryFloats = 16384;  // heads * dim in shared memory (64 KiB)

// Request b's queries [heads][dim] and head weights into shared memory, then a block barrier.
__device__ __forceinline__ void load_request(const IndexerArgs& a, int b, float* q, float* w) {
  for (int i = threadIdx.x; i < a.heads * a.dim; i += blockDim.x)
    q[i] = a.q[static_cast<std::ptrdiff_t>(b) * a.heads * a.dim + i];
  for (int i = threadIdx.x; i < a.heads; i += blockDim.x)
    w[i] = a.weights[static_cast<std::ptrdiff_t>(b) * a.heads + i];
  __syncthreads();
}

__global__ void __launch_bounds__(kWarps * 32) indexer_kernel(IndexerArgs a) {
  extern __shared__ float shared[];  // q [heads][dim], then w [heads]
  float* q = shared;
  float* w = shared + a.heads * a.dim;
  const int b = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  load_request(a, b, q, w);
  const std::int64_t n = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
  float* scores = a.scores + static_cast<std::ptrdiff_t>(b) * a.capacity;
  const std::int64_t per_block = static_cast<std::int64_t>(kWarps) * 4;
  for (std::int64_t t = blockIdx.x * per_block + warp; t < a.capacity;
       t += static_cast<std::int64_t>(gridDim.x) * per_block) {
    for (int rep = 0; rep < 4; ++rep) {
      const std::int64_t tok = t + rep * kWarps;
      if (tok >= a.capacity) break;
      if (tok >= n) {
        if (lane == 0) scores[tok] = -INFINITY;
        continue;
      }
      const std::uint8_t* codes =
          a.keys + (static_cast<std::ptrdiff_t>(b) * a.capacity + tok) * a.dim;
      float key[kMaxDim / 32];
#pragma unroll
      for (int j = 0; j < kMaxDim / 32; ++j) {
        const int c = lane + 32 * j;
        key[j] = c < a.dim ? fp8e4m3_to_float(codes[c]) : 0.0f;
      }
      float acc = 0.0f;
      for (int h = 0; h < a.heads; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxDim / 32; ++j) {
          const int c = lane + 32 * j;
          if (c < a.dim) dot += q[h * a.dim + c] * key[j];
        }
        dot = warp_sum(dot);
        acc += w[h] * (dot > 0.0f ? dot : 0.0f);
      }
      if (lane == 0)
        scores[tok] = acc * a.key_scales[static_cast<std::ptrdiff_t>(b) * a.capacity + tok];
    }
  }
}

constexpr int kTokenThreads = 128;
constexpr int kTokenMaxHeads = 64;

__global__ void __launch_bounds__(kTokenThreads) indexer_token_kernel(IndexerArgs a) {
  extern __shared__ float shared[];  // q [heads][dim], then w [heads]
  float* q = shared;
  float* w = shared + a.heads * a.dim;
  const int b = static_cast<int>(blockIdx.y);
  load_request(a, b, q, w);
  const std::int64_t n = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
  float* scores = a.scores + static_cast<std::ptrdiff_t>(b) * a.capacity;
  for (std::int64_t tok = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       tok < a.capacity; tok += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (tok >= n) {
      scores[tok] = -INFINITY;
      continue;
    }
    const std::uint8_t* codes =
        a.keys + (static_cast<std::ptrdiff_t>(b) * a.capacity + tok) * a.dim;
    float dot[kTokenMaxHeads];
#pragma unroll
    for (int h = 0; h < kTokenMaxHeads; ++h) dot[h] = 0.0f;
    for (int i0 = 0; i0 < a.dim; i0 += 16) {
      const uint4 raw = *reinterpret_cast<const uint4*>(codes + i0);
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
      float key[16];
#pragma unroll
      for (int i = 0; i < 16; ++i)
        key[i] = fp8e4m3_to_float(static_cast<std::uint8_t>(words[i / 4] >> (8 * (i % 4))));
#pragma unroll
      for (int h = 0; h < kTokenMaxHeads; ++h) {
        if (h >= a.heads) break;
        const float4* qh = reinterpret_cast<const float4*>(q + h * a.dim + i0);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const float4 qv = qh[v];
          dot[h] += qv.x * key[4 * v];
          dot[h] += qv.y * key[4 * v + 1];
          dot[h] += qv.z * key[4 * v + 2];
          dot[h] += qv.w * key[4 * v + 3];
        }
      }
    }
    float acc = 0.0f;
#pragma unroll
    for (int h = 0; h < kTokenMaxHeads; ++h) {
      if (h >= a.heads) break;
      acc += w[h] * (dot[h] > 0.0f ? dot[h] : 0.0f);
    }
    scores[tok] = acc * a.key_scales[static_cast<std::ptrdiff_t>(b) * a.capacity + tok];
  }
}

__global__ void quantize_keys_kernel(QuantizeIndexKeysArgs a) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= a.rows) return;
  const std::int64_t at = static_cast<std::int64_t>(r) * a.dest_row_stride + a.dest_offset;
  quantize_index_key(a.keys + static_cast<std::ptrdiff_t>(r) * a.key_stride, a.dim,
                     a.codes + at * a.dim, a.scales + at);
}

}  // namespace

void launch_indexer(const IndexerArgs& args, cudaStream_t stream) {
  if (args.dim > kMaxDim || args.heads * args.dim > kMaxQueryFloats)
    throw Error("DSA indexer",
                std::to_string(args.heads) + " heads x dim " + std::to_string(args.dim) +
                    " exceed the CUDA kernel's dim " + std::to_string(kMaxDim) + " / " +
                    std::to_string(kMaxQueryFloats) + " query floats",
                "use a model with a smaller indexer");
  if (args.batch <= 0 || args.capacity <= 0) return;
  const std::size_t shared = sizeof(float) * static_cast<std::size_t>(args.heads) *
                             (static_cast<std::size_t>(args.dim) + 1);
  if (args.dim % 16 == 0 && args.heads <= kTokenMaxHeads &&
      reinterpret_cast<std::uintptr_t>(args.keys) % 16 == 0) {
    allow_dynamic_shared(indexer_token_kernel, shared);
    const auto blocks = static_cast<unsigned>(
        std::min<std::int64_t>((args.capacity + kTokenThreads - 1) / kTokenThreads, 1024));
    indexer_token_kernel<<<dim3(blocks, static_cast<unsigned>(args.batch)), kTokenThreads, shared,
                           stream>>>(args);
    HISPARSE_CUDA_CHECK_LAUNCH();
    return;
  }
  const std::int64_t per_block = kWarps * 4;
  const auto blocks = static_cast<unsigned>(
      std::min<std::int64_t>((args.capacity + per_block - 1) / per_block, 4096));
  allow_dynamic_shared(indexer_kernel, shared);
  indexer_kernel<<<dim3(blocks, static_cast<unsigned>(args.batch)), kWarps * 32, shared, stream>>>(
      args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void launch_quantize_index_keys(const QuantizeIndexKeysArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return;
  quantize_keys_kernel<<<(args.rows + 127) / 128, 128, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
