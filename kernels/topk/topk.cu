// launch_topk: one block per row. A radix select over the scores' order-preserving 32-bit keys
// (four 8-bit passes, a shared histogram each, its bin found by one warp's scan) finds the k-th
// largest score T and how many of the entries equal to T are taken; a final pass in position
// order writes every entry above T and the first of those equal to T (ties go to the lower
// position), so the output is ascending, as the twin's. Exact: the same positions as topk_ref for
// every input, NaN included.
// Rows up to kMaxSharedKeys scores are read once into shared memory as keys, so the passes read
// shared memory; longer rows are read from global memory (L2) in every pass. The final pass gives
// each warp a contiguous range of positions: per-warp counts, one warp's scan of them, then each
// warp writes its range in order with ballots (two block-wide barriers instead of two scans per
// 1024 positions).
#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/topk/topk.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr std::int64_t kMaxSharedKeys = 49152;  // 192 KB: rows of 32K-token contexts fit
constexpr unsigned kFullMask = 0xffffffffu;

// Larger score -> larger key; NaN below every number (-infinity included).
__device__ __forceinline__ std::uint32_t order_key(float score) {
  if (score != score) return 0u;
  if (score == 0.0f) return 0x80000000u;  // -0 ties with +0, as the twin compares them
  const std::uint32_t u = __float_as_uint(score);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Inclusive sum over lanes 0 .. lane.
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

__global__ void __launch_bounds__(kThreads) topk_kernel(TopkArgs a, bool keys_in_shared) {
  extern __shared__ std::uint32_t cached_keys[];
  __shared__ int histogram[256];
  __shared__ std::uint32_t prefix_s;
  __shared__ int need_s;
  __shared__ int warp_above[kWarps], warp_equal[kWarps], warp_offset[kWarps], warp_take[kWarps];
  const int row = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const float* scores = a.scores + static_cast<std::ptrdiff_t>(row) * a.stride;
  std::int32_t* out = a.out + static_cast<std::ptrdiff_t>(row) * a.k;
  const std::int64_t n = a.lengths[row] < a.stride ? a.lengths[row] : a.stride;
  if (n <= a.k) {
    for (std::int64_t i = tid; i < a.k; i += kThreads)
      out[i] = i < n ? static_cast<std::int32_t>(i) : -1;
    return;
  }
  if (keys_in_shared)
    for (std::int64_t i = tid; i < n; i += kThreads) cached_keys[i] = order_key(scores[i]);
  auto key_at = [&](std::int64_t i) {
    return keys_in_shared ? cached_keys[i] : order_key(__ldg(scores + i));
  };

  std::uint32_t prefix = 0, mask = 0;
  int need = a.k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) histogram[i] = 0;
    __syncthreads();  // also publishes the cached keys before the first pass
    for (std::int64_t i = tid; i < n; i += kThreads) {
      const std::uint32_t key = key_at(i);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 0xffu], 1);
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds bins 255 - 8l down to 248 - 8l; the bin where `need` falls
      int count[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += count[j] = histogram[255 - 8 * lane - j];
      const int inclusive = warp_inclusive_sum(sum, lane);
      int above = inclusive - sum;
      if (above < need && need <= inclusive) {  // exactly one lane: the matched keys >= need
        int bin = 255 - 8 * lane;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          bin = 255 - 8 * lane - j;
          if (above + count[j] >= need) break;
          above += count[j];
        }
        prefix_s = prefix | (static_cast<std::uint32_t>(bin) << shift);
        need_s = need - above;
      }
    }
    __syncthreads();
    prefix = prefix_s;
    need = need_s;
    mask |= 0xffu << shift;
  }

  // prefix is T's key; `need` entries equal to T are taken, the lowest positions first.
  const std::int64_t span = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
  const std::int64_t w0 = warp * span, w1 = w0 + span < n ? w0 + span : n;
  int above_count = 0, equal_count = 0;
  for (std::int64_t base = w0; base < w1; base += 32) {
    const std::int64_t i = base + lane;
    const std::uint32_t key = i < w1 ? key_at(i) : 0u;
    above_count += __popc(__ballot_sync(kFullMask, i < w1 && key > prefix));
    equal_count += __popc(__ballot_sync(kFullMask, i < w1 && key == prefix));
  }
  if (lane == 0) {
    warp_above[warp] = above_count;
    warp_equal[warp] = equal_count;
  }
  __syncthreads();
  if (warp == 0) {  // each warp's share of the ties, then where its positions go
    const int equal = warp_equal[lane];
    const int equal_before = warp_inclusive_sum(equal, lane) - equal;
    const int take = max(0, min(need - equal_before, equal));
    const int taken = warp_above[lane] + take;
    warp_offset[lane] = warp_inclusive_sum(taken, lane) - taken;
    warp_take[lane] = take;
  }
  __syncthreads();
  int offset = warp_offset[warp], ties_left = warp_take[warp];
  const unsigned below_lane = (1u << lane) - 1u;
  for (std::int64_t base = w0; base < w1; base += 32) {
    const std::int64_t i = base + lane;
    const std::uint32_t key = i < w1 ? key_at(i) : 0u;
    const bool above = i < w1 && key > prefix, equal = i < w1 && key == prefix;
    const unsigned equal_mask = __ballot_sync(kFullMask, equal);
    const bool take = above || (equal && __popc(equal_mask & below_lane) < ties_left);
    const unsigned take_mask = __ballot_sync(kFullMask, take);
    if (take) out[offset + __popc(take_mask & below_lane)] = static_cast<std::int32_t>(i);
    offset += __popc(take_mask);
    ties_left -= min(__popc(equal_mask), ties_left);
  }
}

}  // namespace

void launch_topk(const TopkArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.k <= 0) return;
  const bool keys_in_shared = args.stride <= kMaxSharedKeys;
  const std::size_t shared =
      keys_in_shared ? static_cast<std::size_t>(args.stride) * sizeof(std::uint32_t) : 0;
  allow_dynamic_shared(topk_kernel, shared);
  topk_kernel<<<args.rows, kThreads, shared, stream>>>(args, keys_in_shared);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
