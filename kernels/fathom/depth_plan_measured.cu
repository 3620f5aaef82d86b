#include "kernels/fathom/depth_plan_measured.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// A channel's moves by its current read: kReadColumns states (read_column) x kMeasuredMoves
// targets, of which kMoveSlots are moves; their rates are fixed once the weight is known, so
// each warp computes them once into shared memory.
constexpr int kMoveSlots = 15;
__host__ __device__ constexpr int move_slot(int column, int move) {
  // Moves from column c go to reads dearer than it: depth 0 -> sign, 1..4 (slots 0-4); sign
  // (column 5) -> 1..4 (slots 5-8); depth t -> t + 1..4 (slots 9-11, 12-13, 14). Arithmetic, not
  // a table, so that it stays in registers.
  return column == 0             ? move
         : column == kPlanes + 1 ? 4 + move
                                 : 9 + (column - 1) * (8 - column) / 2 + move - column - 1;
}
static_assert(move_slot(kPlanes + 1, kMeasuredMoves - 1) == 8, "sign read -> 4 is slot 8");
static_assert(move_slot(3, 4) == kMoveSlots - 1, "depth 3 -> 4 is the last slot");
static_assert(move_slot(1, 2) == 9 && move_slot(2, 3) == 12 && move_slot(0, 4) == 4, "slots");

// One warp per stream; lane l owns channels l, l + 32, ... Every channel keeps its best move
// (largest rate, the cheaper read on ties, none at rates <= 0) for the planes left; a round takes
// the warp's largest (ties to the lower channel, as the twin's ascending scan does), and only the
// channel that moved, or one whose cached move no longer fits, is evaluated again, from the rates
// in shared memory. The twin evaluates every channel every round; both pick the same move.
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    depth_plan_measured_kernel(MeasuredPlanArgs a) {
  extern __shared__ float move_rates[];  // [warp][PER_LANE][32 lanes][kMoveSlots]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= a.streams) return;
  const int d = a.channels;
  const float* table = a.distortion + static_cast<std::int64_t>(s % a.period) * d * kReadColumns;
  float* rates = move_rates + warp * PER_LANE * 32 * kMoveSlots;
  const auto rate_at = [&](int m, int slot) -> float& {
    return rates[(m * 32 + lane) * kMoveSlots + slot];
  };
  std::uint8_t depth[PER_LANE] = {}, to[PER_LANE] = {};
  float rate[PER_LANE] = {};
  int planes[PER_LANE] = {};  // of the cached move; -1: none
  int left = a.budget;
  const auto evaluate = [&](int m) {
    const int column = read_column(depth[m]);
    float best = 0.0f;
    planes[m] = -1;
    for (int i = 0; i < kMeasuredMoves; ++i) {
      const std::uint8_t next = measured_move(i);
      const int more = read_planes(next) - read_planes(depth[m]);
      if (!is_measured_move(depth[m], next) || more > left) continue;
      const float r = rate_at(m, move_slot(column, i));
      if (r > best) {
        best = r;
        rate[m] = r;
        to[m] = next;
        planes[m] = more;
      }
    }
  };
#pragma unroll
  for (int m = 0; m < PER_LANE; ++m) {
    const int j = lane + 32 * m;
    const float weight = j < d ? measured_weight(a, s, j) : 0.0f;
    const float* row = table + static_cast<std::int64_t>(j < d ? j : 0) * kReadColumns;
    for (int column = 0; column < kReadColumns; ++column) {
      const std::uint8_t from = column <= kPlanes ? static_cast<std::uint8_t>(column) : kSignRead;
      for (int i = 0; i < kMeasuredMoves; ++i)
        if (is_measured_move(from, measured_move(i)))
          rate_at(m, move_slot(column, i)) =
              j < d ? measured_move_rate(weight, row, from, measured_move(i)) : 0.0f;
    }
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
    left -= key & 0xf;
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m)
      if (lane + 32 * m == best_j) {
        depth[m] = static_cast<std::uint8_t>((key >> 4) & 0xff);
        evaluate(m);
      }
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

template <int PER_LANE>
void launch_instance(const MeasuredPlanArgs& args, unsigned grid, cudaStream_t stream) {
  constexpr int smem = kWarpsPerBlock * PER_LANE * 32 * kMoveSlots * sizeof(float);
  if constexpr (smem > 48 * 1024) {
    static const bool opted = [] {  // above the default 48 KB: opt in once
      HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(depth_plan_measured_kernel<PER_LANE>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      return true;
    }();
    (void)opted;
  }
  depth_plan_measured_kernel<PER_LANE><<<grid, 32 * kWarpsPerBlock, smem, stream>>>(args);
}

}  // namespace

void launch_depth_plan_measured(const MeasuredPlanArgs& args, cudaStream_t stream) {
  if (args.streams == 0) return;
  static_assert(kMaxChannels == 256, "the PER_LANE instances below cover 32 x 8 channels");
  const unsigned grid = static_cast<unsigned>((args.streams + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (args.channels <= 32)
    launch_instance<1>(args, grid, stream);
  else if (args.channels <= 64)
    launch_instance<2>(args, grid, stream);
  else if (args.channels <= 128)
    launch_instance<4>(args, grid, stream);
  else
    launch_instance<8>(args, grid, stream);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
