// launch_indexer: tensor cores where dim is a multiple of 64 and heads of 8 (at most 64; see
// indexer_mma_kernel below). Else one thread per cached token where the shape allows (dim a
// multiple of 16, at most 64 heads): the request's queries and head weights sit in shared memory (read as broadcasts), the
// thread reads its key 16 channels at a time and keeps one running dot product per head, summed
// in the twin's channel order. Otherwise one warp per token (a warp-wide dot product per head,
// about 10x slower at the GLM-5.1 indexer's 32 x 128: its shuffles dominate).
//
// launch_quantize_index_keys: one thread per key (the new token's key of each request), the
// twin's quantize_index_key() itself.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/block_reduce.cuh"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/common/mma.cuh"
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

// ---- tensor cores: dim a multiple of 64, heads a multiple of 8 (at most 64) -------------------
//
// S[token][head] = key . q with mma.m16n8k16: tokens as the M side (keys straight from global
// memory, 16 bytes per lane and row, fp8 -> bf16 exactly), heads as n8 tiles (the request's
// queries as a bf16 high part and a bf16 residual, two MMAs per fragment, prebuilt in shared
// memory in fragment order so that each lane reads its 16 bytes with no bank conflict). A lane
// holding bytes 16c .. 16c + 15 of a 64-channel piece of rows g and g + 8 feeds them to the MMAs
// as they lie: a dot product may visit channels in any order as long as both operands visit
// them in the same one, and the query fragments are built in that order. Each warp scores 32
// tokens (two m16 tiles) per pass against every head tile; ReLU, the head weights and the head
// sum run on the accumulators (a lane holds heads 8j + 2c, + 1), then across the 4 lanes of a
// row. Sums run in another order than the twin's, so scores match it within float rounding.

constexpr int kMmaWarps = 8;
constexpr int kMmaTokensPerWarp = 32;
constexpr int kMmaTokensPerBlock = 1024;  // 4 passes of the block's 8 warps
constexpr int kMmaMaxHeadTiles = kIndexerMmaMaxHeads / 8;

// 8 fp8 e4m3 codes (two words) -> 4 registers of bf16 pairs, exactly (through f16).
__device__ __forceinline__ void fp8x8_to_bf16(std::uint32_t lo, std::uint32_t hi,
                                              std::uint32_t (&out)[4]) {
  const std::uint32_t words[2] = {lo, hi};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[i] = (__float_as_uint(f.x) >> 16) | (__float_as_uint(f.y) & 0xffff0000u);
  }
}

// Query fragments: entry ((piece * 2 + half) * tiles + j) * 2 + part, lane -> the bf16 pairs of
// head 8 j + g, channels 64 piece + 16 c + 8 half .. + 7 (part 0 the high bf16, 1 the residual).
__device__ __forceinline__ int query_fragment(int piece, int half, int j, int part, int tiles) {
  return (((piece * 2 + half) * tiles + j) * 2 + part) * 32;
}

