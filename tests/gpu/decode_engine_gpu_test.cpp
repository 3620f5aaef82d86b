// The CUDA decode engine against the CPU engine on the tiny models, in every mode each model
// runs, over several steps: the same next tokens every step, attention queries and outputs of
// every layer within float tolerance, the same selections (so the same hot-buffer hits and
// misses) and the same recall, and the same bytes accounted.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/pipeline_verifier.hpp"
#include "core/error.hpp"
#include "core/metrics.hpp"
#include "model/decode_engine.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"
#include "model/safetensors.hpp"
#include "support/error_message.hpp"
#include "support/gpu.hpp"
#include "support/temp_dir.hpp"
#include "trace/trace_session.hpp"

namespace hisparse {
namespace {

struct EngineCase {
  std::string model;
  Mode mode;
  int concurrency;
  std::int64_t context;
  int top_k;
  int hot_buffer = 0;  ///< 0: 2 x top_k
};

std::string describe(const EngineCase& c) {
  return c.model + " " + std::string(name_of(c.mode)) + " x" + std::to_string(c.concurrency) +
         " ctx " + std::to_string(c.context) + " top_k " + std::to_string(c.top_k);
}

void expect_engines_agree(const EngineCase& c, int steps) {
  SCOPED_TRACE(describe(c));
  EngineConfig config;
  config.mode = c.mode;
  config.concurrency = c.concurrency;
  config.context_length = c.context;
  config.top_k = c.top_k;
  config.hot_buffer = c.hot_buffer;
  config.max_decode_steps = steps;
  const ModelSpec model = load_model(c.model);
  EngineConfig on_gpu = config;
  on_gpu.backend = Backend::cuda;
  DecodeEngine cpu(model, config), gpu(model, on_gpu);
  ASSERT_EQ(gpu.selection_width(), cpu.selection_width());
  ASSERT_EQ(gpu.hot_slots(), cpu.hot_slots());
  ASSERT_EQ(gpu.kv_streams(), cpu.kv_streams());
  EXPECT_EQ(gpu.gpu_bytes_per_request(), cpu.gpu_bytes_per_request());
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepStats want = cpu.step(), got = gpu.step();
    ASSERT_EQ(got.next_tokens, want.next_tokens);
    EXPECT_EQ(got.hits, want.hits);
    EXPECT_EQ(got.misses, want.misses);
    EXPECT_EQ(got.bytes_h2d, want.bytes_h2d);
    EXPECT_EQ(got.bytes_scanned, want.bytes_scanned);
    EXPECT_EQ(got.plans, want.plans);
    EXPECT_NEAR(got.recall, want.recall, 1e-9);
    if (want.attention_rel_error >= 0) {
      EXPECT_NEAR(got.attention_rel_error, want.attention_rel_error,
                  1e-3 + 0.01 * want.attention_rel_error);
    }
    for (const auto& [phase, ms] : want.phase_ms) EXPECT_TRUE(got.phase_ms.count(phase)) << phase;
    EXPECT_GT(got.step_ms, 0.0);
    for (int l = 0; l < model.layers; ++l) {
      EXPECT_LT(relative_l2(gpu.last_queries(l), cpu.last_queries(l)), 1e-4) << "layer " << l;
      EXPECT_LT(relative_l2(gpu.last_attention(l), cpu.last_attention(l)), 1e-3) << "layer " << l;
    }
  }
  EXPECT_EQ(gpu.sequence_length(), cpu.sequence_length());
  const auto want_traces = cpu.selection_traces(), got_traces = gpu.selection_traces();
  ASSERT_EQ(got_traces.size(), want_traces.size());
  for (std::size_t i = 0; i < want_traces.size(); ++i) {
    ASSERT_EQ(got_traces[i].steps.size(), want_traces[i].steps.size());
    for (std::size_t s = 0; s < want_traces[i].steps.size(); ++s)
      EXPECT_EQ(got_traces[i].steps[s].selected, want_traces[i].steps[s].selected)
          << "trace " << i << " step " << s;
  }
}

// Three requests of 600 tokens, top-k 64, bf16 GEMMs: the small bf16 engine the tests below run.
EngineConfig bf16_config(Mode mode, int steps) {
  EngineConfig config;
  config.mode = mode;
  config.concurrency = 3;
  config.context_length = 600;
  config.top_k = 64;
  config.max_decode_steps = steps;
  config.bf16_gemm = true;
  return config;
}

class DecodeEngineGpu : public ::testing::Test {
 protected:
  void SetUp() override { HISPARSE_REQUIRE_GPU(); }
};

TEST_F(DecodeEngineGpu, TinyDsaMatchesTheCpuEngineInEveryMode) {
  for (Mode mode : {Mode::dense, Mode::sparse_gpu, Mode::hisparse})
    for (int concurrency : {1, 3})
      expect_engines_agree({"tiny-dsa", mode, concurrency, 600, 64}, 4);
}

TEST_F(DecodeEngineGpu, TinyGqaMatchesTheCpuEngineInEveryMode) {
  for (Mode mode :
       {Mode::dense, Mode::sparse_gpu, Mode::hisparse, Mode::fathom, Mode::hisparse_fathom})
    for (int concurrency : {1, 3}) {
      // hisparse+fathom: the hot buffer holds one Fathom selection, 4 + 32 + 4 x (64 - 36) rows
      const int hot = mode == Mode::hisparse_fathom ? 160 : 0;
      expect_engines_agree({"tiny-gqa", mode, concurrency, 600, 64, hot}, 4);
    }
}

TEST_F(DecodeEngineGpu, ContextShorterThanTopKSelectsEveryToken) {
  expect_engines_agree({"tiny-dsa", Mode::hisparse, 2, 40, 64}, 3);
  expect_engines_agree({"tiny-gqa", Mode::sparse_gpu, 2, 40, 64}, 3);
}

// bf16 GEMMs: both engines round activations to bf16, so a float-rounding difference upstream
// can move a value by a bf16 step (2^-8 relative) and change later tokens. Checked: the first
// step's queries and attention outputs of every layer within 2% (relative L2) of the CPU engine's,
// and every mode running several steps.
TEST_F(DecodeEngineGpu, Bf16GemmsFollowTheCpuEngineWithinBf16Rounding) {
  for (const char* name : {"tiny-dsa", "tiny-gqa"})
    for (Mode mode : {Mode::dense, Mode::sparse_gpu, Mode::hisparse}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(name_of(mode)));
      const EngineConfig config = bf16_config(mode, 3);
      const ModelSpec model = load_model(name);
      EngineConfig on_gpu = config;
      on_gpu.backend = Backend::cuda;
      DecodeEngine cpu(model, config), gpu(model, on_gpu);
      (void)cpu.step();
      const StepStats first = gpu.step();
      EXPECT_EQ(first.next_tokens.size(), 3u);
      for (int l = 0; l < model.layers; ++l) {
        EXPECT_LT(relative_l2(gpu.last_queries(l), cpu.last_queries(l)), 2e-2) << "layer " << l;
        EXPECT_LT(relative_l2(gpu.last_attention(l), cpu.last_attention(l)), 2e-2) << "layer " << l;
      }
      for (int s = 1; s < 3; ++s) EXPECT_GT(gpu.step().step_ms, 0.0);
    }
}

