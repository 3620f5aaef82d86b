// Scenario: what one `hisparse-bench run` executes, read from YAML, overridden by `--set`,
// validated, and expanded into sweep points.
//
// Scenario keys (every key but `name` and `model` is optional; defaults in brackets):
//
//   name: quick                 # identifier, the default output folder (letters, digits, . _ -)
//   description: "..."          # free text, copied into the results
//   model: tiny-dsa             # preset name (scenarios/models/<name>.yaml) or path to a model
//                               # YAML (relative to the scenario file); required unless swept
//   backend: auto               # auto | cuda | cpu [auto]; --backend overrides it
//   mode: dense                 # dense | sparse-gpu | hisparse | fathom | hisparse+fathom [dense]
//   concurrency: 1              # requests decoded together (the batch), >= 1 [1]
//   context_length: 4096        # tokens in each request's cache before the first step, >= 1 [4096]
//   decode_steps: 8             # measured steps per sweep point, >= 1 [8]
//   warmup_steps: 2             # unmeasured steps before them, >= 0 [2]
//   repetitions: 1              # runs of each point, each a fresh engine (warm-up included),
//                               # 1..1000 [1]; `run --repetitions N`. The gate's rank test needs
//                               # 4 or more a side to decide on a timing
//   point_time_limit_s: 0       # wall-clock seconds a point may take, 0 = no limit [0]: past
//                               # it the point fails at its next step's end and the sweep goes
//                               # on; a step that never returns ends the run at 2x the limit
//                               # (+ 60 s), leaving results.json resumable (run --resume)
//   quality_metrics: true       # the sparse modes' selection recall and attention error, from a
//                               # dense pass over the first and last layers (outside the timed
//                               # step, on the host: slow on the large presets) [true]
//   top_k: 0                    # rows selected per step; 0 = the indexer's top_k, else 2048 [0]
//   hot_buffer: 0               # HiSparse slots per request and layer; 0 = 2 * top_k [0]
//   budget_bits: 48             # Fathom plane bits per token and KV head, 0..4*head_dim [48]
//   policy: lru                 # hot-buffer replacement: lru | fifo | random | belady [lru]
//   workload:                   # synthetic keys/queries (hisparse::WorkloadSpec)
//     generator: synthetic      # synthetic | replay (replay needs replay_path)
//     seed: 1
//     channel_spread_decades: 3.0
//     outlier_channels: 4
//     outlier_scale: 20.0
//     sink_tokens: 4
//     recency_bias: 0.5         # 0..1
//     query_drift: 0.05         # 0..1
//     replay_path: ""
//   sweep:                      # axes expanded as a cartesian product (each a non-empty list)
//     model: [tiny-dsa, tiny-gqa]
//     mode: [dense, sparse-gpu]
//     concurrency: [1, 4]
//     # also context_length, top_k, hot_buffer, budget_bits, policy
//   skip:                       # combinations of swept values left out of the product, e.g. a
//     - {model: tiny-dsa, mode: fathom}  # mode a model cannot run (each value must be swept)
//   outputs:
//     dir: results/quick        # [results/<name>]; --out overrides it
//     formats: [json, csv, md, html]  # any non-empty subset [all four]; html: report.html
//   fathom:                     # options of the fathom and hisparse+fathom modes
//     klt: false                # plan and scan in each KV stream's calibration eigenbasis (KLT;
//                               # for models without QK-norm, whose key channels are correlated)
//     rule: paper               # depth planner: paper | measured (PlanRule, depth_planner.hpp)
//     centre_keys: false        # quantize keys minus each stream's calibration mean (KeyCentre)
//     head_budgets: [52, 44]    # a budget per (layer, KV head), layer by layer (rows reused for
//                               # deeper layers): each KV head plans budget_bits times its
//                               # table budget / the table's mean; or the path of a
//                               # `quality --calibrated-budgets N --json` output (its
//                               # calibrated_head_budgets for this rule and basis, and its
//                               # calibrated_head_budgets_by_budget: a point whose budget_bits
//                               # the study calibrated a split at uses that split) [none]
//   deployment:                 # a deployment larger than the lent GPU
//     share_layer_weights: false  # synthetic weights: layer 0's serve every dense layer and the
//                               # first MoE layer's every MoE layer, so a model whose weights do
//                               # not fit runs; each layer still reads its full weight bytes.
//                               # The results say so [false]
//     gpu_memory_gib: 0         # GPU memory admission plans against (the model's full weight
//                               # bytes come off it), e.g. 141 for an H200 deployment run on an
//                               # 80 GB GPU with shared weights; 0 = the device's own [0]
//     gemm_dtype: fp32          # fp32 | bf16: linear layers with bf16 weights and bf16-rounded
//                               # activations (a bf16 deployment: half the weight bytes, tensor
//                               # cores); fp32 keeps the CUDA engine within float rounding of the
//                               # CPU engine [fp32]
//     overlap_selection: true   # CUDA engine, MLA models: the indexer, top-k and swap-in on a
//                               # second stream beside the query and KV projections [true]
//     cuda_graph: true          # CUDA engine: steps replay one CUDA graph of the whole step
//                               # (traced, Fathom, quality-sampled and replay-capture steps run
//                               # eagerly); false: every step launched kernel by kernel [true]
//   trace:                      # CUPTI timeline of the first measured steps (CUDA backend)
//     enabled: false            # same as `run --trace`: writes trace.json, gpu_phase_ms
//     steps: 4                  # traced steps per sweep point (--trace-steps)
//
// A swept axis replaces the scalar key of the same name. Sweep points are ordered with the axes
// in the fixed order of sweep_axis_names() (model outermost, concurrency innermost), each axis'
// values in the order written, so a sweep always expands in the same order. A point whose swept
// values match every pair of a `skip` entry is left out (the others keep their order and are
// numbered without gaps); validation checks only the points that remain.
//
// `--set key=value` (dotted keys: workload.seed=7, sweep.concurrency=[1,2,4]) replaces any value
// before validation; the value is parsed as YAML. Every error is one hisparse::Error whose where()
// is "file:line:column: key" (1-based, from yaml-cpp marks) or "--set key=value: key".
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

