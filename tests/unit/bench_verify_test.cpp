// `run --verify`: the non-finite check (its twin kernel by hand, both sites of a real cause: a
// checkpoint tensor holding an Inf) and PipelineVerifier's comparison against a twin, on the CPU
// (the engine under test is a CPU engine too, so that a twin that disagrees can be made on
// purpose).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/pipeline_verifier.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"
#include "model/safetensors.hpp"
#include "support/error_message.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kNoSite = 0x7f7f7f7f;

TEST(MarkNonFinite, KeepsTheSmallestSiteThatHeldANanOrInf) {
  int first = kNoSite;
  const std::vector<float> finite = {1.0f, -3e38f, 0.0f}, nan = {1.0f, std::nanf(""), 2.0f},
                           pos = {kInf}, neg = {0.5f, -kInf};
  const auto mark = [&](const std::vector<float>& x, int site) {
    kernels::mark_non_finite_ref({x.data(), static_cast<std::int64_t>(x.size()), site, &first});
  };
  mark(finite, 0);
  EXPECT_EQ(first, kNoSite);
  mark(nan, 5);
  EXPECT_EQ(first, 5);
  mark(pos, 7);  // later and larger: kept 5
  EXPECT_EQ(first, 5);
  mark(finite, 3);
  EXPECT_EQ(first, 5);
  mark(neg, 2);
  EXPECT_EQ(first, 2);
}

// tiny-gqa whose checkpoint sets `tensor` (256 floats of 1) with one Inf.
ModelSpec tiny_gqa_with_inf(const fs::path& dir, const std::string& tensor) {
  std::vector<float> w(256, 1.0f);
  w[17] = kInf;
  fs::create_directories(dir);
  const fs::path file = dir / "inf.safetensors";
  write_safetensors(file, {{tensor, DType::f32, {256}, encode_floats(w, DType::f32)}});
  ModelSpec m = load_model("tiny-gqa");
  m.weights = file;
  return m;
}

EngineConfig small(Mode mode) {
  EngineConfig c;
  c.mode = mode;
  c.concurrency = 2;
  c.context_length = 64;
  c.top_k = 16;
  c.max_decode_steps = 4;
  return c;
}

TEST(NonFiniteCheck, NamesTheLayerAndPhaseWhereItFirstAppeared) {
  test::TempDir dir;
  EngineConfig c = small(Mode::dense);
  c.check_finite = true;
  // An Inf in layer 1's FFN norm: the residual stream is finite after layer 1's attention and
  // not after its FFN.
  DecodeEngine ffn(tiny_gqa_with_inf(dir.path, "model.layers.1.post_attention_layernorm.weight"),
                   c);
  EXPECT_EQ(test::error_message([&] { (void)ffn.step(); }),
            "tiny-gqa dense decode step 0 (cpu backend): a NaN or Inf first appeared in layer "
            "1's ffn (the residual stream after it); rerun the point with --backend cpu: if the "
            "CPU engine stays finite, that phase's CUDA kernels are at fault (run the GPU tests "
            "under compute-sanitizer: .ci/device-check sanitize); if it does not, the weights or "
            "the workload overflow there");
  DecodeEngine head(tiny_gqa_with_inf(dir.path, "model.norm.weight"), c);
  EXPECT_NE(test::error_message([&] {
              (void)head.step();
            }).find("first appeared in the logits (lm_head)"),
            std::string::npos);
  // The same model decodes without a word when the check is off.
  c.check_finite = false;
  DecodeEngine unchecked(
      tiny_gqa_with_inf(dir.path, "model.layers.1.post_attention_layernorm.weight"), c);
  EXPECT_NO_THROW((void)unchecked.step());
}

TEST(PipelineVerifier, ATwinOfTheSameConfigurationAgreesExactly) {
  const ModelSpec model = load_model("tiny-gqa");
  EngineConfig c = small(Mode::hisparse);
  c.backend = Backend::cuda;  // the label the verifier reads; its twin runs on the CPU
  PipelineVerifier verifier(model, c, 2);
  EngineConfig under_test = PipelineVerifier::checked(c);
  EXPECT_TRUE(under_test.check_finite);
  under_test.backend = Backend::cpu;
  DecodeEngine engine(model, under_test);
  for (int s = 0; s < 4; ++s) verifier.after_step(s, engine, engine.step());
  const VerifyReport& r = verifier.report();
  EXPECT_EQ(r.twin, "cpu engine");
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.layer_steps, 2);  // steps 0 and 2
  EXPECT_EQ(r.max_query_error, 0.0);
  EXPECT_EQ(r.max_attention_error, 0.0);
  EXPECT_EQ(r.query_tolerance, 1e-4);
  EXPECT_EQ(r.diverged_at_step, -1);
  const nlohmann::json j = r;
  EXPECT_EQ(j["layer_steps"], 2);
  EXPECT_TRUE(j["diverged_at_step"].is_null());
}