// The selection stream changes when work runs, not what it computes: with and without
// overlap_selection the engine gives the same tokens, hits, selections and bit-identical
// attention outputs (bf16 GEMMs, so the selection stream's own GEMM scratch is used too).
TEST_F(DecodeEngineGpu, OverlappedSelectionGivesTheResultsOfOneStream) {
  for (Mode mode : {Mode::dense, Mode::sparse_gpu, Mode::hisparse}) {
    SCOPED_TRACE(std::string(name_of(mode)));
    EngineConfig config = bf16_config(mode, 4);
    config.backend = Backend::cuda;
    const ModelSpec model = load_model("tiny-dsa");
    EngineConfig one_stream = config;
    one_stream.overlap_selection = false;
    DecodeEngine overlapped(model, config), serial(model, one_stream);
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const StepStats a = overlapped.step(), b = serial.step();
      ASSERT_EQ(a.next_tokens, b.next_tokens);
      EXPECT_EQ(a.hits, b.hits);
      EXPECT_EQ(a.misses, b.misses);
      for (int l = 0; l < model.layers; ++l)
        EXPECT_EQ(overlapped.last_attention(l), serial.last_attention(l)) << "layer " << l;
    }
  }
}

// A replayed CUDA graph of the step reads every position and length from device memory when it
// runs: it must give what the same steps enqueued kernel by kernel give, bit for bit, at every
// step (tokens, hits, misses, bytes, every layer's queries and attention), in hot buffers still
// filling (the newest slot follows the position) and full ones. A step during a CUPTI timeline
// runs eagerly; the next replays again.
TEST_F(DecodeEngineGpu, GraphReplayGivesTheResultsOfEagerSteps) {
  struct GraphCase {
    const char* model;
    Mode mode;
    std::int64_t context;
    int hot_buffer;
    bool bf16;
  };
  const std::vector<GraphCase> cases = {
      {"tiny-dsa", Mode::dense, 600, 0, false},    {"tiny-dsa", Mode::sparse_gpu, 600, 0, true},
      {"tiny-dsa", Mode::hisparse, 600, 0, true},  {"tiny-dsa", Mode::hisparse, 200, 256, false},
      {"tiny-gqa", Mode::dense, 600, 0, false},    {"tiny-gqa", Mode::sparse_gpu, 600, 0, false},
      {"tiny-gqa", Mode::hisparse, 600, 0, false}, {"tiny-gqa", Mode::hisparse, 100, 128, true}};
  constexpr int kSteps = 6;
  for (const GraphCase& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + std::string(name_of(c.mode)) + " ctx " +
                 std::to_string(c.context));
    EngineConfig config = bf16_config(c.mode, kSteps);
    config.backend = Backend::cuda;
    config.context_length = c.context;
    config.hot_buffer = c.hot_buffer;
    config.bf16_gemm = c.bf16;
    config.quality_metrics = false;  // a quality sample synchronises: such steps run eagerly
    EngineConfig eager_config = config;
    eager_config.cuda_graph = false;
    const ModelSpec model = load_model(c.model);
    DecodeEngine graphed(model, config), eager(model, eager_config);
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::optional<trace::TraceSession> timeline;
      if (step == 3) timeline.emplace(trace::TraceOptions{.label = "graph test"});
      const bool traced = timeline && timeline->active();
      const StepStats a = graphed.step(), b = eager.step();
      if (timeline) (void)timeline->stop();
      EXPECT_EQ(a.graph_replay, step > 0 && !traced);
      EXPECT_FALSE(b.graph_replay);
      ASSERT_EQ(a.next_tokens, b.next_tokens);
      EXPECT_EQ(a.hits, b.hits);
      EXPECT_EQ(a.misses, b.misses);
      EXPECT_EQ(a.bytes_h2d, b.bytes_h2d);
      EXPECT_EQ(a.bytes_scanned, b.bytes_scanned);
      EXPECT_GT(a.phase_ms.at("attention"), 0.0);  // the graph's event nodes time its phases
      EXPECT_GT(a.phase_ms.at("ffn"), 0.0);
      for (int l = 0; l < model.layers; ++l) {
        EXPECT_EQ(graphed.last_queries(l), eager.last_queries(l)) << "layer " << l;
        EXPECT_EQ(graphed.last_attention(l), eager.last_attention(l)) << "layer " << l;
      }
    }
  }
}