/// One value of a sweepable key, with the place it came from (for error messages).
struct AxisValue {
  std::string text;         ///< as written, e.g. "sparse-gpu" or "4096"
  std::int64_t number = 0;  ///< parsed value of numeric axes
  std::string where;        ///< "file:line:column: key" or "--set k=v: key"
};

struct OutputSpec {
  std::filesystem::path dir;  ///< default results/<name>
  std::vector<std::string> formats{"json", "csv", "md", "html"};
};

struct TraceSpec {
  bool enabled = false;
  int steps = 4;
};

/// What the run stands for when the lent GPU is not the deployment's (`deployment:`).
struct DeploymentSpec {
  /// One representative layer's synthetic weights serve every layer (EngineConfig)
  bool share_layer_weights = false;
  /// The deployment GPU's memory in GiB that admission plans against; 0: the device's own
  double gpu_memory_gib = 0;
  /// "fp32" or "bf16": EngineConfig::bf16_gemm
  std::string gemm_dtype = "fp32";
  /// EngineConfig::overlap_selection
  bool overlap_selection = true;
  /// EngineConfig::cuda_graph
  bool cuda_graph = true;
};

struct FathomSpec {
  bool klt = false;                                 ///< EngineConfig::fathom_klt
  fathom::PlanRule rule = fathom::PlanRule::paper;  ///< EngineConfig::fathom_rule
  bool centre_keys = false;                         ///< EngineConfig::fathom_centre_keys
  std::vector<int> head_budgets;  ///< EngineConfig::fathom_head_budgets (empty: none)
  /// From a quality JSON with calibrated_head_budgets_by_budget: the split calibrated at each
  /// mean budget. A point whose budget_bits is a key plans with that table instead of
  /// head_budgets' shares.
  std::map<int, std::vector<int>> head_budgets_by_budget;
  /// Where the table came from: "" (none), "inline", or the quality JSON file and its key.
  std::string head_budgets_source;
  std::string head_budgets_where;  ///< "file:line:column: fathom.head_budgets", for messages
};

/// A combination of swept values that the sweep leaves out (`skip:`): every point whose values
/// of these axes are these is skipped.
struct SkipRule {
  std::vector<std::pair<std::string, std::string>> values;  ///< axis, value as written
};

