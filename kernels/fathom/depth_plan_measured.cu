#include "kernels/fathom/depth_plan_measured.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per stream; lane l owns channels l, l + 32, ... Each round every lane finds the best
// move among its channels, and the warp keeps the largest rate (ties to the lower channel, as
// the twin's ascending scan does); the owner applies it.
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    depth_plan_measured_kernel(MeasuredPlanArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= a.streams) return;
  const int d = a.channels;
  const float* table = a.distortion + static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
  double weight[PER_LANE];
  std::uint8_t depth[PER_LANE];
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) {
    const int j = lane + 32 * m;
    weight[m] = j < d ? measured_weight(a, s, j) : 0.0;
    depth[m] = 0;
  }
  for (int left = a.budget; left > 0;) {
    double best = 0.0;
    int best_j = -1, planes = 0;
    std::uint8_t best_to = 0;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m) {
      const int j = lane + 32 * m;
      if (j < d &&
          best_measured_move(weight[m], table + static_cast<std::int64_t>(j) * kReadColumns,
                             depth[m], left, best, best_to)) {
        best_j = j;
        planes = read_planes(best_to) - read_planes(depth[m]);
      }
    }
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) {
      const double other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_j = __shfl_xor_sync(0xffffffffu, best_j, offset);
      const int other_to = __shfl_xor_sync(0xffffffffu, static_cast<int>(best_to), offset);
      const int other_planes = __shfl_xor_sync(0xffffffffu, planes, offset);
      if (other_j >= 0 && (best_j < 0 || other > best || (other == best && other_j < best_j))) {
        best = other;
        best_j = other_j;
        best_to = static_cast<std::uint8_t>(other_to);
        planes = other_planes;
      }
    }
    if (best_j < 0) break;  // the same on every lane after the reduction
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m)
      if (lane + 32 * m == best_j) depth[m] = best_to;
    left -= planes;
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
