// Prefix sums across a warp and across a block, shared by the swap-in and plane-scan kernels.
#pragma once

#include <cuda_runtime.h>

namespace hisparse::kernels {

/// Inclusive prefix sum of `value` over the 32 lanes of a full warp (every lane calls it).
__device__ __forceinline__ int warp_inclusive_sum(int value, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += up;
  }
  return value;
}

/// Exclusive prefix sum over the block (at most 1024 threads, every thread calls it) with one
/// barrier: every warp reads all the warp totals and scans them itself, instead of warp 0 scanning
/// them between two barriers as BlockScan does. `area` holds 32 ints; the block must pass a
/// barrier before `area` is written again. `total` gets the block's sum.
__device__ __forceinline__ int block_exclusive_sum_one_barrier(int value, int* area, int& total) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int inclusive = warp_inclusive_sum(value, lane);
  if (lane == 31) area[warp] = inclusive;
  __syncthreads();
  const int w = lane < static_cast<int>(blockDim.x >> 5) ? area[lane] : 0;
  const int w_inclusive = warp_inclusive_sum(w, lane);
  total = __shfl_sync(0xffffffffu, w_inclusive, 31);
  return __shfl_sync(0xffffffffu, w_inclusive - w, warp) + inclusive - value;
}

/// Shared ints a BlockScan needs: two areas of 32 warp prefixes plus the block's total.
inline constexpr int kBlockScanScratchInts = 66;

/// Exclusive prefix sums over a block (at most 1024 threads; every thread calls each sum), two
/// barriers each. Calls alternate between the two halves of `scratch`, so back-to-back calls need
/// no barrier in between: a half is rewritten only after two more barriers. A new BlockScan on
/// the same scratch starts on the first half again, so the block must pass a barrier between the
/// last sum of one and the first of the next.
class BlockScan {
 public:
  __device__ explicit BlockScan(int* scratch) : scratch_(scratch) {}

  /// This thread's exclusive prefix of `value`; `total` gets the block's sum.
  __device__ __forceinline__ int exclusive_sum(int value, int& total) {
    int* area = scratch_ + (kBlockScanScratchInts / 2) * (parity_ & 1);
    ++parity_;
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int warp = static_cast<int>(threadIdx.x >> 5);
    const int warps = static_cast<int>(blockDim.x >> 5);
    const int inclusive = warp_inclusive_sum(value, lane);
    if (lane == 31) area[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      const int w = lane < warps ? area[lane] : 0;
      const int w_inclusive = warp_inclusive_sum(w, lane);
      area[lane] = w_inclusive - w;
      if (lane == 31) area[32] = w_inclusive;
    }
    __syncthreads();
    total = area[32];
    return area[warp] + inclusive - value;
  }
  /// exclusive_sum of a 0/1 flag: the thread's rank among the flagged threads.
  __device__ __forceinline__ int exclusive_count(bool flag, int& total) {
    return exclusive_sum(flag ? 1 : 0, total);
  }

 private:
  int* scratch_;
  int parity_ = 0;
};

}  // namespace hisparse::kernels
