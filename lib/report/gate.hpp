// The regression gate (`hisparse-bench gate BASELINE RESULTS...`, and `compare`, its one-metric
// form): judges new results against a committed baseline, metric by metric, as a gate file says.
//
// Two kinds of metrics are judged differently:
// - deterministic ones, the same for a fixed seed on any machine (hits, misses, bytes moved,
//   recall, next tokens...): equal within a stated relative tolerance, else `changed` (or
//   `better` / `worse` when the gate file gives a direction). No noise allowance.
// - timings (tokens/s, step time, a microbenchmark's us_per_call): the medians of each side's
//   repetitions; a change smaller than min_effect_pct is `same`; a larger one is `faster` or
//   `slower` when a two-sided Mann-Whitney U test on the repetitions rejects "no difference" at
//   alpha, and `ambiguous` when it cannot. With too few repetitions for the test to ever decide
//   (fewer than 4 a side at alpha 0.05), the change must also exceed the larger spread of the
//   two sides (step-time p10..p90 for a single results point, max-min of the repetitions).
//
// Gate file (BASELINE/gate.yaml):
//
//   baselines:
//     - scenario: ci-gate            # a results.json of this scenario name...
//       file: ci-gate.json           # ...judged against this file (relative to gate.yaml)
//       metrics:
//         misses: exact              # deterministic, no tolerance
//         selection_recall: {tolerance: 1.0e-9, better: higher}
//         output_tokens_per_s: {timing: higher, min_effect_pct: 5, alpha: 0.05}
//     - microbench: swap-in          # Google Benchmark JSON whose cases match this baseline's
//       file: swap-in.json
//       cases: "^swap_in/"           # regular expression (ECMAScript) of the cases gated
//       metrics:
//         us_per_call: {timing: lower, min_effect_pct: 5}
//
// A BASELINE folder without gate.yaml, or a single baseline file, is judged by the default gate:
// every results file by default_gate_metrics(results), every microbenchmark file (pooled as one
// baseline) by us_per_call.
#pragma once

#include <cmath>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse {

enum class GateInputKind { results, microbench };

/// How one metric is judged.
struct GateMetric {
  /// Results: a path under a point's metrics ("hits", "step_ms.median"); microbench: a counter
  /// of the case ("us_per_call", "GBps").
  std::string name;
  bool timing = false;
  /// Timing: required. Deterministic: optional; with one, a change is `better` or `worse`
  /// instead of `changed`, and only `worse` fails.
  enum class Better { none, higher, lower } better = Better::none;
  double min_effect_pct = 5.0;  ///< timing: smaller changes of the median are `same`
  double alpha = 0.05;          ///< timing: the rank test's level
  double tolerance = 0.0;       ///< deterministic: relative difference allowed (0: exact)
  /// false: skipped where the baseline has no such metric (the default gate, which names every
  /// metric a run can write); true: a baseline without it is an error in the gate file.
  bool required = true;
};

/// One baseline of a gate file and how it is judged.
struct GateBaseline {
  GateInputKind kind = GateInputKind::results;
  std::string name;            ///< results: the scenario's name; microbench: a label
  std::filesystem::path file;  ///< the baseline document (may not exist yet: --update writes it)
  /// More documents pooled with `file` as repetitions (the default gate of a folder of
  /// microbenchmark runs).
  std::vector<std::filesystem::path> extra_files;
  std::string cases;  ///< microbench: regular expression of the cases gated ("" all)
  std::vector<GateMetric> metrics;
  std::string where;  ///< "gate.yaml:line:column: baselines[i]", for messages
};

struct GateSpec {
  std::filesystem::path file;  ///< gate.yaml, or "" for the default gate
  std::vector<GateBaseline> baselines;
};

/// The metrics the default gate judges results by: tokens/s (timing, higher is better, 5%) and
/// every deterministic metric a run writes, each exact.
[[nodiscard]] std::vector<GateMetric> default_gate_metrics(GateInputKind kind);

/// Reads BASELINE: a folder holding gate.yaml; a folder without one (its .json files under the
/// default gate); or one baseline file (the default gate). Throws Error naming the file, the
/// key and the fix.
[[nodiscard]] GateSpec load_gate(const std::filesystem::path& baseline);
/// The same for gate.yaml text; `file` names it and relative `file:` keys resolve against its
/// folder.
[[nodiscard]] GateSpec parse_gate(const std::string& yaml_text, const std::filesystem::path& file);

