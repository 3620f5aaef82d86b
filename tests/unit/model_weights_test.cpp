#include "model/weights.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "model/safetensors.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "hisparse_model_weights_test";
  fs::create_directories(dir);
  return dir / name;
}

// tiny-gqa with `weights:` pointing at `file`.
ModelSpec tiny_with(const fs::path& file) {
  ModelSpec m = load_model("tiny-gqa");
  m.weights = file;
  return m;
}

std::string error_of(const ModelSpec& m) {
  try {
    ModelWeights w(m);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void write_raw(const fs::path& file, const std::string& header, std::size_t data_bytes) {
  std::ofstream out(file, std::ios::binary);
  const std::uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

TEST(ModelWeights, SyntheticAreSeededBf16AndScaled) {
  const ModelSpec m = load_model("tiny-gqa");
  const ModelWeights a(m), b(m);
  const float* q = a.get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q[17], b.get("model.layers.0.self_attn.q_proj.weight")[17]);
  double sum_sq = 0;
  for (int i = 0; i < 256 * 256; ++i) {
    EXPECT_EQ(bf16_to_float(float_to_bf16(q[i])), q[i]);
    sum_sq += static_cast<double>(q[i]) * q[i];
  }
  EXPECT_NEAR(sum_sq / (256 * 256), 1.0 / 256, 0.1 / 256);  // normal / sqrt(fan_in)
  EXPECT_EQ(a.get("model.norm.weight")[3], 1.0f);
  ModelSpec other = m;
  other.weight_seed = 12;
  EXPECT_NE(ModelWeights(other).get("model.layers.0.self_attn.q_proj.weight")[17], q[17]);
}

TEST(ModelWeights, SafetensorsReplaceNamedTensorsOnly) {
  const fs::path file = temp_file("good.safetensors");
  std::vector<float> norm(256);
  for (int i = 0; i < 256; ++i) norm[static_cast<std::size_t>(i)] = 0.5f + static_cast<float>(i);
  write_safetensors(file,
                    {{"model.norm.weight", DType::bf16, {256}, encode_floats(norm, DType::bf16)},
                     {"rotary.inv_freq", DType::f32, {2}, encode_floats({1, 2}, DType::f32)}});
  const ModelWeights w(tiny_with(file));
  EXPECT_EQ(w.get("model.norm.weight")[7], 7.5f);
  EXPECT_EQ(w.loaded(), std::vector<std::string>{"model.norm.weight"});
  EXPECT_EQ(w.ignored(), std::vector<std::string>{"rotary.inv_freq"});
  const ModelWeights synthetic(load_model("tiny-gqa"));
  EXPECT_EQ(w.get("lm_head.weight")[5], synthetic.get("lm_head.weight")[5]);  // absent: synthetic
}

TEST(ModelWeights, WrongShapeNamesFileTensorAndFix) {
  const fs::path file = temp_file("shape.safetensors");
  write_safetensors(file, {{"model.norm.weight",
                            DType::f32,
                            {128},
                            encode_floats(std::vector<float>(128), DType::f32)}});
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor model.norm.weight: shape [128] does not match the model's [256]; "
                "use weights made for tiny-gqa (" +
                load_model("tiny-gqa").source.string() + ") or fix the model YAML shapes");
}

TEST(ModelWeights, BrokenHeadersGiveOneClearError) {
  const fs::path file = temp_file("broken.safetensors");
  write_raw(file,
            R"({"model.norm.weight": {"dtype": "BF16", "shape": [256], "data_offsets": [0, 100]}})",
            512);
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor model.norm.weight: data_offsets [0, 100] hold 100 bytes but shape "
                "[256] of bf16 needs 512; the header does not match the data; rewrite the file");
  write_raw(
      file,
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
      24);
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor b: data_offsets [8, 24] overlap tensor a at [0, 16]; the header "
                "is corrupt; rewrite the file");
  write_raw(file, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor a: data_offsets [0, 16] fall outside the data section of 8 "
                "bytes; the file is truncated or its header is wrong");
  write_raw(file, R"({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})", 16);
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor a: unknown dtype 'Q4'; use one of f32, bf16, f16, fp8_e4m3, "
                "i32, i64, u8");
  // A shape whose byte count wraps past 2^64 (to 0 here) must not pass as an empty tensor.
  write_raw(file,
            R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})",
            0);
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": tensor a: shape [4611686018427387904,4] is too large for any file; the "
                "header is corrupt; rewrite the file");
  write_raw(file, "{not json", 0);
  EXPECT_EQ(error_of(tiny_with(file)).rfind(file.string() + ": header is not valid JSON", 0), 0u);
  {
    std::ofstream out(file, std::ios::binary);
    out << "abc";
  }
  EXPECT_EQ(error_of(tiny_with(file)),
            file.string() +
                ": file of 3 bytes is too short for a safetensors header; the file is "
                "truncated or not a safetensors file");
  EXPECT_EQ(error_of(tiny_with(temp_file("missing.safetensors"))),
            temp_file("missing.safetensors").string() +
                ": cannot open the safetensors file; check the `weights:` path");
}

