#include "kernels/fathom/depth_plan_measured.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// Sort key of a channel's move: the rate (orderable bits) first, then the lower channel, then the
// earlier move of the channel; below them the move's target read and planes (for applying it).
__device__ __forceinline__ std::uint64_t move_key(float rate, int channel, int pos, std::uint8_t to,
                                                  int planes) {
  return (static_cast<std::uint64_t>(orderable_key(rate)) << 32) |
         (static_cast<std::uint64_t>(255 - channel) << 24) |
         (static_cast<std::uint64_t>(7 - pos) << 21) | (static_cast<std::uint64_t>(to) << 8) |
         static_cast<std::uint64_t>(planes);
}

// One warp per stream; lane l owns channels l, l + 32, ...
// Prefix: while at least as many planes are left as the widest move of any chain, every move
// fits, so the twin's rounds take the channels' best moves in the order of (rate, lower channel):
// each channel's chain of best moves (rates never rise along it: the best move from a read is its
// steepest descent) merged by that order. The kernel computes every chain, finds by a bitwise
// search on the sort key how far the merged order goes while that many planes are left, and
// applies that prefix at once. Tail: rounds as the twin's, each taking the warp's best move (ties
// to the lower channel), with each channel's best move cached and re-evaluated only when it moved
// or no longer fits.
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    depth_plan_measured_kernel(MeasuredPlanArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= a.streams) return;
  const int d = a.channels;
  const float* table = a.distortion + static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
  std::uint64_t chain[PER_LANE][kMeasuredMoves];  // chain keys (0: no move), in registers
  float weight[PER_LANE] = {}, rate[PER_LANE] = {};
  std::uint8_t depth[PER_LANE] = {}, to[PER_LANE] = {};
  int planes[PER_LANE] = {};  // of the cached move; -1: none
  const int budget = a.budget_of(s);
  int left = budget;
  const auto evaluate = [&](int m) {
    const int j = lane + 32 * m;
    float best = 0.0f;
    std::uint8_t next = 0;
    planes[m] = -1;
    if (j < d && best_measured_move(weight[m], table + static_cast<std::int64_t>(j) * kReadColumns,
                                    depth[m], left, best, next)) {
      rate[m] = best;
      to[m] = next;
      planes[m] = read_planes(next) - read_planes(depth[m]);
    }
  };
  constexpr int kNoLimit = 1 << 20;
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) {
    const int j = lane + 32 * m;
    weight[m] = j < d ? measured_weight(a, s, j) : 0.0f;
    std::uint8_t at = 0;
#pragma unroll
    for (int pos = 0; pos < kMeasuredMoves; ++pos) {
      float best = 0.0f;
      std::uint8_t next = 0;
      std::uint64_t key = 0;
      if (j < d && at != kPlanes &&
          best_measured_move(weight[m], table + static_cast<std::int64_t>(j) * kReadColumns, at,
                             kNoLimit, best, next)) {
        key = move_key(best, j, pos, next, read_planes(next) - read_planes(at));
        at = next;
      }
      chain[m][pos] = key;
    }
  }
  // The prefix: the moves before which at least as many planes are left as the largest move of
  // any chain takes (so every channel's best move fits). h(x) = planes of the moves with key > x
  // never rises with x; y is the largest x with h(x) > budget - that largest move, and the prefix
  // is every move with key > y.
  const auto planes_above = [&](std::uint64_t x) {
    int sum = 0;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m)
#pragma unroll
      for (int pos = 0; pos < kMeasuredMoves; ++pos)
        if (chain[m][pos] > x) sum += static_cast<int>(chain[m][pos] & 0xff);
    return static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(sum)));
  };
  unsigned widest = 0;
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m)
#pragma unroll
    for (int pos = 0; pos < kMeasuredMoves; ++pos)
      widest = max(widest, static_cast<unsigned>(chain[m][pos] & 0xff));
  const int limit = budget - static_cast<int>(__reduce_max_sync(0xffffffffu, widest));
  // Keys differ above bit 21 (rate, channel, move): searching those 43 bits with the bits below
  // set separates the same moves as a search of all 64.
  constexpr std::uint64_t kLowBits = (std::uint64_t{1} << 21) - 1;
  std::uint64_t y = kLowBits;
  for (int b = 63; b >= 21; --b) {
    const std::uint64_t candidate = y | (std::uint64_t{1} << b);
    if (planes_above(candidate) > limit) y = candidate;
  }
  int taken = 0;
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m)
#pragma unroll
    for (int pos = 0; pos < kMeasuredMoves; ++pos)
      if (chain[m][pos] > y) {  // a chain's keys fall along it: its prefix moves come first
        depth[m] = static_cast<std::uint8_t>((chain[m][pos] >> 8) & 0xff);
        taken += static_cast<int>(chain[m][pos] & 0xff);
      }
  left -= static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(taken)));
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) evaluate(m);
  while (left > 0) {
    float best = 0.0f;
    int key = -1;  // channel << 12 | read << 4 | planes of the lane's best move
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m) {
      if (planes[m] > left) evaluate(m);  // planes only run out: a cached move may no longer fit
      if (planes[m] >= 0 && rate[m] > best) {
        best = rate[m];
        key = ((lane + 32 * m) << 12) | (to[m] << 4) | planes[m];
      }
    }
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_key = __shfl_xor_sync(0xffffffffu, key, offset);
      if (other_key >= 0 && (key < 0 || other > best || (other == best && other_key < key))) {
        best = other;
        key = other_key;
      }
    }
    if (key < 0) break;  // the same on every lane after the reduction
    const int best_j = key >> 12;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m)
      if (lane + 32 * m == best_j) {
        depth[m] = static_cast<std::uint8_t>((key >> 4) & 0xff);
        left -= key & 0xf;
        evaluate(m);
      }
    left = __shfl_sync(0xffffffffu, left, best_j % 32);
  }
  const float* gain = a.gain + static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) {
    const int j = lane + 32 * m;
    if (j >= d) continue;
    a.depths[static_cast<std::int64_t>(s) * d + j] = depth[m];
    if (a.gained_queries == nullptr) continue;
    const float g = gain[static_cast<std::int64_t>(j) * kReadColumns + read_column(depth[m])];
    for (int h = 0; h < a.heads; ++h) {
      const std::int64_t at = (static_cast<std::int64_t>(s) * a.heads + h) * d + j;
      a.gained_queries[at] = a.queries[at] * g;
    }
  }
}

}  // namespace

void launch_depth_plan_measured(const MeasuredPlanArgs& args, cudaStream_t stream) {
  if (args.streams == 0) return;
  static_assert(kMaxChannels == 256, "the PER_LANE instances below cover 32 x 8 channels");
  const unsigned grid = static_cast<unsigned>((args.streams + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned threads = 32 * kWarpsPerBlock;
  if (args.channels <= 32)
    depth_plan_measured_kernel<1><<<grid, threads, 0, stream>>>(args);
  else if (args.channels <= 64)
    depth_plan_measured_kernel<2><<<grid, threads, 0, stream>>>(args);
  else if (args.channels <= 128)
    depth_plan_measured_kernel<4><<<grid, threads, 0, stream>>>(args);
  else
    depth_plan_measured_kernel<8><<<grid, threads, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
