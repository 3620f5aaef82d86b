#include "model/model_spec.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "model/mode.hpp"

namespace hisparse {
namespace {

// Parses `text` as "m.yaml" and returns the Error message (empty when it parsed).
std::string error_of(const std::string& text) {
  try {
    (void)parse_model_yaml(text, "m.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

const char* kGqa = R"(layers: 2
hidden: 64
vocab: 128
attention:
  kind: gqa
  q_heads: 4
  kv_heads: 2
  head_dim: 16
ffn:
  kind: dense
  dense_width: 96
)";

/// kGqa with its first `from` replaced by `to`.
std::string gqa_with(const std::string& from, const std::string& to) {
  std::string text = kGqa;
  text.replace(text.find(from), from.size(), to);
  return text;
}

TEST(ModelMode, NamesRoundTripAndUnknownIsRejected) {
  for (Mode m :
       {Mode::dense, Mode::sparse_gpu, Mode::hisparse, Mode::fathom, Mode::hisparse_fathom})
    EXPECT_EQ(parse_mode(name_of(m), "x"), m);
  EXPECT_EQ(name_of(Mode::hisparse_fathom), "hisparse+fathom");
  try {
    (void)parse_mode("sparse_gpu", "s.yaml:4:9: sweep.mode");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "s.yaml:4:9: sweep.mode: unknown mode 'sparse_gpu'; use one of dense, sparse-gpu, "
              "hisparse, fathom, hisparse+fathom");
  }
}

TEST(ModelSpec, PresetsAreListedAndLoad) {
  const auto presets = list_model_presets();
  for (const char* name :
       {"tiny-gqa", "tiny-dsa", "qwen3-8b", "glm-5.1-fp8-rank", "deepseek-v3.2-rank"}) {
    EXPECT_NE(std::find(presets.begin(), presets.end(), name), presets.end()) << name;
    const ModelSpec m = load_model(name);
    EXPECT_EQ(m.name, name);
  }
}

TEST(ModelSpec, GlmRankShapes) {
  const ModelSpec m = load_model("glm-5.1-fp8-rank");
  EXPECT_EQ(m.layers, 78);
  EXPECT_EQ(m.hidden, 6144);
  EXPECT_EQ(m.vocab, 154880);
  EXPECT_TRUE(m.is_mla());
  EXPECT_EQ(m.mla.heads, 64);
  EXPECT_EQ(m.mla.q_lora_rank, 2048);
  EXPECT_EQ(m.mla.qk_nope_head_dim, 192);
  EXPECT_EQ(m.mla.v_head_dim, 256);
  EXPECT_EQ(m.indexer.heads, 32);
  EXPECT_EQ(m.indexer.top_k, 2048);
  EXPECT_EQ(m.ffn.kind, FfnKind::moe);
  EXPECT_EQ(m.ffn.first_dense_layers, 3);
  EXPECT_EQ(m.ffn.experts_held, 32);
  EXPECT_EQ(m.weight_dtype, "fp8_e4m3");
  EXPECT_EQ(m.kv_row_bytes(), 1152u);
  EXPECT_EQ(m.index_key_bytes(), 132u);
}

TEST(ModelSpec, RowBytesPerLayout) {
  EXPECT_EQ(load_model("deepseek-v3.2-rank").kv_row_bytes(), 656u);
  const ModelSpec q = load_model("qwen3-8b");
  EXPECT_EQ(q.kv_row_bytes(), 2u * 8 * 128 * 2);  // 4096
  EXPECT_EQ(q.index_key_bytes(), 0u);
  const ModelSpec t = load_model("tiny-dsa");
  EXPECT_EQ(t.kv_row_bytes(), (64u + 16) * 2);
  EXPECT_EQ(t.index_key_bytes(), 36u);
  ModelSpec v4 = t;
  v4.kv_layout = KvLayout::dsv4_c4_584;
  EXPECT_EQ(v4.kv_row_bytes(), 584u);
  EXPECT_EQ(name_of(KvLayout::mla_fp8_656), "mla_fp8_656");
}

TEST(ModelSpec, DefaultsAndRelativeWeightsPath) {
  const ModelSpec m =
      parse_model_yaml(std::string(kGqa) + "weights: w.safetensors\n", "/data/models/small.yaml");
  EXPECT_EQ(m.name, "small");
  EXPECT_FALSE(m.gqa.qk_norm);
  EXPECT_EQ(m.kv_layout, KvLayout::gqa_bf16);
  EXPECT_EQ(m.weight_dtype, "bf16");
  EXPECT_FLOAT_EQ(m.rope_theta, 10000.0f);
  EXPECT_EQ(m.weights, std::filesystem::path("/data/models/w.safetensors"));
}

TEST(ModelSpec, UnknownPresetNamesThePresets) {
  try {
    (void)load_model("glm-6");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("model 'glm-6': no such preset or file; use one of ", 0), 0u) << msg;
    EXPECT_NE(msg.find("tiny-gqa"), std::string::npos) << msg;
  }
}

TEST(ModelSpecErrors, UnknownKey) {
  EXPECT_EQ(error_of(std::string(kGqa) + "layer_count: 3\n"),
            "m.yaml:12:1: layer_count: unknown key 'layer_count'; valid keys here: attention, "
            "ffn, hidden, indexer, kv_layout, layers, name, norm_eps, rope_theta, vocab, "
            "weight_dtype, weight_seed, weights");
}

TEST(ModelSpecErrors, KeyOfTheOtherAttentionKind) {
  EXPECT_EQ(error_of(gqa_with("  head_dim: 16\n", "  head_dim: 16\n  kv_lora_rank: 8\n")),
            "m.yaml:9:3: attention.kv_lora_rank: key 'kv_lora_rank' belongs to attention.kind mla, "
            "not gqa; remove `kv_lora_rank`");
}

TEST(ModelSpecErrors, WrongType) {
  EXPECT_EQ(error_of(gqa_with("hidden: 64", "hidden: wide")),
            "m.yaml:2:9: hidden: expected an integer, got 'wide'; write a whole number, e.g. "
            "`hidden: 4`");
  EXPECT_EQ(error_of(gqa_with("vocab: 128", "vocab: [1, 2]")),
            "m.yaml:3:8: vocab: expected an integer, got a list; write `vocab: <an integer>`");
}

TEST(ModelSpecErrors, MissingRequiredKey) {
  EXPECT_EQ(error_of(gqa_with("  kv_heads: 2\n", "")),
            "m.yaml:5:3: attention.kv_heads: missing required key 'kv_heads'; add `kv_heads:` to "
            "`attention:`");
  EXPECT_EQ(error_of("hidden: 4\n"),
            "m.yaml:1:1: layers: missing required key 'layers'; add `layers:` to the file");
}

TEST(ModelSpecErrors, NonPositiveSize) {
  EXPECT_EQ(error_of(gqa_with("layers: 2", "layers: 0")),
            "m.yaml:1:9: layers: must be a positive integer, got 0; set `layers` to a value "
            "between 1 and 2147483647");
}

TEST(ModelSpecErrors, QHeadsNotAMultipleOfKvHeads) {
  EXPECT_EQ(error_of(gqa_with("q_heads: 4", "q_heads: 5")),
            "m.yaml:6:12: attention.q_heads: q_heads 5 is not a multiple of kv_heads 2; make "
            "q_heads a multiple of kv_heads (each KV head serves q_heads / kv_heads query heads)");
}

TEST(ModelSpecErrors, OddRopeWidth) {
  EXPECT_EQ(error_of(gqa_with("head_dim: 16", "head_dim: 15")),
            "m.yaml:8:13: attention.head_dim: must be even (RoPE rotates pairs), got 15; use an "
            "even width such as 128");
}

TEST(ModelSpecErrors, ExpertsHeldAboveExperts) {
  EXPECT_EQ(
      error_of(gqa_with("  kind: dense\n  dense_width: 96",
                        "  kind: moe\n  experts: 8\n  experts_held: 16\n  active_experts: 2\n  "
                        "expert_width: 32\n")),
      "m.yaml:12:17: ffn.experts_held: experts_held 16 exceeds experts 8; set experts_held "
      "to experts / ranks (at most experts)");
}

TEST(ModelSpecErrors, LayoutMustFitShape) {
  std::string text = kGqa;
  EXPECT_EQ(error_of(text + "kv_layout: mla_fp8_656\n"),
            "m.yaml:12:12: kv_layout: layout mla_fp8_656 does not fit attention.kind gqa; use "
            "gqa_bf16");
  EXPECT_EQ(error_of(text + "kv_layout: fp4\n"),
            "m.yaml:12:12: kv_layout: unknown value 'fp4'; use one of mla_fp8_656, mla_bf16_1152, "
            "dsv4_c4_584, gqa_bf16, mla_bf16");
}

TEST(ModelSpecErrors, IndexerNeedsMla) {
  EXPECT_EQ(error_of(std::string(kGqa) + "indexer:\n  heads: 2\n  head_dim: 8\n  top_k: 4\n"),
            "m.yaml:13:3: indexer: a DSA indexer needs attention.kind mla (its queries come from "
            "the q_lora latent); remove `indexer:` (sparse-gpu on a GQA model uses exact top-k) "
            "or use kind mla");
}

TEST(ModelSpecErrors, InvalidYamlAndNotAMapping) {
  EXPECT_EQ(error_of("layers: [2\n").rfind("m.yaml:2:1: invalid YAML: ", 0), 0u)
      << error_of("layers: [2\n");
  EXPECT_EQ(error_of("- 1\n- 2\n"),
            "m.yaml:1:1: expected a mapping of model keys, got a list; start from a preset in "
            "scenarios/models/");
}

}  // namespace
}  // namespace hisparse
