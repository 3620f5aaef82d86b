#include "kernels/fathom/depth_plan_measured.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per stream; lane l owns channels l, l + 32, ... Every channel keeps its best move
// (largest rate, the cheaper read on ties, none at rates <= 0) for the planes left; a round takes
// the warp's largest (ties to the lower channel, as the twin's ascending scan does), and only the
// channel that moved, or one whose cached move no longer fits, is evaluated again. The twin
// evaluates every channel every round; both pick the same move.
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    depth_plan_measured_kernel(MeasuredPlanArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= a.streams) return;
  const int d = a.channels;
  const float* table = a.distortion + static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
  float weight[PER_LANE] = {}, rate[PER_LANE] = {};
  std::uint8_t depth[PER_LANE] = {}, to[PER_LANE] = {};
  int planes[PER_LANE] = {};  // of the cached move; -1: none
  int left = a.budget;
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
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) {
    const int j = lane + 32 * m;
    weight[m] = j < d ? measured_weight(a, s, j) : 0.0f;
    depth[m] = 0;
    evaluate(m);
  }
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
