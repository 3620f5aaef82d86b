#include "model/model_spec.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {

constexpr std::array<std::pair<KvLayout, std::string_view>, 5> kLayoutNames{{
    {KvLayout::mla_fp8_656, "mla_fp8_656"},
    {KvLayout::mla_bf16_1152, "mla_bf16_1152"},
    {KvLayout::dsv4_c4_584, "dsv4_c4_584"},
    {KvLayout::gqa_bf16, "gqa_bf16"},
    {KvLayout::mla_bf16, "mla_bf16"},
}};

// Reads one YAML mapping with positions: every error names "<file>:<line>:<col>: <key path>".
// Keys are declared as they are read; check_unknown() then rejects whatever was not declared.
class YamlMap {
 public:
  YamlMap(YAML::Node node, std::string file, std::string path)
      : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

  [[nodiscard]] std::string where(const YAML::Node& at, std::string_view key) const {
    const YAML::Mark m = at.Mark();
    const int line = m.line < 0 ? 1 : m.line + 1;
    const int col = m.column < 0 ? 1 : m.column + 1;
    return fmt::format("{}:{}:{}: {}", file_, line, col, key_path(key));
  }
  [[nodiscard]] std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
  }
  [[nodiscard]] bool has(std::string_view key) {
    known_.emplace(key);
    return static_cast<bool>(node_[std::string(key)]);
  }
  [[nodiscard]] YAML::Node get(std::string_view key) {
    known_.emplace(key);
    return node_[std::string(key)];
  }
  [[nodiscard]] YAML::Node require(std::string_view key) {
    YAML::Node n = get(key);
    if (!n)
      throw Error(
          where(node_, key), fmt::format("missing required key '{}'", key),
          fmt::format("add `{}:` to {}", key, path_.empty() ? "the file" : "`" + path_ + ":`"));
    return n;
  }

  [[nodiscard]] std::string scalar(const YAML::Node& n, std::string_view key,
                                   std::string_view expected) const {
    if (!n.IsScalar())
      throw Error(where(n, key), fmt::format("expected {}, got a {}", expected, kind_of(n)),
                  fmt::format("write `{}: <{}>`", key, expected));
    return n.Scalar();
  }
  [[nodiscard]] long long integer(const YAML::Node& n, std::string_view key) const {
    const std::string s = scalar(n, key, "an integer");
    long long v = 0;
    std::istringstream in(s);
    in >> v;
    if (in.fail() || !(in >> std::ws).eof())
      throw Error(where(n, key), fmt::format("expected an integer, got '{}'", s),
                  fmt::format("write a whole number, e.g. `{}: 4`", key));
    return v;
  }
  [[nodiscard]] int positive_int(std::string_view key) {
    return positive_int_at(require(key), key);
  }
  [[nodiscard]] int positive_int_at(const YAML::Node& n, std::string_view key) const {
    const long long v = integer(n, key);
    if (v <= 0 || v > std::numeric_limits<int>::max())
      throw Error(where(n, key), fmt::format("must be a positive integer, got {}", v),
                  fmt::format("set `{}` to a value between 1 and {}", key,
                              std::numeric_limits<int>::max()));
    return static_cast<int>(v);
  }
  [[nodiscard]] int optional_positive_int(std::string_view key, int fallback) {
    const YAML::Node n = get(key);
    return n ? positive_int_at(n, key) : fallback;
  }
  [[nodiscard]] int optional_non_negative_int(std::string_view key, int fallback) {
    const YAML::Node n = get(key);
    if (!n) return fallback;
    const long long v = integer(n, key);
    if (v < 0 || v > std::numeric_limits<int>::max())
      throw Error(where(n, key), fmt::format("must be zero or a positive integer, got {}", v),
                  fmt::format("set `{}` to 0 or more", key));
    return static_cast<int>(v);
  }
  [[nodiscard]] double optional_positive_real(std::string_view key, double fallback) {
    const YAML::Node n = get(key);
    if (!n) return fallback;
    const std::string s = scalar(n, key, "a number");
    double v = 0;
    std::istringstream in(s);
    in >> v;
    if (in.fail() || !(in >> std::ws).eof())
      throw Error(where(n, key), fmt::format("expected a number, got '{}'", s),
                  fmt::format("write a number, e.g. `{}: 1e-6`", key));
    if (!(v > 0))
      throw Error(where(n, key), fmt::format("must be positive, got {}", s),
                  fmt::format("set `{}` to a value above 0", key));
    return v;
  }
  [[nodiscard]] bool optional_bool(std::string_view key, bool fallback) {
    const YAML::Node n = get(key);
    if (!n) return fallback;
    const std::string s = scalar(n, key, "true or false");
    if (s == "true") return true;
    if (s == "false") return false;
    throw Error(where(n, key), fmt::format("expected true or false, got '{}'", s),
                fmt::format("write `{}: true` or `{}: false`", key, key));
  }
  [[nodiscard]] std::string choice(const YAML::Node& n, std::string_view key,
                                   std::initializer_list<std::string_view> options) const {
    const std::string s = scalar(n, key, "a name");
    for (auto o : options)
      if (o == s) return s;
    throw Error(where(n, key), fmt::format("unknown value '{}'", s),
                fmt::format("use one of {}", fmt::join(options, ", ")));
  }
  [[nodiscard]] YamlMap child(std::string_view key, bool required) {
    YAML::Node n = required ? require(key) : get(key);
    if (n && !n.IsMap())
      throw Error(where(n, key), fmt::format("expected a mapping, got a {}", kind_of(n)),
                  fmt::format("write `{}:` followed by indented `key: value` lines", key));
    return YamlMap(n, file_, key_path(key));
  }
  [[nodiscard]] explicit operator bool() const { return static_cast<bool>(node_); }
  [[nodiscard]] const YAML::Node& node() const noexcept { return node_; }

  /// Rejects keys that were never declared; `also` lists keys valid elsewhere (better message).
  void check_unknown(const std::set<std::string>& not_here = {}, std::string_view why = {}) const {
    if (!node_) return;
    for (const auto& kv : node_) {
      const std::string key = kv.first.Scalar();
      if (known_.count(key)) continue;
      if (not_here.count(key))
        throw Error(where(kv.first, key), fmt::format("key '{}' {}", key, why),
                    fmt::format("remove `{}`", key));
      std::vector<std::string> names(known_.begin(), known_.end());
      throw Error(where(kv.first, key), fmt::format("unknown key '{}'", key),
                  fmt::format("valid keys here: {}", fmt::join(names, ", ")));
    }
  }

  static std::string kind_of(const YAML::Node& n) {
    if (n.IsMap()) return "mapping";
    if (n.IsSequence()) return "list";
    if (n.IsNull()) return "null value";
    return "scalar";
  }

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
};

