// Measured-rule DepthPlanner (PlanRule::measured in lib/fathom/depth_planner.hpp): per stream,
// planes bought greedily by query-weighted error removed per bit, from per-channel tables of the
// error left by each read and its least-squares gain (calibrate_plane_reads). One warp per stream
// on the GPU, the same moves in the same order as the sequential CPU twin, so both give the same
// depths and gained queries bit for bit.
#pragma once

#include <cstdint>

#include "core/stream.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::kernels::fathom {

/// Columns of a read table row: depths 0..kPlanes, then the sign read.
inline constexpr int kReadColumns = kPlanes + 2;
HISPARSE_HD int read_column(std::uint8_t depth) {
  return depth == kSignRead ? kPlanes + 1 : read_planes(depth);
}
/// Bits per token of a read: its planes plus the scale's 0.25 bit when it reads the scales.
HISPARSE_HD float read_bits(std::uint8_t depth) {
  return static_cast<float>(read_planes(depth)) + (reads_scale(depth) ? 0.25f : 0.0f);
}
/// The reads a channel can move to, cheapest first (index 0..kMeasuredMoves - 1).
inline constexpr int kMeasuredMoves = kPlanes + 1;
HISPARSE_HD std::uint8_t measured_move(int i) {
  return i == 0 ? kSignRead : static_cast<std::uint8_t>(i);
}

struct MeasuredPlanArgs {
  const float* queries = nullptr;     ///< [streams][heads][channels]
  const float* distortion = nullptr;  ///< [period][channels][kReadColumns]: error left by a read
  const float* gain = nullptr;        ///< [period][channels][kReadColumns]: its gain
  std::int32_t period = 1;            ///< table rows (KV heads); stream s uses row s % period
  std::int32_t streams = 0;
  std::int32_t heads = 0;     ///< query heads per KV head (<= kMaxGroupHeads)
  std::int32_t channels = 0;  ///< head_dim (<= kMaxChannels)
  std::int32_t budget = 0;    ///< plane bits per token, 0..4 * channels
  /// [period], optional: a budget per KV head (stream s plans budgets[s % period] planes, each
  /// 0..budget); null: every stream plans `budget`.
  const std::int32_t* budgets = nullptr;
  std::uint8_t* depths = nullptr;   ///< [streams][channels]: 0..kPlanes or kSignRead
  float* gained_queries = nullptr;  ///< [streams][heads][channels], optional: query x gain

  /// The planes stream s may spend.
  [[nodiscard]] HISPARSE_HD std::int32_t budget_of(std::int32_t s) const {
    return budgets != nullptr ? budgets[s % period] : budget;
  }
};

/// Sum over the heads of q_hj^2 for channel j of stream s, in head order, by fused multiply-adds
/// (the weight both planners rank by).
HISPARSE_HD float measured_weight(const MeasuredPlanArgs& a, std::int32_t s, int j) {
  const float* q = a.queries + static_cast<std::int64_t>(s) * a.heads * a.channels + j;
  float w = 0.0f;
  for (int h = 0; h < a.heads; ++h)
    w = accumulate_q_squared(w, q[static_cast<std::int64_t>(h) * a.channels]);
  return w;
}

/// Best move of one channel (read table row `row`, current depth `from`, `left` planes to spend)
/// that beats `best` (rates strictly above it; cheaper reads first on ties). Returns true and
/// sets best / to when one does.
/// Rates are float, each rounded once per operation (weight x error removed, then / bits), so the
/// kernel and the twin rank moves identically.
HISPARSE_HD bool best_measured_move(float weight, const float* row, std::uint8_t from, int left,
                                    float& best, std::uint8_t& to) {
  bool found = false;
  const float e_from = row[read_column(from)];
  for (int i = 0; i < kMeasuredMoves; ++i) {
    const std::uint8_t next = measured_move(i);
    const int planes = read_planes(next) - read_planes(from);
    const float bits = read_bits(next) - read_bits(from);
    if (bits <= 0.0f || planes < 0 || planes > left) continue;
    const float removed = e_from - row[read_column(next)];
#if defined(__CUDA_ARCH__)
    const float rate = __fdiv_rn(__fmul_rn(weight, removed), bits);
#else
    const float rate = weight * removed / bits;
#endif
    if (rate > best) {
      best = rate;
      to = next;
      found = true;
    }
  }
  return found;
}

#if HISPARSE_WITH_CUDA
/// One warp per stream; no host synchronisation.
void launch_depth_plan_measured(const MeasuredPlanArgs& args, cudaStream_t stream);
#endif
/// CPU twin: per stream, rounds of the best move over the channels in ascending order (ties to
/// the lower channel), until the planes are spent or no move lowers the error; then the gained
/// queries.
void depth_plan_measured_ref(const MeasuredPlanArgs& args);

}  // namespace hisparse::kernels::fathom
