// The CPU decode engine's class and the host arithmetic its steps share (cpu_engine.cpp: set-up,
// context and the step; cpu_engine_layers.cpp: attention, the DSA selection and the FFN).
#pragma once

#include "model/decode_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/topk/topk.hpp"
#include "model/capacity_model.hpp"
#include "model/detail/engine_impl.hpp"
#include "model/engine_fathom_index.hpp"
#include "model/engine_hot_rows.hpp"
#include "model/kv_workload.hpp"
#include "model/selection_quality.hpp"
#include "model/weights.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::detail {
namespace cpu {

using Clock = std::chrono::steady_clock;
using std::size_t;

[[nodiscard]] inline size_t zu(std::int64_t v) {
  return static_cast<size_t>(v);
}

// Adds the model's query to the workload's, scaled to `share` of its RMS (nothing at share 0).
inline void blend_query(float* workload_q, const float* model_q, int n, float share) {
  if (share == 0.0f) return;
  double wl = 0, md = 0;
  for (int i = 0; i < n; ++i) {
    wl += static_cast<double>(workload_q[i]) * workload_q[i];
    md += static_cast<double>(model_q[i]) * model_q[i];
  }
  if (md <= 0) return;
  const auto gain = static_cast<float>(share * std::sqrt(wl / md));
  for (int i = 0; i < n; ++i) workload_q[i] += gain * model_q[i];
}

// A linear layer. With bf16_gemm, as a bf16 deployment runs it (the CUDA engine's bf16 GEMM): the
// weights hold bf16 values already (ModelWeights), the activations are rounded to bf16, the sum
// is fp32.
inline void linear(bool bf16_gemm, const float* x, const float* w, float* y, int m, int n, int k,
                   float beta = 0.0f, int ldy = 0, float alpha = 1.0f) {
  thread_local std::vector<float> rounded;
  if (bf16_gemm) {
    rounded.assign(x, x + static_cast<std::size_t>(m) * static_cast<std::size_t>(k));
    detail::round_to_bf16_values(rounded.data(), rounded.size());
    x = rounded.data();
  }
  kernels::GemmArgs a;
  a.x = x;
  a.w = w;
  a.y = y;
  a.m = m;
  a.n = n;
  a.k = k;
  a.beta = beta;
  a.ldy = ldy;
  a.alpha = alpha;
  kernels::gemm_ref(a);
}

inline void rmsnorm(const float* x, const float* weight, float* y, int rows, int n, float eps,
                    int ld = 0) {
  kernels::RmsNormArgs a;
  a.x = x;
  a.weight = weight;
  a.y = y;
  a.rows = rows;
  a.n = n;
  a.eps = eps;
  a.ldx = ld;
  a.ldy = ld;
  kernels::rmsnorm_ref(a);
}

// Times a phase into StepStats::phase_ms (or quality_ms for the name "quality").
class PhaseTimer {
 public:
  PhaseTimer(StepStats& stats, const char* name)
      : stats_(stats), name_(name), start_(Clock::now()) {}
  ~PhaseTimer() {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
    if (std::string_view(name_) == "quality")
      stats_.quality_ms += ms;
    else
      stats_.phase_ms[name_] += ms;
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  StepStats& stats_;
  const char* name_;
  Clock::time_point start_;
};

}  // namespace cpu

// The CPU engine: the reference every other backend is checked against.
class CpuDecodeEngine final : public EngineImpl {
 public:
  CpuDecodeEngine(const ModelSpec& model, const EngineConfig& config);
  StepStats step() override;
  [[nodiscard]] const std::vector<std::string>& workload_notes() const noexcept override {
    return workload_.notes();
  }
  [[nodiscard]] std::vector<SelectionTrace> selection_traces() const override {
    return hot_rows_ ? hot_rows_->traces() : std::vector<SelectionTrace>{};
  }
  [[nodiscard]] std::vector<float> last_attention(int layer) const override;
  [[nodiscard]] std::vector<float> last_queries(int layer) const override;

  std::unique_ptr<HotRowCache> hot_rows_;
  std::vector<std::vector<float>> last_attention_;  ///< per layer
  std::vector<std::vector<float>> last_queries_;    ///< per layer, as attention read them

 private:
  void fill_context();
  void setup_offload();
  void ensure_pool_room() const;
  void place_hot(int layer, int kv_heads, std::int64_t seq_len, kernels::DecodeAttentionArgs& a,
                 StepStats& stats);
  void measure_quality(int layer, const kernels::DecodeAttentionArgs& sparse,
                       const float* sparse_out, int groups, StepStats& stats);
  void ensure_capacity(std::int64_t rows);
  void attention_gqa(int layer, const float* h, float* x, StepStats& stats);
  void attention_mla(int layer, const float* h, float* x, StepStats& stats);
  void select_dsa(int layer, const float* h, const float* q_a, StepStats& stats);
  void ffn(int layer, const float* h, float* x);
  /// Weight `suffix` of layer `layer`. Resolved once per (layer, name) and then cached, so a
  /// decode step neither formats names nor searches the tensor map.
  [[nodiscard]] const float* w(int layer, std::string_view suffix) const {
    auto& cache = layer_weights_[static_cast<std::size_t>(layer)];
    const auto it = cache.find(suffix);
    if (it != cache.end()) return it->second;
    const float* p =
        weights_.get(layer_tensor_name(model_, layer, suffix, config_.share_layer_weights));
    cache.emplace(suffix, p);
    return p;
  }
  [[nodiscard]] int indexer_layer(int layer) const {
    return layer - layer % model_.indexer.every_n_layers;
  }

  ModelWeights weights_;
  /// Per layer: weight name suffix -> tensor, filled by w() (std::less<> looks up string_views
  /// without building a string).
  mutable std::vector<std::map<std::string, const float*, std::less<>>> layer_weights_;
  KvWorkload workload_;
  std::int64_t pool_capacity_ = 0;  ///< tokens per stream of the host pool / plane stores
  std::unique_ptr<FathomKeyIndex> fathom_index_;
  std::vector<std::int32_t> slots_;               ///< last swap-in output [streams][width]
  std::int64_t capacity_ = 0;                     ///< rows per (request, KV head) allocated
  std::vector<Buffer<float>> k_cache_, v_cache_;  ///< per layer [batch][kv_heads][capacity][dim]
  std::vector<Buffer<std::uint8_t>> index_keys_;  ///< per layer [batch][capacity][index_dim]
  std::vector<Buffer<float>> index_scales_;       ///< per layer [batch][capacity]
  std::vector<std::int32_t> tokens_;
  std::vector<std::int32_t> indices_;  ///< last selection [batch][groups][top_k]
};

}  // namespace hisparse::detail
