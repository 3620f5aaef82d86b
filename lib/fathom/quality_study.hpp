// Quality study: every selection method at equal cost convention on a synthetic workload.
// Per method: recall of the exact top-k selection, relative L2 error of the attention output
// against dense attention, bits and bytes read per token, active channels per query.
#pragma once

#include <string>
#include <vector>

#include "fathom/depth_planner.hpp"
#include "fathom/synthetic_keys.hpp"

namespace hisparse::fathom {

struct QualityConfig {
  SyntheticKeySpec workload;  ///< one KV head; `kv_heads` seeds are averaged
  int kv_heads = 2;
  int top_k = 256;
  int sinks = 4;
  int recent = 32;
  std::vector<MethodSpec> methods;  ///< empty: default_methods()
  /// Also run every fathom and fixed-channel method in the keys' KLT basis (rows "fathom-klt-B",
  /// "fixed-klt-32ch"): for models without QK-norm, whose key channels are correlated.
  bool klt = false;
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

/// Fathom 40/48/64/80/128, full 4-bit, fixed 32 channels, SparQ r = 16 and 32, and the oracle.
[[nodiscard]] std::vector<MethodSpec> default_methods();
[[nodiscard]] std::vector<QualityRow> quality_study(const QualityConfig& config);
/// A Markdown table of the rows.
[[nodiscard]] std::string format_quality_table(const std::vector<QualityRow>& rows);
/// The methods a config runs: config.methods (or default_methods()), then with config.klt the KLT
/// twin of every fathom and fixed-channel method that is not one already.
[[nodiscard]] std::vector<MethodSpec> study_methods(const QualityConfig& config);
/// Bits Fathom needs to reach `error` (log-linear interpolation over the Fathom rows of the given
/// basis, plain or KLT; the largest Fathom bits when no Fathom row reaches it, 0 when there is
/// none).
[[nodiscard]] double fathom_bits_at_error(const std::vector<QualityRow>& rows, double error,
                                          bool klt = false);

}  // namespace hisparse::fathom