TEST(ModelWeights, ExpectedTensorsCoverMlaIndexerAndMoe) {
  const auto t = expected_tensors(load_model("tiny-dsa"));
  auto has = [&](const std::string& n) {
    return std::any_of(t.begin(), t.end(), [&](const TensorSpec& s) { return s.name == n; });
  };
  EXPECT_TRUE(has("model.layers.0.mlp.gate_proj.weight"));            // first dense layer
  EXPECT_TRUE(has("model.layers.1.mlp.experts.3.down_proj.weight"));  // 4 experts held
  EXPECT_FALSE(has("model.layers.1.mlp.experts.4.down_proj.weight"));
  EXPECT_TRUE(has("model.layers.2.self_attn.indexer.wq_b.weight"));
  EXPECT_TRUE(has("model.layers.2.mlp.shared_experts.up_proj.weight"));
}

TEST(ModelWeights, SharedLayersHoldOneDenseAndOneMoeLayer) {
  const ModelSpec m = load_model("tiny-dsa");  // 3 layers, the first dense, two MoE
  EXPECT_EQ(weight_source_layer(m, 0, true), 0);
  EXPECT_EQ(weight_source_layer(m, 1, true), 1);
  EXPECT_EQ(weight_source_layer(m, 2, true), 1);
  EXPECT_EQ(weight_source_layer(m, 2, true, true), 0);  // the indexer's: layer 0 always has one
  EXPECT_EQ(weight_source_layer(m, 2, false), 2);
  EXPECT_EQ(layer_tensor_name(m, 2, "mlp.gate.weight", true), "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(layer_tensor_name(m, 2, "self_attn.indexer.wk.weight", true),
            "model.layers.0.self_attn.indexer.wk.weight");
  EXPECT_EQ(layer_tensor_name(m, 2, "mlp.gate.weight", false), "model.layers.2.mlp.gate.weight");
  for (const auto& t : expected_tensors(m, true))
    EXPECT_EQ(t.name.find("model.layers.2."), std::string::npos) << t.name;
  const ModelWeights shared(m, true), full(m);
  EXPECT_LT(shared.float_count(), full.float_count());
  const std::string gate = "model.layers.1.mlp.experts.3.up_proj.weight";
  EXPECT_EQ(shared.get(gate)[1234], full.get(gate)[1234]);  // values depend on the name only
  EXPECT_THROW((void)shared.get("model.layers.2.mlp.gate.weight"), Error);
}

TEST(ModelWeights, SharedLayersRefuseACheckpoint) {
  ModelSpec m = tiny_with(temp_file("any.safetensors"));
  try {
    ModelWeights w(m, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "model tiny-gqa: share_layer_weights cannot be used with the weights of " +
                  m.weights.string() +
                  "; set deployment.share_layer_weights: false, or drop `weights:` from the "
                  "model YAML to run shared synthetic weights");
  }
}

}  // namespace
}  // namespace hisparse