TEST(PipelineVerifier, ADifferentDecodeFailsNamingTheStepAndWhatDiffers) {
  const ModelSpec model = load_model("tiny-gqa");
  EngineConfig c = small(Mode::sparse_gpu);
  c.backend = Backend::cuda;
  PipelineVerifier verifier(model, c, 1);
  EngineConfig other = c;
  other.backend = Backend::cpu;
  other.workload.seed = 99;  // other keys, queries and first tokens
  DecodeEngine engine(model, other);
  const std::string e = test::error_message([&] { verifier.after_step(0, engine, engine.step()); });
  EXPECT_EQ(e.rfind("--verify: tiny-gqa sparse-gpu at context 64, step 0: ", 0), 0u) << e;
  EXPECT_TRUE(e.find("the next tokens differ") != std::string::npos ||
              e.find("layer 0's attention queries differ from the twin's (cpu engine)") !=
                  std::string::npos)
      << e;
  EXPECT_NE(e.find("ctest --preset gpu"), std::string::npos) << e;
}

TEST(PipelineVerifier, Bf16GemmsStopComparingWhereTheDecodesPart) {
  const ModelSpec model = load_model("tiny-gqa");
  EngineConfig c = small(Mode::dense);
  c.backend = Backend::cuda;
  c.bf16_gemm = true;
  PipelineVerifier verifier(model, c, 1);
  EXPECT_EQ(verifier.report().query_tolerance, 3e-2);
  EngineConfig other = c;
  other.backend = Backend::cpu;
  other.workload.seed = 99;
  DecodeEngine engine(model, other);
  for (int s = 0; s < 3; ++s) verifier.after_step(s, engine, engine.step());
  // Seed 99 starts from other first tokens: whichever of tokens or tensors parts them first, the
  // tokens differ by step 2 at the latest, and the comparison stops there without failing.
  EXPECT_GE(verifier.report().diverged_at_step, 0);
  EXPECT_LE(verifier.report().steps, 3);
}

// A model whose CPU step takes minutes: hisparse is compared with a CUDA sparse-gpu twin (which,
// on a machine without a GPU, cannot start: the message says which twin), dense with none.
TEST(PipelineVerifier, LargeModelsGetTheModeWithoutOffloadOnTheGpuOrNoTwin) {
  const ModelSpec glm = load_model("glm-5.1-fp8-rank");
  EngineConfig c;
  c.backend = Backend::cuda;
  c.mode = Mode::dense;
  c.context_length = 1024;
  const PipelineVerifier none(glm, c, 1);
  EXPECT_EQ(none.report().twin,
            "none: a CPU step of glm-5.1-fp8-rank takes minutes, and dense has no mode without "
            "offload to compare with (non-finite check only)");
  if (cuda_available()) GTEST_SKIP() << "the GPU twin starts on this machine (GPU tests)";
  c.mode = Mode::hisparse;
  EXPECT_EQ(test::error_message([&] { PipelineVerifier v(glm, c, 1); })
                .rfind("--verify: the twin of the point (cuda engine, mode sparse-gpu) did not "
                       "start: ",
                       0),
            0u);
}

TEST(BenchRunnerVerify, RecordsTheCheckAndFailsAPointThatTurnsNonFinite) {
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  PointPlan plan{1, 2};
  plan.verify_every = 1;
  const PointMetrics m = runner.run(load_model("tiny-gqa"), small(Mode::sparse_gpu), plan);
  ASSERT_TRUE(m.verify.has_value());
  EXPECT_EQ(m.verify->twin, "none: the CPU engine is the reference (non-finite check only)");
  EXPECT_NE(m.timing.find("--verify"), std::string::npos);
  const nlohmann::json j = m;
  EXPECT_EQ(j["verify"]["finite_checked"], true);
  test::TempDir dir;
  const ModelSpec bad = tiny_gqa_with_inf(dir.path, "model.layers.0.input_layernorm.weight");
  EXPECT_NE(test::error_message([&] {
              (void)runner.run(bad, small(Mode::sparse_gpu), plan);
            }).find("a NaN or Inf first appeared in layer 0's attention"),
            std::string::npos);
  // Without --verify the same point completes.
  EXPECT_NO_THROW((void)runner.run(bad, small(Mode::sparse_gpu), PointPlan{1, 2}));
}

}  // namespace
}  // namespace hisparse
