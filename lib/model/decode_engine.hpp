// DecodeEngine: real decode steps over all layers for a batch of requests, on the CPU backend
// (reference) or the CUDA backend. The context of each request is synthesised by KvWorkload (a
// decode-only benchmark needs the cache, not the prefill), then every step runs the model on the
// batch's newest tokens, appends their KV and picks the next tokens greedily.
//
// Modes (per layer of a step):
//   dense           attention over every cached row;
//   sparse-gpu      DSA indexer top-k (MLA) or exact top-k by group attention mass (GQA), then
//                   attention over the selected GPU-resident rows;
//   hisparse        the sparse-gpu selection, then a HotCache swap-in per layer: attention reads
//                   the hot-buffer slots it returns (misses fetched from the host pool);
//   fathom          (GQA) bit-plane scan of the offloaded 4-bit keys (FathomSelector), then exact
//                   attention over the selected rows read from host memory;
//   hisparse+fathom the Fathom selection through the HotCache swap-in.
// Quality (sparse modes, on a sample of layers: the first and the last): selection recall against
// each query head's exact top-k, and the relative L2 error of the attention output against dense
// attention over all tokens on the same layer inputs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "fathom/depth_planner.hpp"
#include "hotcache/policies.hpp"
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
  int sink_tokens = 4;        ///< tokens that attract attention regardless of content
  double recency_bias = 0.5;  ///< strength of attention to recent tokens, 0..1
  double query_drift = 0.05;  ///< step-to-step change of each query, 0..1
  std::string replay_path;    ///< captured q/k tensors (safetensors or .npy) for replay
};

struct EngineConfig {
  Mode mode = Mode::dense;
  Backend backend = Backend::cpu;
  int concurrency = 1;                 ///< requests in the batch
  std::int64_t context_length = 1024;  ///< tokens already in each request's cache at step 0
  int top_k = 0;                       ///< 0: the model's indexer top_k (DSA) or 2048
  int hot_buffer = 0;                  ///< hisparse slots per request and layer (0: 2 * top_k)
  int budget_bits = 48;                ///< fathom plane bits per token per KV head
  bool fathom_klt = false;             ///< fathom modes: plan and scan in each stream's KLT basis
  /// fathom modes: how depths are planned (fathom::PlanRule; measured: from each stream's
  /// calibrated plane reads)
  fathom::PlanRule fathom_rule = fathom::PlanRule::paper;
  bool fathom_centre_keys = false;  ///< fathom modes: keys minus their calibration mean (KeyCentre)
  /// fathom modes, optional: a budget per (layer, KV head), layer by layer (rows reused for
  /// deeper layers); each KV head plans budget_bits times its share of the table's mean
  /// (fathom::head_budgets)
  std::vector<int> fathom_head_budgets;
  std::string policy = "lru";  ///< hot-buffer replacement (analysis): lru|fifo|random|belady
  WorkloadSpec workload;
  int max_decode_steps = 0;     ///< steps the engine may run: sizes the host pool and plane stores
                                ///< of hisparse/fathom modes (0: 256); the Runner sets it
  bool quality_metrics = true;  ///< measure recall / attention error on sampled layers
  /// Synthetic weights of one representative layer serve every layer (weight_source_layer)
  bool share_layer_weights = false;
  /// Linear layers with bf16 weights and bf16-rounded activations (a bf16 deployment's GEMMs, half
  /// the weight bytes, tensor cores); false: fp32 GEMMs, whose CUDA results follow the CPU
  /// engine's within float rounding (bf16 rounding turns such differences into 2^-8 steps)
  bool bf16_gemm = false;
  /// CUDA engine, MLA models: the DSA indexer, top-k and swap-in run on a second stream while
  /// the first projects the queries and the new KV row; attention waits for both. Off: one
  /// stream, the selection after the projections (the same results either way)
  bool overlap_selection = true;
  /// CUDA engine: from the second step on, steps that need nothing from the host mid-step replay
  /// one CUDA graph of the whole step (CudaDecodeEngine::replays_graph); off: every step is
  /// enqueued kernel by kernel (the same results either way)
  bool cuda_graph = true;
  /// Numerical health (`run --verify`): the residual stream after every layer's attention and
  /// FFN, and the logits, checked for NaN and Inf; a step that finds one throws Error naming the
  /// layer and phase where it first appeared
  bool check_finite = false;
};

