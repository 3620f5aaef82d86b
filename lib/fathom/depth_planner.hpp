// DepthPlanner: per (sequence, KV head) and step, how many planes of each channel the scan reads.
// Fathom spends a bit budget by reverse water-filling over g_j = Var(k_j) * sum_h q_hj^2 (bisection
// on theta on the GPU, the integer greedy form on the CPU twin; they agree except at exact ties).
// The comparison methods are depth plans too, so one scan, one selection and one cost convention
// serve every method: full 4-bit scan, a fixed calibrated channel set at 4 bits (Double-Sparsity-
// like), SparQ-style top-|q| channels at 4 bits, and the exact top-k oracle (no planes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/depth_plan_measured.hpp"

namespace hisparse::fathom {

enum class ScanMethod { fathom, full_scan, fixed_channels, sparq, oracle };

/// How Fathom spends its plane budget on one query.
///  - paper: REFERENCE.md's rule, depth_j = round(log4(g_j / theta)) with g_j = Var(k_j) x
///    sum_h q_hj^2. It assumes that every plane cuts a channel's error variance by 4.
///  - measured (planned on the host: quality study, FathomSelector, decode runs with
///    `fathom: {rule: measured}`): the same query weights sum_h q_hj^2, but each channel's
///    error variance at depths 0..4 measured on the calibration keys through the real quantizer
///    (calibrate_plane_reads), and planes bought greedily by weighted error removed per bit (a
///    channel's first plane also pays its 0.25-bit scale) over each channel's lower convex hull.
///    The read at each depth is scored with its least-squares gain (the query weight times
///    PlaneReadCalibration::gain). A channel may also be read by its sign alone, without its
///    block scales (kSignRead: 1 bit instead of 1.25), where that removes more error per bit.
///    Why: with block-absmax scales the first plane's midpoint read removes about half of a
///    channel's variance, not three quarters, a channel whose range a bias widens can lose by
///    being read shallowly, and a one-bit read hardly needs the per-block magnitude.
enum class PlanRule { paper, measured };
/// "paper" / "measured" (scenario key fathom.rule, results' fathom_rule).
[[nodiscard]] const char* plan_rule_name(PlanRule rule) noexcept;

struct MethodSpec {
  ScanMethod method = ScanMethod::fathom;
  int budget = 48;    ///< fathom: plane bits per token
  int channels = 32;  ///< fixed_channels / sparq: channels read at 4 bits
  bool klt = false;   ///< plan and scan in the keys' KLT basis (quality study; not the oracle)
  PlanRule rule = PlanRule::paper;  ///< fathom only
  /// "fathom-48", "full-4bit", "fixed-32ch", "sparq-16", "oracle"; with klt "fathom-klt-48",
  /// "full-klt-4bit", "fixed-klt-32ch", "sparq-klt-16".
  [[nodiscard]] std::string name() const;
};

/// Bits per token of a plan in the shared cost convention: planes plus 0.25 bit of scale per
/// active channel that reads its scales (REFERENCE.md section 2; sign reads do not). The oracle
/// reads bf16 keys: 16 bits per channel.
[[nodiscard]] double plan_bits(std::span<const std::uint8_t> depths);
[[nodiscard]] int active_channels(std::span<const std::uint8_t> depths);

class DepthPlanner {
 public:
  explicit DepthPlanner(Backend backend) : backend_(backend) {}
  /// Fathom depths for every stream; pointers in the backend's memory. CUDA: the bisection kernel
  /// (no host synchronisation). CPU: the greedy integer form.
  void plan(const kernels::fathom::DepthPlanArgs& args, NativeStream stream = nullptr) const;
  /// PlanRule::measured for every stream (tables from pack_read_tables); pointers in the
  /// backend's memory. CUDA: one warp per stream, no host synchronisation. CPU: the twin. Both
  /// give the same depths and gained queries.
  void plan_measured(const kernels::fathom::MeasuredPlanArgs& args,
                     NativeStream stream = nullptr) const;
  [[nodiscard]] Backend backend() const noexcept { return backend_; }

