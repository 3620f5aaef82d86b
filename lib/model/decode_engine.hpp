// DecodeEngine: real decode steps over all layers for a batch of requests, on the CPU backend
// (reference) or the CUDA backend. The context of each request is synthesised by KvWorkload (a
// decode-only benchmark needs the cache, not the prefill), then every step runs the model on the
// batch's newest tokens, appends their KV and picks the next tokens greedily.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

/// Synthetic K/Q generator parameters (scenario key `workload`).
struct WorkloadSpec {
  std::string generator = "synthetic";  ///< synthetic | replay
  std::uint64_t seed = 1;
  double channel_spread_decades = 3.0;  ///< per-channel key variances span this many decades
  int outlier_channels = 4;             ///< channels with very large magnitude
  double outlier_scale = 20.0;
  int sink_tokens = 4;                  ///< tokens that attract attention regardless of content
  double recency_bias = 0.5;            ///< strength of attention to recent tokens, 0..1
  double query_drift = 0.05;            ///< step-to-step change of each query, 0..1
  std::string replay_path;              ///< captured q/k tensors (safetensors or .npy) for replay
};

struct EngineConfig {
  Mode mode = Mode::dense;
  Backend backend = Backend::cpu;
  int concurrency = 1;                 ///< requests in the batch
  std::int64_t context_length = 1024;  ///< tokens already in each request's cache at step 0
  int top_k = 0;                       ///< 0: the model's indexer top_k (DSA) or 2048
  int hot_buffer = 0;                  ///< hisparse slots per request and layer (0: 2 * top_k)
  int budget_bits = 48;                ///< fathom plane bits per token per KV head
  std::string policy = "lru";          ///< hot-buffer replacement (analysis): lru|fifo|random|belady
  WorkloadSpec workload;
};

/// Time of one phase of a step, summed over layers.
struct StepStats {
  double step_ms = 0.0;
  std::map<std::string, double> phase_ms;  ///< "embed", "indexer", "topk", "attention", "ffn", ...
  std::int64_t hits = 0;                   ///< hot-buffer hits (hisparse modes)
  std::int64_t misses = 0;
  std::int64_t bytes_h2d = 0;              ///< bytes moved host -> device this step
  std::int64_t bytes_scanned = 0;          ///< bytes read to select rows this step
  std::vector<std::int32_t> next_tokens;   ///< greedy choice per request
};

class DecodeEngine {
 public:
  /// Allocates the model, the caches and the workload. Throws Error when a size does not fit
  /// (naming the size, what is free and what to lower).
  DecodeEngine(const ModelSpec& model, const EngineConfig& config);
  ~DecodeEngine();
  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;

  /// Runs one decode step for every request of the batch.
  StepStats step();

  [[nodiscard]] const EngineConfig& config() const noexcept;
  [[nodiscard]] const ModelSpec& model() const noexcept;
  /// GPU bytes held per request (KV rows, index keys, hot buffer, planes) as allocated.
  [[nodiscard]] std::size_t gpu_bytes_per_request() const noexcept;
  /// Current sequence length of each request (context + steps run).
  [[nodiscard]] std::int64_t sequence_length() const noexcept;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hisparse
