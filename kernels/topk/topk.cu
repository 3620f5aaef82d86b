// launch_topk: one block per row. A radix select over the scores' order-preserving 32-bit keys
// (four 8-bit passes, a shared histogram each) finds the k-th largest score T and how many of the
// entries equal to T are taken; a final pass in position order writes every entry above T and
// the first of those equal to T (ties go to the lower position), so the output is ascending, as
// the twin's. Exact: the same positions as topk_ref for every input, NaN included.
#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "kernels/common/block_scan.cuh"
#include "kernels/topk/topk.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kThreads = 1024;

// Larger score -> larger key; NaN below every number (-infinity included).
__device__ __forceinline__ std::uint32_t order_key(float score) {
  if (score != score) return 0u;
  if (score == 0.0f) return 0x80000000u;  // -0 ties with +0, as the twin compares them
  const std::uint32_t u = __float_as_uint(score);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(TopkArgs a) {
  const int row = static_cast<int>(blockIdx.x);
  const float* scores = a.scores + static_cast<std::ptrdiff_t>(row) * a.stride;
  std::int32_t* out = a.out + static_cast<std::ptrdiff_t>(row) * a.k;
  const std::int64_t n = a.lengths[row] < a.stride ? a.lengths[row] : a.stride;
  if (n <= a.k) {
    for (std::int64_t i = threadIdx.x; i < a.k; i += blockDim.x)
      out[i] = i < n ? static_cast<std::int32_t>(i) : -1;
    return;
  }
  __shared__ int histogram[256];
  __shared__ std::uint32_t prefix_s;
  __shared__ int need_s;
  std::uint32_t prefix = 0, mask = 0;
  int need = a.k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const std::uint32_t key = order_key(scores[i]);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 0xffu], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, bin = 255;
      for (; bin > 0; --bin) {
        if (above + histogram[bin] >= need) break;
        above += histogram[bin];
      }
      prefix_s = prefix | (static_cast<std::uint32_t>(bin) << shift);
      need_s = need - above;
    }
    __syncthreads();
    prefix = prefix_s;
    need = need_s;
    mask |= 0xffu << shift;
  }
  // prefix is T's key; `need` entries equal to T are taken, the lowest positions first.
  __shared__ int scan_scratch[kBlockScanScratchInts];
  BlockScan scan(scan_scratch);
  int written = 0, equal_seen = 0;
  for (std::int64_t start = 0; start < n; start += blockDim.x) {
    const std::int64_t i = start + threadIdx.x;
    const std::uint32_t key = i < n ? order_key(scores[i]) : 0u;
    const bool above = i < n && key > prefix, equal = i < n && key == prefix;
    int equal_total = 0, taken_total = 0;
    const int equal_rank = scan.exclusive_count(equal, equal_total);
    const bool take = above || (equal && equal_seen + equal_rank < need);
    const int rank = scan.exclusive_count(take, taken_total);
    if (take) out[written + rank] = static_cast<std::int32_t>(i);
    written += taken_total;
    equal_seen += equal_total;
  }
}

}  // namespace

void launch_topk(const TopkArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.k <= 0) return;
  topk_kernel<<<args.rows, kThreads, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