enum class GateVerdict {
  same,          ///< within the tolerance or below the minimum effect
  faster,        ///< timing: significantly better
  slower,        ///< timing: significantly worse (fails)
  ambiguous,     ///< timing: beyond the minimum effect, but the repetitions cannot tell
  better,        ///< deterministic, with a direction: changed for the better
  worse,         ///< deterministic, with a direction: changed for the worse (fails)
  changed,       ///< deterministic: differs from the baseline (fails)
  failed,        ///< ok in the baseline, failed in the new run (fails)
  missing,       ///< in the baseline, not in the new run (fails)
  added,         ///< in the new run only
  not_measured,  ///< null on both sides (recall of a dense point), or failed in the baseline
};
[[nodiscard]] std::string_view name_of(GateVerdict v) noexcept;
/// Whether the verdict fails the gate.
[[nodiscard]] bool fails(GateVerdict v) noexcept;

struct GateRow {
  std::string baseline;  ///< the baseline's name
  std::string item;      ///< the point ("mode=hisparse concurrency=4") or benchmark case
  std::string metric;
  std::string base_text, new_text;  ///< the values as shown (median of the repetitions)
  double base = NAN, next = NAN;    ///< numbers, where the values are numbers
  double delta_pct = NAN;           ///< (NEW - BASE) / BASE
  double noise_pct = NAN;           ///< timing without a usable rank test: the larger spread
  double p_value = NAN;             ///< timing with a usable rank test
  std::size_t base_samples = 0, new_samples = 0;
  GateVerdict verdict = GateVerdict::same;
  std::string note;
};

struct GateOptions {
  /// Judge timings of different devices or backends anyway (a warning instead of exit 2).
  bool allow_different_devices = false;
  /// Judge runs whose resolved scenarios differ (compare's use; the gate refuses them).
  bool allow_different_scenarios = false;
};

/// What one baseline was judged against.
struct GateRun {
  std::string baseline;
  nlohmann::json base, next;  ///< label, backend, device, git revision, start time
  std::vector<std::filesystem::path> inputs;
  std::vector<std::filesystem::path> baseline_files;
};

struct GateOutcome {
  std::vector<GateRun> runs;
  std::vector<GateRow> rows;
  std::vector<std::string> warnings;
  [[nodiscard]] std::size_t count(GateVerdict v) const noexcept;
  [[nodiscard]] bool failed() const noexcept;
};

/// Judges `inputs` (results.json or Google Benchmark JSON files) against the gate's baselines.
/// Each results file is matched to the baseline of its scenario's name, each microbenchmark file
/// to the microbench baseline sharing the most cases with it; several files matched to one
/// baseline are pooled as repetitions. Throws Error (bad input, exit 2) for an unreadable file, a
/// file no baseline matches, a missing baseline file, a schema this build does not read, a
/// resolved scenario that differs from the baseline's, a metric no point has, or timings from
/// another device or backend (unless allowed).
[[nodiscard]] GateOutcome run_gate(const GateSpec& gate,
                                   const std::vector<std::filesystem::path>& inputs,
                                   const GateOptions& options = {});

/// Judges documents already read (`compare`, tests): `base` pooled as the baseline's
/// repetitions, `next` as the new run's. The labels name them in messages.
[[nodiscard]] GateOutcome judge_documents(const GateBaseline& baseline,
                                          const std::vector<nlohmann::json>& base,
                                          const std::vector<std::string>& base_labels,
                                          const std::vector<nlohmann::json>& next,
                                          const std::vector<std::string>& new_labels,
                                          const GateOptions& options = {});

/// `gate --update`: writes each baseline that an input matches from that input (several
/// microbenchmark files merged into one document), creating the baseline folder's files as
/// needed. Returns the files written. Throws Error like run_gate for inputs that match nothing,
/// and for several results files of one scenario (record one run with --repetitions instead).
std::vector<std::filesystem::path> update_gate_baselines(
    const GateSpec& gate, const std::vector<std::filesystem::path>& inputs);

/// The table: for each baseline its provenance, the rows whose verdict is not `same` (every row
/// with `all`), and a count of each verdict; then PASS or FAIL.
[[nodiscard]] std::string gate_text(const GateOutcome& outcome, bool all = false);
[[nodiscard]] std::string gate_markdown(const GateOutcome& outcome);
[[nodiscard]] nlohmann::json to_json(const GateOutcome& outcome);

/// Results documents of a gate's results baselines and their inputs, merged for report.html
/// (baseline and new as two sources), each new point carrying "gate": the verdicts of its rows,
/// so that the report marks them on its figures. Empty when no results baseline was judged.
[[nodiscard]] nlohmann::json gate_overlay(const GateOutcome& outcome);

}  // namespace hisparse