// run --verify on the GPU: the CUDA engine against its CPU twin through PipelineVerifier (every
// step's tensors), in the modes that select and move rows.
TEST_F(DecodeEngineGpu, PipelineVerifierPassesTheCudaEngine) {
  for (const char* name : {"tiny-dsa", "tiny-gqa"})
    for (Mode mode : {Mode::sparse_gpu, Mode::hisparse}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(name_of(mode)));
      const ModelSpec model = load_model(name);
      EngineConfig c;
      c.backend = Backend::cuda;
      c.mode = mode;
      c.concurrency = 2;
      c.context_length = 600;
      c.top_k = 64;
      c.max_decode_steps = 4;
      PipelineVerifier verifier(model, c, 1);
      DecodeEngine engine(model, PipelineVerifier::checked(c));
      for (int s = 0; s < 4; ++s) verifier.after_step(s, engine, engine.step());
      EXPECT_EQ(verifier.report().layer_steps, 4);
      EXPECT_LT(verifier.report().max_query_error, 1e-4);
      EXPECT_GT(verifier.report().max_query_error, 0.0);  // two engines, not one compared twice
    }
}

// run --verify on a large preset: hisparse against a sparse-gpu CUDA twin (the same selections
// read from the hot buffer instead of GPU-resident rows), GLM-5.1 with shared layer weights.
TEST_F(DecodeEngineGpu, PipelineVerifierComparesHisparseWithSparseGpuOnALargeModel) {
  const ModelSpec model = load_model("glm-5.1-fp8-rank");
  EngineConfig c;
  c.backend = Backend::cuda;
  c.mode = Mode::hisparse;
  c.concurrency = 2;
  c.context_length = 2048;
  c.top_k = 256;
  c.hot_buffer = 512;
  c.max_decode_steps = 3;
  c.share_layer_weights = true;
  c.quality_metrics = false;
  PipelineVerifier verifier(model, c, 1);
  EXPECT_EQ(verifier.report().twin, "cuda engine, mode sparse-gpu");
  DecodeEngine engine(model, PipelineVerifier::checked(c));
  for (int s = 0; s < 3; ++s) {
    const StepStats st = engine.step();
    EXPECT_GT(st.misses, 0) << "hot 512 of 2048 tokens must miss";
    verifier.after_step(s, engine, st);
  }
  EXPECT_EQ(verifier.report().layer_steps, 3);
  EXPECT_LE(verifier.report().max_attention_error, 1e-6);
}

