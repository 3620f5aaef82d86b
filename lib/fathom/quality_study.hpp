// Quality study: every selection method at equal cost convention on a synthetic workload.
// Per method: recall of the exact top-k selection, relative L2 error of the attention output
// against dense attention, bits and bytes read per token, active channels per query.
// Every plane-scanned method (Fathom and the comparison scans) is scored the way the shipped scan
// scores: plane_scores_quantized_ref, the 8-bit-weight integer sums that the CUDA kernel and
// plane_scan_select_ref compute bit for bit. QualityConfig::float_scores switches to REFERENCE.md's
// float formula (the definition the scan approximates), for a definition-vs-shipped comparison.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fathom/depth_planner.hpp"
#include "fathom/synthetic_keys.hpp"

namespace hisparse::fathom {

struct QualityConfig {
  SyntheticKeySpec workload;  ///< one KV head; `kv_heads` seeds are averaged
  int kv_heads = 2;
  /// Where KV head i's keys, values and queries come from. Empty: make_synthetic_keys(workload)
  /// with seed workload.seed + i * 1000003. A replay of captured tensors sets it
  /// (ReplayStudySource in lib/model/replay_study.hpp); `workload` is then unused, and each
  /// head's shape, steps and calibration are the ones in its data's spec.
  std::function<SyntheticKeys(int kv_head)> source;
  int top_k = 256;
  int sinks = 4;
  int recent = 32;
  std::vector<MethodSpec> methods;  ///< empty: default_methods()
  /// Also run every fathom and fixed-channel method in the keys' KLT basis (rows "fathom-klt-B",
  /// "fixed-klt-32ch"): for models without QK-norm, whose key channels are correlated.
  bool klt = false;
  /// Store every scanned method's keys minus their calibration mean (KeyCentre); the oracle and
  /// the attention read the original keys.
  bool centre_keys = false;
  /// Score with plane_scores_ref (float weights, the definition) instead of the shipped scan's
  /// 8-bit-weight scores.
  bool float_scores = false;
  /// KV heads studied at once (0: every hardware thread). The figures do not depend on it: the
  /// heads' samples are summed in head order.
  int threads = 0;
  /// When positive, every head is scored on its last N held-out calibration query steps instead
  /// of its test queries: the curves per_head_allocation chooses per-head budgets on.
  int score_calibration_steps = 0;
};

/// What the dense attention of a workload looks like, averaged over KV heads, steps and query
/// heads: the properties that decide how much any top-k selection can lose.
struct AttentionStats {
  double entropy = 0;        ///< nats, of each head's softmax over all tokens
  double sink_mass = 0;      ///< softmax mass on the first `sinks` tokens
  double recent_mass = 0;    ///< mass on the last `recent` tokens
  double selected_mass = 0;  ///< mass on the exact top-k selection (the oracle's union)
  double top1_mass = 0;      ///< largest single weight outside the sinks
};

struct QualityRow {
  MethodSpec method;
  std::string name;
  double bits_per_token = 0;   ///< planes + 0.25 per active channel (oracle: 16 per channel)
  double bytes_per_token = 0;  ///< bits / 8
  double active_channels = 0;  ///< mean per query
  double recall = 0;           ///< |selected & exact top-k selection| / |exact top-k selection|
  double attention_error = 0;  ///< mean over queries and heads of ||o - o_dense|| / ||o_dense||
};

/// The synthetic spec of study head `kv_head`: `workload` seeded workload.seed + kv_head x 1000003
/// (a synthetic study's KV heads, and `hisparse-bench capture`'s layer x KV head heads).
[[nodiscard]] SyntheticKeySpec study_head_spec(const SyntheticKeySpec& workload, int kv_head);
/// Fathom 32/40/48/56/64/80/96/128, full 4-bit, fixed 32 channels, SparQ r = 16 and 32, and the
/// oracle.
[[nodiscard]] std::vector<MethodSpec> default_methods();
[[nodiscard]] std::vector<QualityRow> quality_study(const QualityConfig& config);
/// Host bytes one KV head holds while it is studied, about 10 per (token, channel): keys and values
/// in bf16, centred and KLT-rotated copies, two plane stores and the scores (measured at 128K
/// tokens: 4.8 B plain, 9 B with --klt --centre-keys).
inline constexpr double kStudyBytesPerTokenChannel = 10.0;
/// Threads for QualityConfig::threads: `requested` when positive, else the hardware threads, but
/// no more than keep the heads in flight within half of `free_bytes` (at least 1).
[[nodiscard]] int study_threads(int requested, unsigned hardware, std::size_t free_bytes,
                                std::int64_t tokens, int channels);
/// The study's rows, and the same rows over each group of `group_heads` consecutive KV heads
/// alone (a layer of a replayed capture: ReplayStudySource numbers its heads layer by layer); no
/// groups when group_heads is 0. Every mean sums its samples in head and step order.
struct QualityResult {
  std::vector<QualityRow> rows;
  std::vector<std::vector<QualityRow>> groups;
};
[[nodiscard]] QualityResult quality_study_grouped(const QualityConfig& config, int group_heads);
/// AttentionStats of the config's workload (same KV heads and steps as quality_study).
[[nodiscard]] AttentionStats attention_stats(const QualityConfig& config);
/// A Markdown table of the rows.
[[nodiscard]] std::string format_quality_table(const std::vector<QualityRow>& rows);
/// The methods a config runs: config.methods (or default_methods()), then with config.klt the KLT
/// twin of every fathom and fixed-channel method that is not one already.
[[nodiscard]] std::vector<MethodSpec> study_methods(const QualityConfig& config);
/// Bits Fathom needs to reach `error`: over the Fathom rows of the given basis (plain or KLT),
/// sorted by bits, the point beyond which every row is at or below `error`, log-linear
/// interpolated between the last row above it and the next one. Taking the last crossing, not the
/// first, credits no dip of a noisy curve. The smallest Fathom bits when every row reaches it, the
/// largest when the largest does not, 0 when there is no Fathom row.
[[nodiscard]] double fathom_bits_at_error(const std::vector<QualityRow>& rows, double error,
                                          bool klt = false);

/// Mean bits per token at which the KV heads reach the mean attention error `error` when each head
/// may take its own budget: the best split of a mean budget over the heads, chosen knowing every
/// head's error curve (the Fathom rows of `rule` and basis in per_head[h], one entry per head).
/// Each head's (bits, error) points are replaced by their lower convex hull (a head may mix two
/// budgets), and hull segments are taken steepest first, which is the Lagrangian optimum of the
/// relaxation. An upper bound on what any cross-head allocation could gain over equal budgets, not
/// a planner: a real one would have to predict the curves. nullopt when a head has no such row or
/// the largest budgets do not reach `error`; the least mean bits when the smallest already do.
[[nodiscard]] std::optional<double> per_head_allocation_bits(
    const std::vector<std::vector<QualityRow>>& per_head, double error, PlanRule rule,
    bool klt = false);
/// A split chosen on one set of curves and scored on another: each head's budgets are picked on
/// `choose_on` (e.g. the study run on held-out calibration queries), and the mean bits and error
/// of each split are those of the same budgets in `score_on` (the test queries). The splits are
/// the Lagrangian optima of the chosen curves, in order of falling chosen error; `bits` is where
/// the scored error last falls to `error`, linear between two splits, and `budgets` each head's
/// budget in the first split that reaches it (whole budgets, no mixing: their mean bits are at or
/// above `bits`). A deployable form: fixed per-head budgets calibrated offline. Rows are matched
/// by MethodSpec::budget; nullopt when the head counts differ, a budget is missing or the error
/// is not reached. For a replayed capture, heads are numbered layer by layer. With choose_on ==
/// score_on, `bits` is per_head_allocation_bits.
struct HeadAllocation {
  double bits = 0;
  std::vector<int> budgets;  ///< MethodSpec::budget per head
};
[[nodiscard]] std::optional<HeadAllocation> per_head_allocation(
    const std::vector<std::vector<QualityRow>>& choose_on,
    const std::vector<std::vector<QualityRow>>& score_on, double error, PlanRule rule,
    bool klt = false);
/// The splits of that same path at given mean budgets, for decode runs that sweep the budget:
/// for each mean M in `means`, the last split on the path of `choose_on` whose mean
/// MethodSpec::budget over the heads is at most M (whole budgets, heads in per_head order). A
/// mean below the path's first split (every head at its smallest useful budget) gets no entry,
/// nor does any mean when the path cannot be built (see per_head_allocation).
[[nodiscard]] std::map<int, std::vector<int>> per_head_splits_at_mean_budgets(
    const std::vector<std::vector<QualityRow>>& choose_on, PlanRule rule, bool klt,
    std::span<const int> means);

}  // namespace hisparse::fathom
