// Runner: measures one sweep point. Builds the DecodeEngine for the requests the memory budget
// admits, runs warm-up steps, then the measured steps, and reduces them to PointMetrics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/pipeline_verifier.hpp"
#include "bench/statistics.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "model/capacity_model.hpp"
#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

/// Memory that admission (CapacityModel) is checked against.
struct MemoryBudget {
  double bytes = 0;       ///< GPU memory on CUDA; physical RAM on the CPU backend
  double host_bytes = 0;  ///< pinned host budget, 0 = unlimited
  std::string source;     ///< says what `bytes` is, e.g. "device memory of NVIDIA H200"
};

/// The budget of a device: its total memory, labelled.
[[nodiscard]] MemoryBudget memory_budget_of(const DeviceProperties& device);

struct PointMetrics {
  std::string timing;                      ///< how step times were taken
  int requested = 0;                       ///< concurrency asked for
  int running = 0;                         ///< requests admitted and decoded together
  int queued = 0;                          ///< requested - running
  Summary step_ms;                         ///< over the measured steps
  double tpot_ms = 0;                      ///< time per output token of a request (= median step)
  double output_tokens_per_s = 0;          ///< running / median step time
  std::map<std::string, double> phase_ms;  ///< median over steps, per phase (summed over layers)
  std::int64_t hits = 0;                   ///< over the measured steps
  std::int64_t misses = 0;
  double hit_rate = -1;               ///< hits / (hits + misses); -1 when no hot buffer was used
  double bytes_h2d_per_step = 0;      ///< deployment row layout (see StepStats::bytes_h2d)
  double bytes_scanned_per_step = 0;  ///< index keys, keys or planes read to select rows
  /// Fathom modes: mean over the measured steps' depth plans (one per layer and KV stream) of
  /// the bits each reads per token (planes + 0.25 per channel that reads its fp16 block scales,
  /// the quality study's cost convention), those bits / 8, and its active channels, which every
  /// query head of the stream reads; -1 in the other modes.
  double bits_per_token = -1;
  double bytes_per_token = -1;
  double active_channels = -1;
  /// Median over measured steps of StepStats::recall / attention_rel_error (sampled layers: the
  /// first and the last); -1 when not measured (dense).
  double selection_recall = -1;
  double attention_rel_error = -1;
  /// Hot-buffer replacement analysis (hisparse modes): simulate_policy(policy, trace, hot) over
  /// the selection trace of every (stream, layer), over every step since admission (warm-up
  /// included), misses / (hits + misses); -1 without a hot buffer. `lru` reproduces the swap-in.
  std::string policy;  ///< the point's policy ("" without a hot buffer)
  double policy_miss_rate = -1;
  double optimal_miss_rate = -1;                  ///< Belady's offline optimum on the same traces
  int policy_steps = 0;                           ///< steps the traces cover
  std::size_t gpu_bytes_per_request = 0;          ///< as allocated by the engine
  std::size_t planned_gpu_bytes_per_request = 0;  ///< CapacityModel
  std::size_t planned_host_bytes_per_request = 0;
  std::int64_t admitted = 0;                ///< CapacityModel max concurrency for the budget
  std::vector<std::string> workload_notes;  ///< e.g. what a replayed capture did not hold
  /// FNV-1a (64 bit, hex) of every measured step's greedy next token per request, in order: the
  /// same for a fixed seed on any machine of one backend, so a gate sees a changed decode.
  std::string next_tokens_digest;
  /// Repetitions of the point (each a fresh engine, warm-up included): their tokens/s and median
  /// step times, for the gate's rank test. step_ms and the figures above cover every
  /// repetition's measured steps; the deterministic metrics are checked equal across them.
  int repetitions = 1;
  std::vector<double> repetition_tokens_per_s;
  std::vector<double> repetition_step_ms_median;
  /// `run --verify`: what the first repetition compared against its twin (PipelineVerifier)
  std::optional<VerifyReport> verify;
};

void to_json(nlohmann::json& j, const PointMetrics& m);

/// Fills m.policy, policy_miss_rate and optimal_miss_rate from the engine's selection traces
/// (nothing without a hot buffer). The random policy is seeded with the workload seed.
void analyse_policy(const DecodeEngine& engine, const EngineConfig& config, PointMetrics& m);

/// How a point is measured: steps, repetitions and the time it may take.
struct PointPlan {
  int warmup_steps = 2;
  int decode_steps = 8;
  int repetitions = 1;
  /// Wall-clock seconds one point may take (engine construction and every repetition's steps);
  /// 0: no limit. Checked after each step, so a point that passes it fails at the step's end.
  double time_limit_s = 0;
  /// `run --verify`: > 0 checks the first repetition against its CPU twin (PipelineVerifier),
  /// layer tensors every verify_every steps; 0: off.
  int verify_every = 0;
};

class Runner {
 public:
  Runner(Backend backend, MemoryBudget budget) : backend_(backend), budget_(std::move(budget)) {}

  /// Called after every step: (steps done, steps in total incl. warm-up).
  using Progress = std::function<void(int, int)>;

  /// Called once after the last step with the engine, e.g. to save its selection traces.
  using Inspect = std::function<void(const DecodeEngine&)>;

  /// Measures one point `plan.repetitions` times (a fresh engine each time; progress counts the
  /// steps of all of them, `inspect` sees the last engine). Throws Error when not one request
  /// fits, the engine fails, a repetition's deterministic metrics differ from the first's, the
  /// point takes longer than plan.time_limit_s, or `inspect` throws; whatever `progress` throws
  /// (a request to stop) passes through.
  [[nodiscard]] PointMetrics run(const ModelSpec& model, EngineConfig config, const PointPlan& plan,
                                 const Progress& progress = {}, const Inspect& inspect = {}) const;

  [[nodiscard]] const MemoryBudget& budget() const noexcept { return budget_; }

 private:
  /// The error for a point at which not one request fits, with the longest context that does.
  [[nodiscard]] Error nothing_fits(const CapacityModel& capacity, Mode mode, const CapacityQuery& q,
                                   const RequestFootprint& footprint,
                                   const std::string& model) const;

  /// The capacity question of a point against this runner's budget.
  [[nodiscard]] CapacityQuery query_of(const EngineConfig& config) const;
  /// Requests of `mode` the capacity model admits (`requested` when it has no row for the mode).
  [[nodiscard]] static std::int64_t admitted_requests(const CapacityModel& capacity, Mode mode,
                                                      const CapacityQuery& q,
                                                      std::int64_t requested);
  /// An allocation of the point that did not fit, as the scenario keys that would make it fit.
  [[nodiscard]] Error out_of_memory(const OutOfMemoryError& e, const ModelSpec& model,
                                    const EngineConfig& config) const;
  /// One repetition: its metrics and the raw samples the repetitions are pooled from.
  struct Measured;
  [[nodiscard]] Measured run_once(const ModelSpec& model, EngineConfig config, int warmup_steps,
                                  int decode_steps, int verify_every, const Progress& progress,
                                  const Inspect& inspect) const;

  Backend backend_;
  MemoryBudget budget_;
};

}  // namespace hisparse
