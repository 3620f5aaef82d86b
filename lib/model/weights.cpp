#include "model/weights.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "core/device.hpp"
#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "model/safetensors.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::int64_t TensorSpec::elements() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int weight_source_layer(const ModelSpec& m, int layer, bool shared_layers, bool indexer) noexcept {
  if (!shared_layers) return layer;
  if (indexer) return 0;
  const bool moe = m.ffn.kind == FfnKind::moe && layer >= m.ffn.first_dense_layers;
  return moe ? m.ffn.first_dense_layers : 0;
}

std::string layer_tensor_name(const ModelSpec& m, int layer, std::string_view suffix,
                              bool shared_layers) {
  const bool indexer = suffix.starts_with("self_attn.indexer.");
  return fmt::format("model.layers.{}.{}", weight_source_layer(m, layer, shared_layers, indexer),
                     suffix);
}

std::vector<TensorSpec> expected_tensors(const ModelSpec& m, bool shared_layers) {
  using I = TensorSpec::Init;
  std::vector<TensorSpec> t;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, I init = I::linear) {
    t.push_back({std::move(name), std::move(shape), init});
  };
  const std::int64_t H = m.hidden;
  add("model.embed_tokens.weight", {m.vocab, H});
  for (int i = 0; i < m.layers; ++i) {
    if (weight_source_layer(m, i, shared_layers) != i) continue;
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {H}, I::ones);
    add(p + "post_attention_layernorm.weight", {H}, I::ones);
    const std::string a = p + "self_attn.";
    if (m.is_mla()) {
      const MlaShape& s = m.mla;
      add(a + "q_a_proj.weight", {s.q_lora_rank, H});
      add(a + "q_a_layernorm.weight", {s.q_lora_rank}, I::ones);
      add(a + "q_b_proj.weight",
          {static_cast<std::int64_t>(s.heads) * (s.qk_nope_head_dim + s.qk_rope_head_dim),
           s.q_lora_rank});
      add(a + "kv_a_proj_with_mqa.weight", {s.kv_lora_rank + s.qk_rope_head_dim, H});
      add(a + "kv_a_layernorm.weight", {s.kv_lora_rank}, I::ones);
      add(a + "kv_b_proj.weight",
          {static_cast<std::int64_t>(s.heads) * (s.qk_nope_head_dim + s.v_head_dim),
           s.kv_lora_rank});
      add(a + "o_proj.weight", {H, static_cast<std::int64_t>(s.heads) * s.v_head_dim});
      if (m.has_indexer() && i % m.indexer.every_n_layers == 0) {
        const IndexerShape& x = m.indexer;
        add(a + "indexer.wq_b.weight",
            {static_cast<std::int64_t>(x.heads) * x.head_dim, s.q_lora_rank});
        add(a + "indexer.wk.weight", {x.head_dim, H});
        add(a + "indexer.k_norm.weight", {x.head_dim}, I::ones);
        add(a + "indexer.k_norm.bias", {x.head_dim}, I::zeros);
        add(a + "indexer.weights_proj.weight", {x.heads, H});
      }
    } else {
      const GqaShape& s = m.gqa;
      add(a + "q_proj.weight", {static_cast<std::int64_t>(s.q_heads) * s.head_dim, H});
      add(a + "k_proj.weight", {static_cast<std::int64_t>(s.kv_heads) * s.head_dim, H});
      add(a + "v_proj.weight", {static_cast<std::int64_t>(s.kv_heads) * s.head_dim, H});
      add(a + "o_proj.weight", {H, static_cast<std::int64_t>(s.q_heads) * s.head_dim});
      if (s.qk_norm) {
        add(a + "q_norm.weight", {s.head_dim}, I::ones);
        add(a + "k_norm.weight", {s.head_dim}, I::ones);
      }
    }
    const std::string f = p + "mlp.";
    auto swiglu = [&](const std::string& prefix, std::int64_t width) {
      add(prefix + "gate_proj.weight", {width, H});
      add(prefix + "up_proj.weight", {width, H});
      add(prefix + "down_proj.weight", {H, width});
    };
    if (m.ffn.kind == FfnKind::dense || i < m.ffn.first_dense_layers) {
      swiglu(f, m.ffn.dense_width);
    } else {
      add(f + "gate.weight", {m.ffn.experts, H});
      for (int e = 0; e < m.ffn.experts_held; ++e)
        swiglu(fmt::format("{}experts.{}.", f, e), m.ffn.expert_width);
      if (m.ffn.shared_experts > 0)
        swiglu(f + "shared_experts.",
               static_cast<std::int64_t>(m.ffn.shared_experts) * m.ffn.expert_width);
    }
  }
  add("model.norm.weight", {H}, I::ones);
  add("lm_head.weight", {m.vocab, H});
  return t;
}