 private:
  Backend backend_;
};

/// How each channel reads at depth 0..kPlanes, measured over calibration tokens [skip, skip +
/// count) of bf16 keys [tokens][channels], quantized as the plane store does (whole 64-token
/// blocks from the first at or after skip, fp16 absmax scales, midpoint reads r). Tables are
/// [channels][kPlanes + 1]; depth 0 reads nothing (r = 0). Too few tokens after skip: every
/// whole block; not one whole block: the paper's model (Var(k) 4^-t, gains 1).
struct PlaneReadCalibration {
  /// Least-squares gain of the read, Cov(k, r) / Var(r) (1 where r does not vary): a query
  /// weight times gain[j][d] scores channel j as if its read at depth d were gain x r.
  std::vector<float> gain;
  /// Error variance of the gained read, Var(k) - Cov(k, r)^2 / Var(r); Var(k) at depth 0.
  std::vector<float> distortion;
  /// The same two for a sign read (kSignRead: the top plane without the block scale, r = +-1/2),
  /// [channels]. The gain then carries the channel's typical magnitude as well.
  std::vector<float> sign_gain;
  std::vector<float> sign_distortion;
  /// Gain and error variance of channel j read with depth byte `depth` (0..kPlanes or kSignRead).
  [[nodiscard]] float gain_of(int j, std::uint8_t depth) const;
  [[nodiscard]] float distortion_of(int j, std::uint8_t depth) const;
};
[[nodiscard]] PlaneReadCalibration calibrate_plane_reads(const std::uint16_t* keys,
                                                         std::int64_t tokens, int channels,
                                                         int skip, int count);

/// The read tables the measured planner takes (kernels::fathom::MeasuredPlanArgs): for each
/// calibration, [channels][kReadColumns] of distortion_of() and gain_of() (depths 0..kPlanes,
/// then the sign read). Throws naming the calibration when a table has the wrong size.
void pack_read_tables(std::span<const PlaneReadCalibration> reads, int channels,
                      std::vector<float>& distortion, std::vector<float>& gain);
/// Packed read tables of `period` calibrations in a backend's memory: what
/// DepthPlanner::plan_measured reads. Built once per layer (the calibrations do not change while
/// decoding), so a decode step plans without packing or copying them.
class ReadTables {
 public:
  ReadTables(Backend backend, std::span<const PlaneReadCalibration> reads, int channels);
  [[nodiscard]] const float* distortion() const noexcept { return distortion_.device_data(); }
  [[nodiscard]] const float* gain() const noexcept { return gain_.device_data(); }
  [[nodiscard]] std::int32_t period() const noexcept { return period_; }
  [[nodiscard]] int channels() const noexcept { return channels_; }
  [[nodiscard]] Backend backend() const noexcept { return backend_; }

 private:
  Backend backend_;
  Buffer<float> distortion_, gain_;
  std::int32_t period_ = 0;
  int channels_ = 0;
};

/// PlanRule::measured: depth bytes (0..kPlanes or kSignRead) of one stream for `budget` planes,
/// from queries [heads][channels] (the CPU twin of DepthPlanner::plan_measured).
void depth_plan_measured(const float* queries, int heads, int channels,
                         const PlaneReadCalibration& reads, int budget, std::uint8_t* depths);
/// PlanRule::measured: turns queries [heads][channels] (in place) into the ones the scan reads
/// with, each channel's weight times the gain of its read at its depth.
void apply_read_gains(float* queries, int heads, int channels, const PlaneReadCalibration& reads,
                      std::span<const std::uint8_t> depths);

/// Checks a budget against head_dim; throws Error naming `where` otherwise.
void check_budget(int budget, int channels, const std::string& where);

/// Budgets of one layer's KV heads from a per-head budget table (e.g. `quality
/// --calibrated-budgets`' calibrated_head_budgets): `table` holds [rows][kv_heads] budgets layer
/// by layer, and model layer `layer` uses row layer % rows. At mean budget `budget` each head
/// keeps its share of the table: round(budget x t / mean(table)), clamped to 0..max_budget. Why
/// shares, not differences from the mean: heads differ mostly in how many channels carry their
/// scores, and a water-filling split grows each head's planes with that count; in decode runs on
/// a synthetic capture, shares beat equal budgets both below and above the calibrated mean, while
/// differences starved the small heads below it (reports/fathom_quality.md "A budget per KV
/// head"). Throws Error naming `where` for an empty or all-zero table, or one whose size is not a
/// multiple of kv_heads.
[[nodiscard]] std::vector<std::int32_t> head_budgets(std::span<const int> table, int kv_heads,
                                                     int layer, int budget, int max_budget,
                                                     const std::string& where);

/// Depths of one stream for a comparison method (host). `queries` [heads][channels];
/// `fixed_set` is the calibrated channel set of fixed_channels.
[[nodiscard]] std::vector<std::uint8_t> method_depths(const MethodSpec& method,
                                                      const float* queries, int heads, int channels,
                                                      std::span<const float> variance,
                                                      std::span<const int> fixed_set,
                                                      const PlaneReadCalibration* reads = nullptr);

/// Offline channel choice of the fixed-channel method: the `count` channels with the largest
/// calibration Var(k_j) * mean q_j^2 over the calibration queries ([n][channels]).
[[nodiscard]] std::vector<int> calibrate_fixed_channels(std::span<const float> variance,
                                                        std::span<const float> calibration_queries,
                                                        int channels, int count);

}  // namespace hisparse::fathom
