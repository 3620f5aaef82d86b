// Model weights as float (CPU backend): seeded synthetic values, replaced tensor by tensor by a
// safetensors file when the model names one (`weights:`). Tensors absent from the file stay
// synthetic; tensors in the file that the model does not use are ignored and listed.
//
// Synthetic values: normal(0, 1) / sqrt(fan_in) rounded through bf16 (the values a bf16
// checkpoint holds), so activations stay O(1) through the layers; norm weights are 1, biases 0.
// Linear tensors read from a checkpoint are rounded to bf16 too: the engines run linear layers
// with bf16 weights and bf16-rounded activations (kernels/gemm/gemm.hpp).
//
// Tensor names (Hugging Face style; {i} = layer, {e} = local expert 0 .. experts_held - 1):
//   model.embed_tokens.weight [vocab, hidden]     model.norm.weight [hidden]
//   lm_head.weight [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight, post_attention_layernorm.weight [hidden]
//   GQA  self_attn.q_proj [q_heads*head_dim, hidden], k_proj / v_proj [kv_heads*head_dim, hidden],
//        o_proj [hidden, q_heads*head_dim], q_norm / k_norm [head_dim] (qk_norm)
//   MLA  self_attn.q_a_proj [q_lora, hidden], q_a_layernorm [q_lora],
//        q_b_proj [heads*(nope+rope), q_lora], kv_a_proj_with_mqa [kv_lora+rope, hidden],
//        kv_a_layernorm [kv_lora], kv_b_proj [heads*(nope+v), kv_lora], o_proj [hidden, heads*v]
//   DSA  self_attn.indexer.wq_b [ix_heads*ix_dim, q_lora], indexer.wk [ix_dim, hidden],
//        indexer.k_norm.weight / .bias [ix_dim], indexer.weights_proj [ix_heads, hidden]
//   FFN  mlp.gate_proj / up_proj [width, hidden], mlp.down_proj [hidden, width]
//   MoE  mlp.gate [experts, hidden] (router; rows 0 .. experts_held-1 are this rank's experts),
//        mlp.experts.{e}.gate_proj / up_proj / down_proj, mlp.shared_experts.gate_proj / up_proj
//        [shared*expert_width, hidden], mlp.shared_experts.down_proj [hidden, shared*expert_width]
// (every linear name ends in ".weight").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_spec.hpp"

namespace hisparse {

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  enum class Init { linear, ones, zeros } init = Init::linear;
  [[nodiscard]] std::int64_t elements() const noexcept;
};

/// Every tensor the model uses, with its shape, in a fixed order. With `shared_layers`, only the
/// layers weight_source_layer() names (0 and, on MoE models, first_dense_layers).
[[nodiscard]] std::vector<TensorSpec> expected_tensors(const ModelSpec& model,
                                                       bool shared_layers = false);

/// The layer whose tensors `layer` reads: itself, or with `shared_layers` the representative of
/// its kind (layer 0 for dense-FFN layers, the first MoE layer for MoE layers). `indexer`: the
/// DSA indexer's tensors, held by layer 0 when shared (every_n_layers divides 0).
[[nodiscard]] int weight_source_layer(const ModelSpec& model, int layer, bool shared_layers,
                                      bool indexer = false) noexcept;
/// "model.layers.{weight_source_layer}.{suffix}" (the indexer's when suffix starts with
/// "self_attn.indexer.").
[[nodiscard]] std::string layer_tensor_name(const ModelSpec& model, int layer,
                                            std::string_view suffix, bool shared_layers);

class ModelWeights {
 public:
  /// Synthetic weights from model.weight_seed, then tensors from model.weights (if set).
  /// `shared_layers`: only the representative layers' tensors (weight_source_layer); a
  /// safetensors file is then refused. Throws Error when the float weights would not fit in
  /// half of the host memory.
  explicit ModelWeights(const ModelSpec& model, bool shared_layers = false);

  /// The tensor's floats (row-major); throws Error for an unknown name.
  [[nodiscard]] const float* get(const std::string& name) const;
  [[nodiscard]] std::size_t float_count() const noexcept { return floats_; }
  /// Names taken from the safetensors file.
  [[nodiscard]] const std::vector<std::string>& loaded() const noexcept { return loaded_; }
  /// Names in the file that the model does not use.
  [[nodiscard]] const std::vector<std::string>& ignored() const noexcept { return ignored_; }

 private:
  std::map<std::string, std::vector<float>> tensors_;
  std::vector<std::string> loaded_;
  std::vector<std::string> ignored_;
  std::size_t floats_ = 0;
};

}  // namespace hisparse
