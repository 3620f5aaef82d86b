// KvWorkload: the synthetic context and queries of a decode benchmark (WorkloadSpec generator
// "synthetic"). Every value is a pure function of (seed, request, layer, head, token / step), so
// any component can ask for any slice in any order and get the same numbers.
//
// Geometry: GQA models have kv_heads KV heads of key_dim = value_dim = head_dim (keys are
// post-RoPE). MLA models have one "KV head" whose key row is [latent (kv_lora) | rope part]
// (key_dim = kv_lora + rope) and whose value is the latent part of that row (value_dim = kv_lora);
// its queries are absorbed queries [W_uk^T q_nope | q_rope] per attention head.
//
// Keys: k[t][j] = D[j] * z[t][j] + boost(t) * a[j], z ~ N(0, 1):
//  - D[j]: per-channel scale, variances spread evenly (log scale) over channel_spread_decades in a
//    seeded channel order per (layer, KV head); outlier_channels of them scaled by outlier_scale;
//  - a: a unit "anchor" direction per (layer, KV head) that every query leans towards, so
//    boost(t) raises token t's logit: sink tokens (t < sink_tokens) by about 8 sigma of the
//    logit spread, recent tokens by recency_bias x 3 sigma x exp(-age / 64) with age counted back
//    from the end of the context (tokens generated after it get the full recency boost).
// Values: N(0, 1) (GQA); MLA values are the latent keys.
// Queries: q = n_s + 0.5 sqrt(key_dim) a per head, n_s a random walk with correlation
// 1 - query_drift between consecutive steps (n_0 ~ N(0, 1)), so selections of successive steps
// overlap the more the smaller the drift.
// Replay (generator "replay", see model/replay_capture.hpp for the accepted files and shapes):
// keys and queries come from tensors captured from a real model; every request replays the same
// captured sequence. Values are the captured v when present, else the synthetic N(0, 1) values
// (said in notes()); MLA values stay the latent part of the keys. channel_variance() is the
// captured keys' variance over tokens 16 .. end, what calibration measures. DSA index keys and
// queries are channels of them, as for synthetic data. The context must fit in the captured
// tokens; decode steps beyond the captured queries start again from the first.
// Index keys (DSA): index_dim channels of the key picked in a seeded order per layer; index
// queries take the same channels of the attention queries (index head h uses attention head
// h mod q_heads), with weights 1 / index_heads, so the indexer ranks tokens much like attention.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/workload/workload_synth.hpp"
#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

class ReplayCapture;

class KvWorkload {
 public:
  KvWorkload(const ModelSpec& model, const WorkloadSpec& spec, int requests,
             std::int64_t context_length);