const std::set<std::string> kMlaKeys{"heads",      "q_lora_rank",      "kv_lora_rank",
                                     "v_head_dim", "qk_nope_head_dim", "qk_rope_head_dim"};
const std::set<std::string> kGqaKeys{"q_heads", "kv_heads", "head_dim", "qk_norm"};

/// RoPE rotates channel pairs, so every rotated width must be even.
void require_even_rope_width(YamlMap& map, std::string_view key, int width, int example) {
  if (width % 2 != 0)
    throw Error(map.where(map.get(key), key),
                fmt::format("must be even (RoPE rotates pairs), got {}", width),
                fmt::format("use an even width such as {}", example));
}

void parse_attention(YamlMap& root, ModelSpec& m) {
  YamlMap a = root.child("attention", true);
  const std::string kind = a.choice(a.require("kind"), "kind", {"mla", "gqa"});
  if (kind == "mla") {
    m.attention = AttentionKind::mla;
    m.mla.heads = a.positive_int("heads");
    m.mla.q_lora_rank = a.positive_int("q_lora_rank");
    m.mla.kv_lora_rank = a.positive_int("kv_lora_rank");
    m.mla.qk_nope_head_dim = a.positive_int("qk_nope_head_dim");
    m.mla.qk_rope_head_dim = a.positive_int("qk_rope_head_dim");
    m.mla.v_head_dim = a.positive_int("v_head_dim");
    a.check_unknown(kGqaKeys, "belongs to attention.kind gqa, not mla");
    require_even_rope_width(a, "qk_rope_head_dim", m.mla.qk_rope_head_dim, 64);
  } else {
    m.attention = AttentionKind::gqa;
    m.gqa.q_heads = a.positive_int("q_heads");
    m.gqa.kv_heads = a.positive_int("kv_heads");
    m.gqa.head_dim = a.positive_int("head_dim");
    m.gqa.qk_norm = a.optional_bool("qk_norm", false);
    a.check_unknown(kMlaKeys, "belongs to attention.kind mla, not gqa");
    if (m.gqa.q_heads % m.gqa.kv_heads != 0)
      throw Error(
          a.where(a.get("q_heads"), "q_heads"),
          fmt::format("q_heads {} is not a multiple of kv_heads {}", m.gqa.q_heads, m.gqa.kv_heads),
          "make q_heads a multiple of kv_heads (each KV head serves q_heads / kv_heads "
          "query heads)");
    require_even_rope_width(a, "head_dim", m.gqa.head_dim, 128);
  }
}