/// What one step did. Byte counts are those of the deployment's row layout (model.kv_row_bytes():
/// one KV row per token and layer on MLA, its 1 / kv_heads share per KV head on GQA), not of the
/// CPU engine's float rows.
struct StepStats {
  double step_ms = 0.0;                    ///< without quality_ms
  std::map<std::string, double> phase_ms;  ///< "embed", "indexer", "topk", "attention", "ffn", ...
                                           ///< plus "swap_in" (hisparse modes), "scan" (fathom)
  std::int64_t hits = 0;    ///< hot-buffer hits, newest token included (hisparse modes)
  std::int64_t misses = 0;  ///< rows fetched from the host pool (hisparse modes)
  /// Bytes moved host -> device: misses x row bytes (hisparse modes), selected rows x row bytes
  /// (fathom: no rows are cached between steps); 0 for dense and sparse-gpu.
  std::int64_t bytes_h2d = 0;
  /// Bytes read to select rows: index keys (DSA, 132 B per token and indexer layer on the large
  /// models), keys (exact top-k on GQA: the K half of the row), plane words + fp16 scales (fathom).
  std::int64_t bytes_scanned = 0;
  /// Fathom modes: the step's depth plans (one per layer and KV stream) and the sums of their
  /// bits per token and active channels (FathomSelectStats); 0 in the other modes.
  std::int64_t plans = 0;
  double plan_bits = 0;
  std::int64_t plan_active_channels = 0;
  double recall = -1;               ///< selection recall, mean over sampled layers; -1 not measured
  double attention_rel_error = -1;  ///< relative L2 error vs dense attention; -1 not measured
  double quality_ms = 0.0;          ///< time spent measuring recall and error (not in step_ms)
  std::vector<std::int32_t> next_tokens;  ///< greedy choice per request
  bool graph_replay = false;              ///< CUDA engine: the step replayed the step's CUDA graph
};

namespace detail {
class EngineImpl;
}

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
  /// Notes about the workload (e.g. values synthesised beside a replayed capture), for the results.
  [[nodiscard]] const std::vector<std::string>& workload_notes() const noexcept;
  /// Hot-buffer slots per (stream, layer) in hisparse modes; 0 otherwise.
  [[nodiscard]] int hot_slots() const noexcept;
  /// Entries of one step's selection per stream: top_k (sparse-gpu, hisparse), sinks + recent +
  /// group x (top_k - sinks - recent) (fathom modes); 0 for dense.
  [[nodiscard]] int selection_width() const noexcept;
  /// KV streams per layer: requests (MLA) or requests x kv_heads (GQA).
  [[nodiscard]] int kv_streams() const noexcept;
  /// Hisparse modes: every selection the swap-in resolved since admission (warm-up included),
  /// index layer * kv_streams() + stream; empty in other modes. For hisparse::simulate_policy.
  [[nodiscard]] std::vector<SelectionTrace> selection_traces() const;
  /// The attention output of `layer` in the last step, [batch][q_heads][v_dim] (MLA: the attended
  /// latent before W_uv); empty before the first step.
  [[nodiscard]] std::vector<float> last_attention(int layer) const;
  /// The attention queries of `layer` in the last step, [batch][q_heads][key_dim] (MLA: the
  /// absorbed queries): a synthetic workload's queries with a quarter of the model's own mixed in
  /// (by RMS), or a replayed capture's exactly as captured; empty before the first step.
  [[nodiscard]] std::vector<float> last_queries(int layer) const;
  /// Layers whose quality is measured: the first and the last.
  [[nodiscard]] bool is_quality_layer(int layer) const noexcept;

 private:
  std::unique_ptr<detail::EngineImpl> impl_;
};

}  // namespace hisparse