ModelWeights::ModelWeights(const ModelSpec& model, bool shared_layers) {
  HISPARSE_FUNC_RANGE();
  if (shared_layers && !model.weights.empty())
    throw Error(fmt::format("model {}", model.name),
                fmt::format("share_layer_weights cannot be used with the weights of {}",
                            model.weights.string()),
                "set deployment.share_layer_weights: false, or drop `weights:` from the model "
                "YAML to run shared synthetic weights");
  const auto specs = expected_tensors(model, shared_layers);
  std::size_t total = 0;
  for (const auto& s : specs) total += static_cast<std::size_t>(s.elements());
  const std::size_t ram = Device::cpu().properties().total_memory;
  if (ram > 0 && total * sizeof(float) > ram / 2)
    throw Error(fmt::format("model {}", model.name),
                fmt::format("its float weights need {} but this host has {} of memory",
                            format_bytes(total * sizeof(float)), format_bytes(ram)),
                "run this model on the CUDA backend, or use a tiny-* preset on the CPU backend");
  for (const auto& s : specs) {
    std::vector<float> v(static_cast<std::size_t>(s.elements()));
    if (s.init == TensorSpec::Init::ones) {
      std::fill(v.begin(), v.end(), 1.0f);
    } else if (s.init == TensorSpec::Init::linear) {
      const std::uint64_t seed = model.weight_seed ^ fnv1a(s.name);
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.shape.back()));
      // Each value depends only on (seed, i), so the large tensors are filled by several threads.
      auto fill = [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i)
          v[i] = bf16_to_float(float_to_bf16(random_normal(seed, i) * scale));
      };
      const std::size_t threads =
          v.size() < (std::size_t{1} << 22) ? 1 : std::max(1u, std::thread::hardware_concurrency());
      std::vector<std::thread> pool;
      const std::size_t chunk = (v.size() + threads - 1) / threads;
      for (std::size_t t = 1; t < threads; ++t)
        pool.emplace_back(fill, std::min(v.size(), t * chunk), std::min(v.size(), (t + 1) * chunk));
      fill(0, std::min(v.size(), chunk));
      for (auto& th : pool) th.join();
    }
    tensors_.emplace(s.name, std::move(v));
  }
  floats_ = total;
  if (model.weights.empty()) return;

  const SafetensorsIndex index = read_safetensors_index(model.weights);
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& s : specs) by_name.emplace(s.name, &s);
  for (const auto& entry : index.tensors) {
    const auto it = by_name.find(entry.name);
    if (it == by_name.end()) {
      ignored_.push_back(entry.name);
      continue;
    }
    if (entry.shape != it->second->shape)
      throw Error(fmt::format("{}: tensor {}", model.weights.string(), entry.name),
                  fmt::format("shape {} does not match the model's {}", shape_text(entry.shape),
                              shape_text(it->second->shape)),
                  fmt::format("use weights made for {} ({}) or fix the model YAML {}", model.name,
                              model.source.string(), "shapes"));
    std::vector<float> values = read_safetensors_floats(index, entry);
    // The engines run linear layers in bf16: a wider checkpoint's values are rounded once here,
    // so that both backends multiply by the same weights.
    if (it->second->init == TensorSpec::Init::linear)
      for (float& v : values) v = bf16_to_float(float_to_bf16(v));
    tensors_[entry.name] = std::move(values);
    loaded_.push_back(entry.name);
  }
}

const float* ModelWeights::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw Error(fmt::format("weights: tensor {}", name), "the model has no such tensor",
                "see expected_tensors() for the names");
  return it->second.data();
}

}  // namespace hisparse