void parse_indexer(YamlMap& root, ModelSpec& m) {
  YamlMap ix = root.child("indexer", false);
  if (!ix) return;
  m.indexer.present = true;
  m.indexer.heads = ix.positive_int("heads");
  m.indexer.head_dim = ix.positive_int("head_dim");
  m.indexer.top_k = ix.positive_int("top_k");
  m.indexer.every_n_layers = ix.optional_positive_int("every_n_layers", 1);
  ix.check_unknown();
  if (!m.is_mla())
    throw Error(root.where(root.get("indexer"), "indexer"),
                "a DSA indexer needs attention.kind mla (its queries come from the q_lora latent)",
                "remove `indexer:` (sparse-gpu on a GQA model uses exact top-k) or use kind mla");
  require_even_rope_width(ix, "head_dim", m.indexer.head_dim, 128);
}

void parse_ffn(YamlMap& root, ModelSpec& m) {
  YamlMap f = root.child("ffn", true);
  const std::string kind = f.choice(f.require("kind"), "kind", {"dense", "moe"});
  if (kind == "dense") {
    m.ffn.kind = FfnKind::dense;
    m.ffn.dense_width = f.positive_int("dense_width");
    f.check_unknown({"first_dense_layers", "experts", "experts_held", "active_experts",
                     "shared_experts", "expert_width"},
                    "belongs to ffn.kind moe, not dense");
    return;
  }
  m.ffn.kind = FfnKind::moe;
  m.ffn.first_dense_layers = f.optional_non_negative_int("first_dense_layers", 0);
  m.ffn.dense_width = m.ffn.first_dense_layers > 0 ? f.positive_int("dense_width")
                                                   : f.optional_positive_int("dense_width", 0);
  m.ffn.experts = f.positive_int("experts");
  m.ffn.experts_held = f.optional_positive_int("experts_held", m.ffn.experts);
  m.ffn.active_experts = f.positive_int("active_experts");
  m.ffn.shared_experts = f.optional_non_negative_int("shared_experts", 0);
  m.ffn.expert_width = f.positive_int("expert_width");
  f.check_unknown();
  if (m.ffn.experts_held > m.ffn.experts)
    throw Error(
        f.where(f.get("experts_held"), "experts_held"),
        fmt::format("experts_held {} exceeds experts {}", m.ffn.experts_held, m.ffn.experts),
        "set experts_held to experts / ranks (at most experts)");
  if (m.ffn.active_experts > m.ffn.experts_held)
    throw Error(f.where(f.get("active_experts"), "active_experts"),
                fmt::format("active_experts {} exceeds experts_held {}", m.ffn.active_experts,
                            m.ffn.experts_held),
                "the router picks among the experts this rank holds: lower active_experts or raise "
                "experts_held");
  if (m.ffn.first_dense_layers >= m.layers)
    throw Error(f.where(f.get("first_dense_layers"), "first_dense_layers"),
                fmt::format("first_dense_layers {} leaves no MoE layer of {}",
                            m.ffn.first_dense_layers, m.layers),
                "use ffn.kind dense, or set first_dense_layers below layers");
}

void parse_layout(YamlMap& root, ModelSpec& m) {
  const YAML::Node n = root.get("kv_layout");
  if (!n) {
    m.kv_layout = m.is_mla() ? KvLayout::mla_bf16 : KvLayout::gqa_bf16;
    return;
  }
  const std::string s = root.choice(
      n, "kv_layout", {"mla_fp8_656", "mla_bf16_1152", "dsv4_c4_584", "gqa_bf16", "mla_bf16"});
  for (const auto& [layout, name] : kLayoutNames)
    if (name == s) m.kv_layout = layout;
  const bool mla_layout = m.kv_layout != KvLayout::gqa_bf16;
  if (mla_layout != m.is_mla())
    throw Error(
        root.where(n, "kv_layout"),
        fmt::format("layout {} does not fit attention.kind {}", s, name_of(m.attention)),
        m.is_mla() ? "use mla_bf16, mla_bf16_1152, mla_fp8_656 or dsv4_c4_584" : "use gqa_bf16");
  const bool fixed_512_64 =
      m.kv_layout == KvLayout::mla_fp8_656 || m.kv_layout == KvLayout::mla_bf16_1152;
  if (fixed_512_64 && (m.mla.kv_lora_rank != 512 || m.mla.qk_rope_head_dim != 64))
    throw Error(root.where(n, "kv_layout"),
                fmt::format("layout {} stores a 512-wide latent and a 64-wide rope part, but the "
                            "model has kv_lora_rank {} and qk_rope_head_dim {}",
                            s, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim),
                "use kv_layout mla_bf16 (sized from the shape) for other MLA shapes");
}

