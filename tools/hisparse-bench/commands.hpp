// The subcommands of hisparse-bench. Each returns the process exit code (core/error.hpp
// exit_code) and throws hisparse::Error for bad input.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.hpp"

namespace hisparse::cli {

/// Flags shared by the subcommands (each subcommand registers the ones it uses).
struct CommonOptions {
  std::string out;                ///< --out DIR
  std::string backend;            ///< --backend; empty: the scenario's (or auto)
  std::vector<std::string> sets;  ///< --set key=value, in order
  bool json = false;              ///< --json: machine-readable stdout only
  bool quiet = false;             ///< --quiet: errors only
  std::string command_line;       ///< argv joined, for results.json
};

struct PlanOptions {
  std::string model;
  std::int64_t context = 131072;
  double gpu_mem_gib = 141.0;
  int top_k = 0;
  int hot_buffer = 0;
  int budget_bits = 48;
  double host_mem_gib = 0.0;
  std::int64_t concurrency = 1;  ///< requests for the longest-context column
};

/// `quality`: the Fathom quality study (CPU, synthetic keys).
struct QualityOptions {
  std::string profile = "rope_qk_norm";  ///< rope_qk_norm | independent | correlated
  std::int64_t tokens = 0;               ///< 0: 8192 synthetic, every token of a capture
  int kv_heads = 32;                     ///< KV heads (workload seeds) averaged
  int top_k = 256;
  std::vector<int> budgets{32, 40, 48, 56, 64, 80, 96, 128};
  std::string rule = "both";  ///< paper | measured | both
  bool klt = false;
  bool centre_keys = false;
  bool float_scores = false;
  std::uint64_t seed = 1;
  std::string replay;       ///< captured tensors instead of synthetic keys (with `model`)
  std::string model;        ///< preset or YAML of the model the capture came from
  std::vector<int> layers;  ///< captured layers studied; empty: all
  /// query steps held out for calibration; -1: half of a capture's, 32 with a scenario
  int calibration_steps = -1;
  int threads = 0;        ///< KV heads studied at once; 0: every hardware thread
  bool by_layer = false;  ///< with `replay`: the bits needed per captured layer too
  /// Also the bits at the fixed scan's error if each KV head took its own budget (the best split
  /// of the same mean bits, knowing every head's error curve: per_head_allocation_bits).
  bool allocation_bound = false;
  /// When positive: also the bits with per-KV-head budgets chosen on this many held-out
  /// calibration query steps and scored on the test queries.
  int calibrated_budgets = 0;
  /// A decode scenario (name or path) whose workload is studied instead: its point `point` gives
  /// the model, context, top_k and keys/queries (model layer x KV head = study head).
  std::string scenario;
  int point = 0;
  bool top_k_given = false;  ///< --top-k was given (else a scenario's top_k is used)
};

/// `capture`: a synthetic capture (the quality study's generator) for a GQA model's shape.
struct CaptureOptions {
  std::string model;
  std::string out;
  std::string profile = "rope_qk_norm";
  std::int64_t tokens = 8192;
  int steps = 16;              ///< test query steps, written first
  int calibration_steps = 32;  ///< held-out calibration query steps, written after them
  std::uint64_t seed = 1;
};

/// `policies`: the replacement-policy study over recorded selections (CPU).
struct PoliciesOptions {
  std::vector<std::string> traces;  ///< text traces and .npy dumps of top-k positions
  std::vector<int> hots;            ///< hot-buffer sizes studied
  std::vector<std::string> policies{"lru", "fifo", "random", "belady"};
  std::int64_t seq_len = 0;  ///< an .npy's sequence length at its first step; 0: not given
  std::int64_t warmup_steps = 0;
  int row_bytes = 656;      ///< bytes of one KV row (MLA fp8: 656)
  double pcie_gbps = 55.1;  ///< the host-to-device ceiling the transfer time assumes
  std::uint64_t seed = 1;   ///< the random policy's
  int threads = 0;          ///< 0: every hardware thread
};

/// Flags of `run` and `trace` beyond the common ones.
struct RunRequest {
  bool trace = false;       ///< --trace (or the `trace` subcommand)
  int steps = 0;            ///< --trace-steps; 0: the scenario's trace.steps (default 4)
  bool only_trace = false;  ///< `trace`: measured steps = traced steps
  /// --save-selections: every hot-buffer point's recorded selections as text traces under
  /// OUT/selections/point-N/ (what `policies` reads)
  bool save_selections = false;
  int repetitions = 0;   ///< --repetitions; 0: the scenario's repetitions (default 1)
  bool verify = false;   ///< --verify: check each point against its CPU twin (PipelineVerifier)
  int verify_every = 0;  ///< --verify-every N: layer tensors every N steps (implies --verify)
  /// --resume DIR: continue the sweep whose results are in DIR (written there)
  std::string resume;
};

struct CompareArgs {
  std::string base;
  std::string next;
  double threshold_pct = 5.0;
  std::string metric = "tokens_per_s";
  bool allow_different_devices = false;
};

/// `gate BASELINE RESULTS...`.
struct GateArgs {
  std::string baseline;             ///< a folder with gate.yaml, a folder of baselines, or a file
  std::vector<std::string> inputs;  ///< results.json and Google Benchmark JSON files
  bool allow_different_devices = false;
  bool update = false;  ///< write the inputs as the new baselines (after showing what changed)
  bool all = false;     ///< print every row, `same` ones included
};

int run_command(const std::string& scenario, const CommonOptions& o, const RunRequest& t);
int compare_command(const CompareArgs& args, const CommonOptions& o);
int gate_command(const GateArgs& args, const CommonOptions& o);
int report_command(const std::vector<std::string>& inputs, const CommonOptions& o);
int validate_command(const std::vector<std::string>& scenarios, const CommonOptions& o);
int list_command(const std::string& what, const CommonOptions& o);
int plan_command(const PlanOptions& p, const CommonOptions& o);
int info_command(const CommonOptions& o);
int quality_command(const QualityOptions& q, const CommonOptions& o);
int capture_command(const CaptureOptions& c, const CommonOptions& o);
int policies_command(const PoliciesOptions& p, const CommonOptions& o);

/// The argument as a POSIX shell reads it back (quoted only where needed).
[[nodiscard]] std::string shell_quote(const std::string& arg);

/// Bytes of the copies that measure a backend's bandwidth ceilings at run start.
[[nodiscard]] std::size_t ceiling_probe_bytes(Backend backend);

/// --json output: the document, indented, on stdout.
void print_json(const nlohmann::json& j);

}  // namespace hisparse::cli
