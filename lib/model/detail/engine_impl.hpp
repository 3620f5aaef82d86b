// The backend behind a DecodeEngine: the CPU engine (the reference twin, decode_engine.cpp) or the
// CUDA engine (cuda_engine.cpp, CUDA builds only). DecodeEngine forwards to it; the sizes every
// backend derives the same way live here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtypes.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "model/decode_engine.hpp"
#include "model/engine_fathom_index.hpp"
#include "model/engine_hot_rows.hpp"
#include "model/kv_workload.hpp"

namespace hisparse::detail {

class EngineImpl {
 public:
  EngineImpl(const ModelSpec& model, const EngineConfig& config) : model_(model), config_(config) {}
  virtual ~EngineImpl() = default;
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  virtual StepStats step() = 0;
  [[nodiscard]] virtual const std::vector<std::string>& workload_notes() const noexcept = 0;
  [[nodiscard]] virtual std::vector<SelectionTrace> selection_traces() const = 0;
  /// Per-layer records of the last step (DecodeEngine::last_attention / last_queries); throws
  /// Error for a layer outside the model.
  [[nodiscard]] virtual std::vector<float> last_attention(int layer) const = 0;
  [[nodiscard]] virtual std::vector<float> last_queries(int layer) const = 0;

  ModelSpec model_;
  EngineConfig config_;
  std::int64_t seq_len_ = 0;
  std::int64_t step_ = 0;  ///< steps run
  std::size_t gpu_bytes_per_request_ = 0;
  int hot_slots_ = 0;
  int width_ = 0;    ///< selection entries per stream
  int streams_ = 0;  ///< KV streams per layer
  // Derived by derive_sizes(), the same on every backend.
  int batch_ = 0, top_k_ = 0, kv_heads_ = 0, key_dim_ = 0, value_dim_ = 0;
  bool sparse_ = false;                 ///< the sparse-gpu selection (sparse-gpu, hisparse)
  bool fathom_ = false;                 ///< the Fathom selection (fathom, hisparse+fathom)
  std::size_t deployed_row_bytes_ = 0;  ///< one stream's KV row in the deployment layout
  /// kModelQueryShare for synthetic workloads, 0 for a replayed capture
  float model_query_share_ = 0.0f;

 protected:
  /// Quality samples of the current step (the first and last layers of the sparse modes).
  int quality_samples_ = 0;
  double recall_sum_ = 0, error_sum_ = 0;
  [[nodiscard]] bool samples_quality(int layer) const noexcept {
    return config_.quality_metrics && config_.mode != Mode::dense &&
           (layer == 0 || layer == model_.layers - 1);  // DecodeEngine::is_quality_layer
  }
  /// Dense attention over the whole cache of a layer with the queries and shape of `sparse`:
  /// keys / values as the engine stores them (MLA: the latent rows, values inside the keys).
  [[nodiscard]] kernels::DecodeAttentionArgs dense_twin(const kernels::DecodeAttentionArgs& sparse,
                                                        const float* k, const float* v,
                                                        std::int64_t capacity,
                                                        const std::int64_t* seq_lens) const;
  /// Adds one quality sample, all in host memory: the recall of `selected` ([batch][groups]
  /// [width_] positions) against each head's exact top-k over the keys of `dense`, and the error
  /// of `sparse_out` against `dense_out`.
  void add_quality_sample(const kernels::DecodeAttentionArgs& dense, const float* q, const float* k,
                          const std::int32_t* selected, int groups, const float* sparse_out,
                          const float* dense_out);
  /// A step's stats with every phase this engine times at 0 (so that results list each phase).
  [[nodiscard]] StepStats begin_step_stats() const;
  /// The end of every step begun at `start`: the step's quality samples into stats, step_ms (less
  /// the time the samples took), and the sequences one token longer.
  void end_step(StepStats& stats, std::chrono::steady_clock::time_point start);
  /// Sets the sizes above from the configuration and the workload's geometry.
  void derive_sizes(const KvWorkload& workload);
  /// Each request's first token, from the workload seed.
  [[nodiscard]] std::vector<std::int32_t> first_tokens() const;
  /// The Fathom index and the hot rows of the offloading modes, `capacity` tokens per stream.
  [[nodiscard]] std::unique_ptr<FathomKeyIndex> make_fathom_index(std::int64_t capacity,
                                                                  Backend backend) const;
  /// element_bytes: 4 for float rows, 2 for bf16 rows.
  [[nodiscard]] std::unique_ptr<HotRowCache> make_hot_rows(std::int64_t capacity, Backend backend,
                                                           int element_bytes = 4);
};

/// `n` floats rounded to bf16 values in place: both engines hold KV rows as bf16 (the CPU engine as
/// floats with bf16 values) and feed linear layers bf16 activations.
inline void round_to_bf16_values(float* x, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

/// The non-finite check of EngineConfig::check_finite: its sites in step order, the residual
/// stream after the embedding (0), after layer l's attention (1 + 2l) and FFN (2 + 2l), then the
/// logits (2 x layers + 1). A step keeps the smallest site that held a NaN or Inf, kNoSite when
/// none did (the byte 0x7f in every byte: what cudaMemsetAsync can write).
inline constexpr int kNoSite = 0x7f7f7f7f;
[[nodiscard]] constexpr int finite_site(int layer, bool after_ffn) noexcept {
  return 1 + 2 * layer + (after_ffn ? 1 : 0);
}
[[nodiscard]] constexpr int logits_site(int layers) noexcept {
  return 2 * layers + 1;
}
/// The failure of a step whose first non-finite value was at `site`, naming layer and phase.
[[nodiscard]] Error non_finite_error(const ModelSpec& model, const EngineConfig& config,
                                     std::int64_t step, int site);

/// Throws Error for a configuration no engine can run (the checks of DecodeEngine's constructor).
void validate_config(const ModelSpec& model, const EngineConfig& config);

/// The fixed parts of a Fathom selection (REFERENCE.md section 2) and the swap-in's slot bound.
inline constexpr int kFathomSinks = 4;
inline constexpr int kFathomRecent = 32;
inline constexpr int kDefaultDecodeSteps = 256;
/// The hot buffer's upper bound (the swap-in's slot tables).
inline constexpr int kMaxHotSlots = 32768;
/// Share of the model's own query mixed into a synthetic workload's query (by RMS).
inline constexpr float kModelQueryShare = 0.25f;

/// hot_buffer of a hisparse mode: the configured slots or 2 x top_k, checked against the
/// selection width; throws Error naming hot_buffer when one selection would not fit.
[[nodiscard]] int hot_slots_for(const ModelSpec& model, const EngineConfig& config, int top_k,
                                int width, int kv_heads);

/// records[layer], or Error naming `what` for a layer outside the model.
[[nodiscard]] const std::vector<float>& layer_record(const std::vector<std::vector<float>>& records,
                                                     int layer, const char* what);

[[nodiscard]] std::unique_ptr<EngineImpl> make_cpu_engine(const ModelSpec& model,
                                                          const EngineConfig& config);
#if HISPARSE_WITH_CUDA
[[nodiscard]] std::unique_ptr<EngineImpl> make_cuda_engine(const ModelSpec& model,
                                                           const EngineConfig& config);
#endif

}  // namespace hisparse::detail