template <int kTiles>
__global__ void __launch_bounds__(kMmaWarps * 32) indexer_mma_kernel(IndexerArgs a) {
  extern __shared__ uint4 fragments[];
  const int tiles = a.heads / 8, pieces = a.dim / 64;
  float* w = reinterpret_cast<float*>(fragments + pieces * 2 * tiles * 2 * 32);
  const int b = static_cast<int>(blockIdx.y);
  for (int i = static_cast<int>(threadIdx.x); i < pieces * 2 * tiles * 32; i += kMmaWarps * 32) {
    const int lane = i & 31, j = (i >> 5) % tiles, ph = (i >> 5) / tiles;
    const int piece = ph >> 1, half = ph & 1, g = lane >> 2, c = lane & 3;
    const float* q = a.q + (static_cast<std::int64_t>(b) * a.heads + 8 * j + g) * a.dim +
                     64 * piece + 16 * c + 8 * half;
    float v[8];
    *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(q);
    *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(q + 4);
    std::uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) split_bf16_pair(v[2 * p], v[2 * p + 1], hi[p], lo[p]);
    fragments[query_fragment(piece, half, j, 0, tiles) + lane] =
        make_uint4(hi[0], hi[1], hi[2], hi[3]);
    fragments[query_fragment(piece, half, j, 1, tiles) + lane] =
        make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  for (int h = static_cast<int>(threadIdx.x); h < a.heads; h += kMmaWarps * 32)
    w[h] = a.weights[static_cast<std::int64_t>(b) * a.heads + h];
  __syncthreads();
  const std::int64_t n = a.seq_lens[b] < a.capacity ? a.seq_lens[b] : a.capacity;
  float* scores = a.scores + static_cast<std::int64_t>(b) * a.capacity;
  const float* key_scales = a.key_scales + static_cast<std::int64_t>(b) * a.capacity;
  const std::uint8_t* keys = a.keys + static_cast<std::int64_t>(b) * a.capacity * a.dim;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int g = lane >> 2, c = lane & 3;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kMmaTokensPerBlock;
       base < a.capacity; base += static_cast<std::int64_t>(gridDim.x) * kMmaTokensPerBlock) {
    for (int pass = 0; pass < kMmaTokensPerBlock / (kMmaWarps * kMmaTokensPerWarp); ++pass) {
      const std::int64_t t0 =
          base + (static_cast<std::int64_t>(pass) * kMmaWarps + warp) * kMmaTokensPerWarp;
      if (t0 >= a.capacity) break;
      float acc[2][kTiles][4] = {};
      // Rows g, g + 8, 16 + g, 24 + g of the pass: r = 2 m + half.
      std::int64_t row[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) row[r] = t0 + 16 * (r >> 1) + 8 * (r & 1) + g;
      for (int piece = 0; piece < pieces; ++piece) {
        uint4 k[4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
          k[r] = row[r] < n ? __ldcs(reinterpret_cast<const uint4*>(keys + row[r] * a.dim +
                                                                    64 * piece + 16 * c))
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          std::uint32_t kb[4][4];  // per row, bf16 pairs of the half's 8 channels
#pragma unroll
          for (int r = 0; r < 4; ++r)
            fp8x8_to_bf16(half == 0 ? k[r].x : k[r].z, half == 0 ? k[r].y : k[r].w, kb[r]);
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            if (j >= tiles) break;
#pragma unroll
            for (int part = 0; part < 2; ++part) {
              const uint4 q = fragments[query_fragment(piece, half, j, part, tiles) + lane];
#pragma unroll
              for (int m = 0; m < 2; ++m) {
                const std::uint32_t lo[4] = {kb[2 * m][0], kb[2 * m + 1][0], kb[2 * m][1],
                                             kb[2 * m + 1][1]};
                const std::uint32_t hi[4] = {kb[2 * m][2], kb[2 * m + 1][2], kb[2 * m][3],
                                             kb[2 * m + 1][3]};
                mma_bf16_m16n8k16(acc[m][j], lo, q.x, q.y);
                mma_bf16_m16n8k16(acc[m][j], hi, q.z, q.w);
              }
            }
          }
        }
      }
      // acc[m][j][r]: token t0 + 16 m + g + 8 (r >> 1), head 8 j + 2 c + (r & 1).
      float sum[4] = {};  // rows as above
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          if (j >= tiles) break;
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float s = acc[m][j][r];
            sum[2 * m + (r >> 1)] += w[8 * j + 2 * c + (r & 1)] * (s > 0.0f ? s : 0.0f);
          }
        }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      }
      if (c == 0)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (row[r] >= a.capacity) continue;
          scores[row[r]] = row[r] < n ? sum[r] * key_scales[row[r]] : -INFINITY;
        }
    }
  }
}

template <int kTiles>
void launch_indexer_mma(const IndexerArgs& a, cudaStream_t stream) {
  const std::size_t shared = sizeof(uint4) * static_cast<std::size_t>(a.dim / 64) * 2 *
                                 static_cast<std::size_t>(a.heads / 8) * 2 * 32 +
                             sizeof(float) * static_cast<std::size_t>(a.heads);
  allow_dynamic_shared(indexer_mma_kernel<kTiles>, shared);
  const auto blocks = static_cast<unsigned>(
      std::min<std::int64_t>((a.capacity + kMmaTokensPerBlock - 1) / kMmaTokensPerBlock, 1024));
  indexer_mma_kernel<kTiles>
      <<<dim3(blocks, static_cast<unsigned>(a.batch)), kMmaWarps * 32, shared, stream>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();
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
  const std::int64_t at = quantize_dest_row(a, r);
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
  if (indexer_uses_tensor_cores(args.heads, args.dim) &&
      reinterpret_cast<std::uintptr_t>(args.keys) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(args.q) % 16 == 0) {
    const int tiles = args.heads / 8;
    if (tiles <= 1)
      launch_indexer_mma<1>(args, stream);
    else if (tiles <= 2)
      launch_indexer_mma<2>(args, stream);
    else if (tiles <= 4)
      launch_indexer_mma<4>(args, stream);
    else
      launch_indexer_mma<kMmaMaxHeadTiles>(args, stream);
    return;
  }
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