  [[nodiscard]] int requests() const noexcept { return requests_; }
  [[nodiscard]] std::int64_t context_length() const noexcept { return context_; }
  [[nodiscard]] int layers() const noexcept { return layers_; }
  [[nodiscard]] int kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] int q_heads() const noexcept { return q_heads_; }
  [[nodiscard]] int key_dim() const noexcept { return key_dim_; }
  [[nodiscard]] int value_dim() const noexcept { return value_dim_; }
  [[nodiscard]] int index_heads() const noexcept { return index_heads_; }  ///< 0 without indexer
  [[nodiscard]] int index_dim() const noexcept { return index_dim_; }
  /// True when keys and queries come from a capture (generator "replay").
  [[nodiscard]] bool replay() const noexcept { return capture_ != nullptr; }
  /// The capture being replayed (nullptr for synthetic workloads).
  [[nodiscard]] const ReplayCapture* capture() const noexcept { return capture_.get(); }
  /// What a report should say about the data (synthetic values under replay, layer reuse, ...).
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return notes_; }

  /// Keys of tokens [first, first + count) of (request, layer, kv_head): [count x key_dim].
  void keys(int request, int layer, int kv_head, std::int64_t first, std::int64_t count,
            float* out) const;
  /// Values likewise: [count x value_dim] (MLA: the latent part of the keys).
  void values(int request, int layer, int kv_head, std::int64_t first, std::int64_t count,
              float* out) const;
  /// Index keys (float, before fp8 quantisation): [count x index_dim]. DSA models only.
  void index_keys(int request, int layer, std::int64_t first, std::int64_t count, float* out) const;
  /// Variance of each key channel (the generator's, what calibration would measure): [key_dim].
  [[nodiscard]] std::vector<float> channel_variance(int layer, int kv_head) const;

  /// Queries of decode step `step` (0-based): [q_heads x key_dim]. Sequential steps are O(1);
  /// going back recomputes from step 0. Thread-safe.
  void queries(int request, int layer, std::int64_t step, float* out) const;
  /// Index queries of the step: [index_heads x index_dim]; weights are 1 / index_heads.
  void index_queries(int request, int layer, std::int64_t step, float* out) const;

  // What kernels/workload needs to make the same values on a GPU (synthetic workloads only).
  /// D and a of (layer, kv_head): [key_dim] each.
  [[nodiscard]] const std::vector<float>& key_scale(int layer, int kv_head) const {
    return scale_.at(static_cast<std::size_t>(layer * kv_heads_ + kv_head));
  }
  [[nodiscard]] const std::vector<float>& key_anchor(int layer, int kv_head) const {
    return anchor_.at(static_cast<std::size_t>(layer * kv_heads_ + kv_head));
  }
  /// The DSA index key's channels of the layer's key: [index_dim].
  [[nodiscard]] const std::vector<int>& index_channels(int layer) const {
    return index_channels_.at(static_cast<std::size_t>(layer));
  }
  [[nodiscard]] kernels::KeyBoost key_boost_params(int layer, int kv_head) const;
  [[nodiscard]] std::uint64_t key_seed(int request, int layer, int kv_head) const noexcept;
  [[nodiscard]] std::uint64_t value_seed(int request, int layer, int kv_head) const noexcept;
  [[nodiscard]] std::uint64_t query_seed(int request, int layer) const noexcept;
  /// The query walk: state = rho * state + fresh * n, query = state + gain * anchor.
  [[nodiscard]] float query_rho() const noexcept;
  [[nodiscard]] float query_fresh() const noexcept;
  [[nodiscard]] float query_anchor_gain() const noexcept;

  /// Top-k positions (increasing, -1 padded) among seq_len tokens for the step's workload
  /// queries: DSA models by the indexer (fp8 index keys), GQA models by exact attention mass
  /// summed over all query heads. For simulations that do not run the model (e.g. hot-buffer
  /// replacement studies); tokens beyond the context come from the same generator.
  [[nodiscard]] std::vector<std::int32_t> select(int request, int layer, std::int64_t step,
                                                 std::int64_t seq_len, int top_k) const;

 private:
  [[nodiscard]] std::uint64_t stream(std::uint64_t kind, std::uint64_t a, std::uint64_t b = 0,
                                     std::uint64_t c = 0) const noexcept;
  void load_capture(const ModelSpec& model);

  WorkloadSpec spec_;
  std::shared_ptr<const ReplayCapture> capture_;
  std::vector<std::string> notes_;
  bool mla_ = false;
  int requests_ = 0;
  std::int64_t context_ = 0;
  int layers_ = 0, kv_heads_ = 0, q_heads_ = 0, key_dim_ = 0, value_dim_ = 0;
  int index_heads_ = 0, index_dim_ = 0;
  std::vector<std::vector<float>> scale_;         ///< [layer * kv_heads + g][key_dim] D
  std::vector<std::vector<float>> anchor_;        ///< [layer * kv_heads + g][key_dim] a
  std::vector<float> sigma_;                      ///< [layer * kv_heads + g] sqrt(sum D^2)
  std::vector<std::vector<int>> index_channels_;  ///< [layer][index_dim]
  struct Walk {
    std::int64_t step = -1;
    std::vector<float> state;  ///< [q_heads x key_dim]
  };
  mutable std::mutex mutex_;
  mutable std::map<std::pair<int, int>, Walk> walks_;
};

}  // namespace hisparse