/// One point of the sweep: the engine configuration it runs and the axis values that made it.
struct SweepPoint {
  std::size_t index = 0;
  std::vector<std::pair<std::string, std::string>> axes;  ///< swept axes only, in sweep order
  std::string model;                                      ///< as written (preset or path)
  EngineConfig
      config;  ///< top_k and hot_buffer resolved (never 0); backend as resolved by the caller
};

class Scenario {
 public:
  std::string name;
  std::string description;
  std::filesystem::path source;  ///< the YAML file ("" for a string)
  std::string backend = "auto";
  int decode_steps = 8;
  int warmup_steps = 2;
  int repetitions = 1;
  double point_time_limit_s = 0;
  bool quality_metrics = true;  ///< EngineConfig::quality_metrics
  WorkloadSpec workload;
  OutputSpec outputs;
  TraceSpec trace;
  FathomSpec fathom;
  DeploymentSpec deployment;
  /// Every sweepable key with its values: one value when not swept.
  std::map<std::string, std::vector<AxisValue>> values;
  /// Names of the keys that are swept (a subset of sweep_axis_names(), in that order).
  std::vector<std::string> swept;
  /// Combinations left out of the cartesian product.
  std::vector<SkipRule> skip;
  /// Loaded models by `model` value as written (loaded during validation).
  std::map<std::string, ModelSpec> models;

  /// Number of sweep points: the product of the value counts, less the skipped combinations.
  [[nodiscard]] std::size_t point_count() const;
  /// Combinations of the product that `skip` leaves out.
  [[nodiscard]] std::size_t skipped_count() const;
  /// All sweep points in the stable order described above. Needs the models (for top_k defaults).
  [[nodiscard]] std::vector<SweepPoint> expand() const;
  /// The scenario as resolved (after --set and defaults), for the results file.
  [[nodiscard]] nlohmann::json to_json() const;
};

/// The keys that may be swept, in expansion order (outermost first).
[[nodiscard]] const std::vector<std::string>& sweep_axis_names();
/// Replacement policies accepted by `policy`.
[[nodiscard]] const std::vector<std::string>& policy_names();
/// Mode names accepted by `mode`.
[[nodiscard]] const std::vector<std::string>& mode_names();

/// Reads, overrides, validates. `overrides` are "key=value" strings from --set. Throws Error.
[[nodiscard]] Scenario load_scenario(const std::filesystem::path& file,
                                     const std::vector<std::string>& overrides = {});
/// The same for YAML text; `label` stands for the file name in messages.
[[nodiscard]] Scenario parse_scenario(const std::string& yaml_text, const std::string& label,
                                      const std::vector<std::string>& overrides = {},
                                      const std::filesystem::path& base_dir = {});

/// Whether the scenario file, after `overrides`, sets `trace.enabled: true`. Reads only that key
/// and emits no NVTX range, so a tool can prepare NVTX injection before its first range. False
/// when the file or the key is unreadable (load_scenario reports those).
[[nodiscard]] bool scenario_requests_trace(const std::filesystem::path& file,
                                           const std::vector<std::string>& overrides = {});

/// A scenario named on the command line: an existing file, or a name found as
/// <dir>/<name>.yaml in scenario_search_dirs(). Throws Error naming `where` when not found.
[[nodiscard]] std::filesystem::path find_scenario(const std::string& name_or_path,
                                                  const std::string& where);
/// ./scenarios and the source tree's scenarios/ (deduplicated).
[[nodiscard]] std::vector<std::filesystem::path> scenario_search_dirs();
/// Names (file stems) of the scenarios in scenario_search_dirs(), sorted.
[[nodiscard]] std::vector<std::string> list_scenarios();

/// A model by preset name or path (relative paths tried against `base_dir` first). An unknown
/// preset or a missing file throws Error naming `where` (with the nearest preset name).
[[nodiscard]] ModelSpec load_model_named(const std::string& name_or_path, const std::string& where,
                                         const std::filesystem::path& base_dir = {});

/// The candidate closest to `word` by edit distance, or "" when none is reasonably close.
[[nodiscard]] std::string nearest_name(const std::string& word,
                                       const std::vector<std::string>& candidates);

}  // namespace hisparse