ModelSpec parse_root(const YAML::Node& doc, const std::filesystem::path& origin) {
  const std::string file = origin.string();
  if (!doc.IsMap())
    throw Error(fmt::format("{}:1:1", file),
                fmt::format("expected a mapping of model keys, got a {}", YamlMap::kind_of(doc)),
                "start from a preset in scenarios/models/");
  YamlMap root(doc, file, "");
  ModelSpec m;
  m.source = origin;
  m.name =
      root.has("name") ? root.scalar(root.get("name"), "name", "a name") : origin.stem().string();
  m.layers = root.positive_int("layers");
  m.hidden = root.positive_int("hidden");
  m.vocab = root.positive_int("vocab");
  parse_attention(root, m);
  parse_indexer(root, m);
  parse_ffn(root, m);
  parse_layout(root, m);
  if (root.has("weight_dtype"))
    m.weight_dtype = root.choice(root.get("weight_dtype"), "weight_dtype", {"bf16", "fp8_e4m3"});
  m.rope_theta = static_cast<float>(root.optional_positive_real("rope_theta", 10000.0));
  m.norm_eps = static_cast<float>(root.optional_positive_real("norm_eps", 1e-6));
  if (const YAML::Node n = root.get("weight_seed")) {
    const long long seed = root.integer(n, "weight_seed");
    if (seed < 0)
      throw Error(root.where(n, "weight_seed"), fmt::format("must not be negative, got {}", seed),
                  "use 0 or a positive integer");
    m.weight_seed = static_cast<std::uint64_t>(seed);
  }
  if (const YAML::Node n = root.get("weights")) {
    std::filesystem::path p = root.scalar(n, "weights", "a path");
    if (p.is_relative()) p = origin.parent_path() / p;
    m.weights = p;
  }
  root.check_unknown();
  return m;
}

}  // namespace

std::string_view name_of(KvLayout layout) noexcept {
  for (const auto& [l, name] : kLayoutNames)
    if (l == layout) return name;
  return "unknown";
}
std::string_view name_of(AttentionKind kind) noexcept {
  return kind == AttentionKind::mla ? "mla" : "gqa";
}
std::string_view name_of(FfnKind kind) noexcept {
  return kind == FfnKind::moe ? "moe" : "dense";
}

std::size_t ModelSpec::kv_row_bytes() const noexcept {
  switch (kv_layout) {
    case KvLayout::mla_fp8_656:
      return 656;
    case KvLayout::mla_bf16_1152:
      return 1152;
    case KvLayout::dsv4_c4_584:
      return 584;
    case KvLayout::gqa_bf16:
      return 2u * static_cast<std::size_t>(gqa.kv_heads) * static_cast<std::size_t>(gqa.head_dim) *
             2u;
    case KvLayout::mla_bf16:
      return static_cast<std::size_t>(mla.kv_lora_rank + mla.qk_rope_head_dim) * 2u;
  }
  return 0;
}

std::size_t ModelSpec::index_key_bytes() const noexcept {
  // fp8 per channel plus one fp32 scale per key.
  return indexer.present ? static_cast<std::size_t>(indexer.head_dim) + 4u : 0u;
}

std::filesystem::path model_presets_dir() {
  if (const char* env = std::getenv("HISPARSE_MODELS_DIR"); env && *env) return env;
  return std::filesystem::path(HISPARSE_SOURCE_DIR) / "scenarios" / "models";
}

std::vector<std::string> list_model_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(model_presets_dir(), ec))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec parse_model_yaml(const std::string& text, const std::filesystem::path& origin) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{}:{}:{}", origin.string(), e.mark.line + 1, e.mark.column + 1),
                fmt::format("invalid YAML: {}", e.msg), "fix the syntax at that position");
  }
  return parse_root(doc, origin);
}

ModelSpec load_model(const std::string& name_or_path) {
  HISPARSE_FUNC_RANGE();
  const std::filesystem::path as_path(name_or_path);
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               as_path.extension() == ".yaml" || as_path.extension() == ".yml";
  std::filesystem::path file = as_path;
  if (!looks_like_path) {
    file = model_presets_dir() / (name_or_path + ".yaml");
    if (!std::filesystem::exists(file)) {
      const auto presets = list_model_presets();
      throw Error(fmt::format("model '{}'", name_or_path), "no such preset or file",
                  fmt::format("use one of {} or a path to a model YAML file",
                              presets.empty() ? std::string("(no presets found)")
                                              : fmt::format("{}", fmt::join(presets, ", "))));
    }
  }
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(file.string(), "cannot open the model file",
                "check the path (or give a preset name: see `hisparse-bench list`)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_yaml(text.str(), file);
}

}  // namespace hisparse
