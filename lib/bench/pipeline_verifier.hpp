// PipelineVerifier: what `hisparse-bench run --verify` checks. A point on the CUDA backend steps a
// twin engine beside its own (same seed, same workload, so the same decode) and compares the two:
// the next tokens of every step, and on sampled steps the attention queries and outputs of every
// layer. The twin is
//   - a CPU DecodeEngine of the same configuration, for models whose CPU step is cheap (weights up
//     to kCpuTwinWeightBytes): the hot buffer's hits and misses must match too;
//   - on larger models, whose CPU step takes minutes, a CUDA engine of the mode without offload:
//     `hisparse` against `sparse-gpu`, `hisparse+fathom` against `fathom` (the same selections
//     read from the hot buffer instead of GPU-resident rows must give the same outputs);
//   - none for the other modes of larger models (the non-finite check only).
// Both engines check their residual stream for NaN and Inf (EngineConfig::check_finite). On the
// CPU backend the engine is its own reference, so only the non-finite check runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

/// Models with more weight bytes than this get a CUDA twin (or none) instead of the CPU engine.
inline constexpr double kCpuTwinWeightBytes = 2.0 * 1024 * 1024 * 1024;

/// What a verified point compared, recorded in its metrics as `verify`.
struct VerifyReport {
  std::string twin;                ///< "cpu engine", "cuda engine, mode M", or why there is none
  int every = 1;                   ///< layer tensors compared every `every` steps from step 0
  int steps = 0;                   ///< steps whose tokens, hits and misses were compared
  int layer_steps = 0;             ///< steps whose layer tensors were compared
  double query_tolerance = 0;      ///< largest relative L2 error allowed for a layer's queries
  double attention_tolerance = 0;  ///< ... and attention output
  double max_query_error = 0;      ///< largest seen
  double max_attention_error = 0;
  /// bf16 GEMMs: the step whose next tokens first differed (a rounding flip of bf16 arithmetic
  /// moves an argmax), after which the decodes differ and comparison stops; -1: never.
  int diverged_at_step = -1;
};

void to_json(nlohmann::json& j, const VerifyReport& r);

class PipelineVerifier {
 public:
  /// `config` is the point's engine configuration (backend included); `every` >= 1.
  PipelineVerifier(const ModelSpec& model, const EngineConfig& config, int every);
  ~PipelineVerifier();
  PipelineVerifier(const PipelineVerifier&) = delete;
  PipelineVerifier& operator=(const PipelineVerifier&) = delete;

  /// The configuration the engine under test must run with (the non-finite check on).
  [[nodiscard]] static EngineConfig checked(EngineConfig config);

  /// After step `step` (0 = the first, warm-up included) of `engine`, whose stats were `got`:
  /// steps the twin and compares. Throws Error naming the step, the layer and what differs.
  void after_step(int step, const DecodeEngine& engine, const StepStats& got);

  [[nodiscard]] const VerifyReport& report() const noexcept { return report_; }

 private:
  [[nodiscard]] std::string where(int step) const;

  const ModelSpec& model_;
  EngineConfig config_;
  std::unique_ptr<DecodeEngine> twin_;
  bool compare_hot_buffer_ = false;  ///< the twin has the same hot buffer (the CPU twin)
  VerifyReport report_;
};

}  // namespace hisparse
