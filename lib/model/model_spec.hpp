// A model architecture, loaded from YAML (scenarios/models/<name>.yaml or any path).
// Shapes follow REFERENCE.md section 3. Weights are seeded synthetic unless `weights:` names a
// safetensors file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace hisparse {

enum class AttentionKind { mla, gqa };
enum class FfnKind { dense, moe };

struct MlaShape {
  int heads = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;  ///< latent width (512 for GLM/DeepSeek)
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  ///< 64
  int v_head_dim = 0;
};

struct GqaShape {
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;
};

struct IndexerShape {
  bool present = false;
  int heads = 0;
  int head_dim = 0;
  int top_k = 0;           ///< 2048 for GLM/DeepSeek
  int every_n_layers = 1;  ///< GLM-5.2 shares one indexer per 4 layers
};

struct FfnShape {
  FfnKind kind = FfnKind::dense;
  int dense_width = 0;  ///< width of dense FFN layers (and of every layer when kind == dense)
  int first_dense_layers = 0;
  int experts = 0;       ///< total routed experts
  int experts_held = 0;  ///< routed experts this rank holds (experts / ranks)
  int active_experts = 0;
  int shared_experts = 0;
  int expert_width = 0;
};

/// Bytes of one KV-cache row (one token, one layer) in the layout the model stores.
enum class KvLayout {
  mla_fp8_656,    ///< 512 fp8 latent + 4 fp32 scales + 64 bf16 rope = 656 B
  mla_bf16_1152,  ///< (512 + 64) bf16 = 1152 B
  dsv4_c4_584,    ///< DeepSeek-V4 C4 = 584 B
  gqa_bf16,       ///< K and V of every KV head, bf16: 2 * kv_heads * head_dim * 2 B
  mla_bf16,       ///< (kv_lora_rank + qk_rope_head_dim) bf16, any MLA shape (tiny models)
};

/// "mla_fp8_656", "mla_bf16_1152", "dsv4_c4_584", "gqa_bf16", "mla_bf16" (the YAML names).
[[nodiscard]] std::string_view name_of(KvLayout layout) noexcept;
[[nodiscard]] std::string_view name_of(AttentionKind kind) noexcept;  ///< "mla" | "gqa"
[[nodiscard]] std::string_view name_of(FfnKind kind) noexcept;        ///< "dense" | "moe"

struct ModelSpec {
  std::string name;
  std::filesystem::path source;  ///< the YAML file it came from
  int layers = 0;
  int hidden = 0;
  int vocab = 0;
  AttentionKind attention = AttentionKind::gqa;
  MlaShape mla;
  GqaShape gqa;
  IndexerShape indexer;
  FfnShape ffn;
  KvLayout kv_layout = KvLayout::gqa_bf16;
  std::string weight_dtype = "bf16";  ///< bf16 | fp8_e4m3 (for memory accounting)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-6f;
  std::uint64_t weight_seed = 0;  ///< synthetic weights seed
  std::filesystem::path weights;  ///< optional safetensors file

  [[nodiscard]] bool is_mla() const noexcept { return attention == AttentionKind::mla; }
  [[nodiscard]] bool has_indexer() const noexcept { return indexer.present; }
  /// Bytes of one KV row per token per layer in kv_layout.
  [[nodiscard]] std::size_t kv_row_bytes() const noexcept;
  /// Bytes of one indexer key per token per layer (128 fp8 + fp32 scale = 132 for DSA models).
  [[nodiscard]] std::size_t index_key_bytes() const noexcept;
};

/// Loads a model by preset name (looked up in scenarios/models/) or by path to a YAML file.
/// Throws Error with file:line:column, the key and the fix on any bad field.
[[nodiscard]] ModelSpec load_model(const std::string& name_or_path);
/// Names of the presets found in scenarios/models/.
[[nodiscard]] std::vector<std::string> list_model_presets();
/// Folder searched for presets: $HISPARSE_MODELS_DIR if set, else <source>/scenarios/models.
[[nodiscard]] std::filesystem::path model_presets_dir();
/// Parses model YAML text; `origin` names the file in error messages (relative `weights:` paths
/// resolve against its folder).
[[nodiscard]] ModelSpec parse_model_yaml(const std::string& text,
                                         const std::filesystem::path& origin);

}  // namespace hisparse
