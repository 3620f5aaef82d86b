// ReplayCapture: keys, queries and (optionally) values captured from a real model for one
// sequence, loaded for KvWorkload's "replay" generator and checked against the model's
// attention geometry.
//
// Where the tensors come from (`workload.replay_path`):
//  - a directory holding k.npy and q.npy (and v.npy), or one file per layer
//    layers.0.k.npy, layers.0.q.npy, layers.1.k.npy, ...;
//  - a .safetensors file holding tensors "k", "q" (and "v"), or "layers.N.k", "layers.N.q", ...
// Other files and tensors are ignored (and listed in notes()).
//
// Shapes (row-major; a tensor without the layer dimension is one layer):
//   k  [layers, kv_heads, tokens, key_dim]  or per layer [kv_heads, tokens, key_dim]
//   v  [layers, kv_heads, tokens, value_dim] likewise (same token count as k)
//   q  [layers, steps, q_heads, key_dim]    or per layer [steps, q_heads, key_dim]
// A per-layer tensor may carry a leading batch dimension of 1 (PyTorch caches do).
// GQA: key_dim = value_dim = head_dim, post-RoPE keys and queries. MLA: kv_heads = 1, a key row
// is [latent (kv_lora_rank) | rope part], queries are absorbed [W_uk^T q_nope | q_rope], and the
// values are the latent part of the keys (a captured v is ignored).
// Model layer l replays captured layer l mod (captured layers), so one captured layer can serve
// every layer; decode step s replays captured query s mod steps.
// Element types: f32, f16, bf16 (.npy '<u2' bits), f64 (.npy), F8_E4M3 (safetensors), kept as
// stored and converted on access. Non-finite values are rejected when loading.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace hisparse {

/// The shapes the workload serves, from the model (see KvWorkload).
struct ReplayGeometry {
  std::string model_name;
  bool mla = false;
  int layers = 0;
  int kv_heads = 0;
  int q_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  /// Note how the model's layers map onto the captured ones ("model layer l replays captured layer
  /// l mod n"): true for a decode replay; the quality study, which reads the captured layers
  /// themselves, turns it off.
  bool describe_layer_reuse = true;
};

class ReplayCapture {
 public:
  /// Loads and checks every tensor; throws Error naming `setting` (where the path was given), the
  /// file (and tensor), what does not match and the fix.
  ReplayCapture(const std::filesystem::path& path, const ReplayGeometry& geometry,
                const std::string& setting = "workload.replay_path");
  ~ReplayCapture();
  ReplayCapture(const ReplayCapture&) = delete;
  ReplayCapture& operator=(const ReplayCapture&) = delete;

  [[nodiscard]] std::int64_t tokens() const noexcept;  ///< captured tokens (keys, values)
  [[nodiscard]] std::int64_t steps() const noexcept;   ///< captured query steps
  [[nodiscard]] int key_layers() const noexcept;       ///< captured layers of k
  [[nodiscard]] int query_layers() const noexcept;     ///< captured layers of q
  [[nodiscard]] bool has_values() const noexcept;      ///< a usable v was captured (GQA only)
  /// Where the keys came from, for messages ("dir/k.npy", "file.safetensors: tensor k").
  [[nodiscard]] const std::string& key_source() const noexcept;
  /// Facts a report should show: layer reuse, ignored tensors.
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept;

  /// Keys of tokens [first, first + count) of (model layer, kv_head): [count x key_dim].
  /// Throws Error when the range leaves the captured tokens.
  void keys(int layer, int kv_head, std::int64_t first, std::int64_t count, float* out) const;
  /// Values likewise: [count x value_dim]; only when has_values().
  void values(int layer, int kv_head, std::int64_t first, std::int64_t count, float* out) const;
  /// Queries of decode step `step` (captured step step mod steps()): [q_heads x key_dim].
  void queries(int layer, std::int64_t step, float* out) const;
  /// Per-channel variance of the captured keys of (layer, kv_head) over tokens from
  /// `skip_tokens` on (all tokens when fewer than two remain): [key_dim].
  [[nodiscard]] std::vector<float> key_variance(int layer, int kv_head, int skip_tokens) const;

 private:
  struct Data;
  std::unique_ptr<Data> d_;
};

}  // namespace hisparse