// The non-finite check on the GPU names the same site as the CPU engine's, for a checkpoint whose
// layer-1 FFN norm holds an Inf.
TEST_F(DecodeEngineGpu, NonFiniteCheckNamesTheSiteTheCpuEngineNames) {
  test::TempDir dir;
  std::vector<float> w(256, 1.0f);
  w[17] = std::numeric_limits<float>::infinity();
  const auto file = dir.path / "inf.safetensors";
  std::filesystem::create_directories(dir.path);
  write_safetensors(file, {{"model.layers.1.post_attention_layernorm.weight",
                            DType::f32,
                            {256},
                            encode_floats(w, DType::f32)}});
  ModelSpec model = load_model("tiny-gqa");
  model.weights = file;
  EngineConfig c;
  c.mode = Mode::hisparse;
  c.context_length = 64;
  c.top_k = 16;
  c.max_decode_steps = 2;
  c.check_finite = true;
  EngineConfig on_gpu = c;
  on_gpu.backend = Backend::cuda;
  DecodeEngine cpu(model, c), gpu(model, on_gpu);
  const std::string want = test::error_message([&] { (void)cpu.step(); });
  const std::string got = test::error_message([&] { (void)gpu.step(); });
  EXPECT_NE(want.find("layer 1's ffn"), std::string::npos) << want;
  EXPECT_EQ(got.substr(0, got.find('(')), want.substr(0, want.find('(')));
  EXPECT_NE(got.find("(cuda backend): a NaN or Inf first appeared in layer 1's ffn"),
            std::string::npos)
      << got;
}

TEST_F(DecodeEngineGpu, StepsBeyondTheReservedRoomFailClearly) {
  EngineConfig c;
  c.backend = Backend::cuda;
  c.mode = Mode::dense;
  c.context_length = 32;
  c.max_decode_steps = 1;
  DecodeEngine engine(load_model("tiny-gqa"), c);
  (void)engine.step();
  try {
    (void)engine.step();
    FAIL() << "a second step has no room";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise EngineConfig::max_decode_steps"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hisparse
