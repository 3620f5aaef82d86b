// DecodeEngine hisparse mode on the CPU backend: the HotCache swap-in places exactly the rows the
// sparse-gpu baseline reads, so tokens and attention outputs are bit-identical; hit/miss counts,
// bytes and the recorded selection traces agree with the replacement-policy simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "hotcache/policies.hpp"
#include "model/decode_engine.hpp"
#include "support/engine_outputs.hpp"

namespace hisparse {
namespace {

struct Trace {
  std::vector<std::vector<std::int32_t>> tokens;  ///< per step
  std::vector<std::vector<float>> attention;      ///< per step, every layer concatenated
  std::vector<double> recall, error;
  std::int64_t hits = 0, misses = 0, bytes_h2d = 0, bytes_scanned = 0;
  std::int64_t valid_entries = 0;  ///< selected positions the swap-in saw (valid, all layers)
};

EngineConfig config(Mode mode, int top_k, int hot, int concurrency, std::int64_t context) {
  EngineConfig c;
  c.mode = mode;
  c.top_k = top_k;
  c.hot_buffer = hot;
  c.concurrency = concurrency;
  c.context_length = context;
  c.max_decode_steps = 8;
  return c;
}

Trace run(DecodeEngine& engine, int steps) {
  Trace t;
  for (int s = 0; s < steps; ++s) {
    const std::int64_t len = engine.sequence_length() + 1;
    const StepStats st = engine.step();
    t.tokens.push_back(st.next_tokens);
    t.attention.push_back(test::all_layers_attention(engine));
    t.recall.push_back(st.recall);
    t.error.push_back(st.attention_rel_error);
    t.hits += st.hits;
    t.misses += st.misses;
    t.bytes_h2d += st.bytes_h2d;
    t.bytes_scanned += st.bytes_scanned;
    t.valid_entries += static_cast<std::int64_t>(engine.kv_streams()) * engine.model().layers *
                       std::min<std::int64_t>(engine.config().top_k, len);
  }
  return t;
}

Trace run(const std::string& model, Mode mode, int top_k, int hot, int steps, int concurrency,
          std::int64_t context) {
  DecodeEngine engine(load_model(model), config(mode, top_k, hot, concurrency, context));
  return run(engine, steps);
}

void expect_same_computation(const Trace& a, const Trace& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.attention.size(), b.attention.size());
  for (std::size_t s = 0; s < a.attention.size(); ++s)
    EXPECT_TRUE(a.attention[s] == b.attention[s]) << "attention differs at step " << s;
  EXPECT_EQ(a.recall, b.recall);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.bytes_scanned, b.bytes_scanned);
}

class EngineHisparse : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineHisparse, BitIdenticalToSparseGpuForEveryHotBufferSize) {
  const std::string model = GetParam();
  const ModelSpec spec = load_model(model);
  // Per miss, the deployment moves one stream's KV row: the MLA row, or K + V of one KV head.
  const std::int64_t row = spec.is_mla()
                               ? static_cast<std::int64_t>(spec.kv_row_bytes())
                               : static_cast<std::int64_t>(spec.kv_row_bytes()) / spec.gqa.kv_heads;
  const int top_k = 24, steps = 5, batch = 2;
  const std::int64_t context = 150;
  const Trace base = run(model, Mode::sparse_gpu, top_k, 0, steps, batch, context);
  EXPECT_EQ(base.hits + base.misses, 0);
  EXPECT_EQ(base.bytes_h2d, 0);
  for (int hot : {top_k, 2 * top_k, 64, static_cast<int>(context) + steps}) {
    SCOPED_TRACE("hot " + std::to_string(hot));
    const Trace h = run(model, Mode::hisparse, top_k, hot, steps, batch, context);
    expect_same_computation(h, base);
    EXPECT_EQ(h.hits + h.misses, h.valid_entries);
    EXPECT_EQ(h.bytes_h2d, h.misses * row);
    if (hot >= context + steps) {
      EXPECT_EQ(h.misses, 0);  // the whole sequence stays resident
    } else {
      EXPECT_GT(h.misses, 0);
    }
  }
}

TEST_P(EngineHisparse, LruSimulationOfTheTracesReproducesTheSwapIn) {
  const std::string model = GetParam();
  DecodeEngine engine(load_model(model), config(Mode::hisparse, 16, 40, 2, 120));
  const Trace t = run(engine, 6);
  const auto traces = engine.selection_traces();
  ASSERT_EQ(traces.size(), static_cast<std::size_t>(engine.kv_streams()) * engine.model().layers);
  std::int64_t hits = 0, misses = 0, belady = 0;
  for (const auto& trace : traces) {
    ASSERT_EQ(trace.steps.size(), 6u);
    EXPECT_EQ(trace.steps.front().seq_len, 121);
    EXPECT_EQ(trace.steps.back().seq_len, 126);
    EXPECT_EQ(trace.steps.front().selected.size(), 16u);
    const PolicyStats lru = simulate_policy(ReplacementPolicy::lru, trace, engine.hot_slots());
    hits += lru.hits;
    misses += lru.misses;
    belady += simulate_policy(ReplacementPolicy::belady, trace, engine.hot_slots()).misses;
  }
  EXPECT_GT(t.misses, 0);
  EXPECT_EQ(hits, t.hits);
  EXPECT_EQ(misses, t.misses);
  EXPECT_LE(belady, misses);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineHisparse, ::testing::Values("tiny-dsa", "tiny-gqa"));

TEST(EngineHisparseConfig, DefaultsAndLimits) {
  DecodeEngine engine(load_model("tiny-dsa"), config(Mode::hisparse, 0, 0, 1, 100));
  EXPECT_EQ(engine.hot_slots(), 128);  // 2 x the indexer's top_k 64
  EXPECT_EQ(engine.selection_width(), 64);
  EXPECT_EQ(engine.kv_streams(), 1);
  DecodeEngine dense(load_model("tiny-gqa"), config(Mode::dense, 0, 0, 3, 100));
  EXPECT_EQ(dense.hot_slots(), 0);
  EXPECT_EQ(dense.selection_width(), 0);
  EXPECT_EQ(dense.kv_streams(), 6);
  (void)dense.step();
  EXPECT_TRUE(dense.selection_traces().empty());
}

TEST(EngineHisparseConfig, RunningPastThePoolIsAClearError) {
  EngineConfig c = config(Mode::hisparse, 16, 32, 1, 64);
  c.max_decode_steps = 2;
  DecodeEngine engine(load_model("tiny-dsa"), c);
  (void)engine.step();
  (void)engine.step();
  try {
    (void)engine.step();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "mode hisparse: step 2 needs room for token 66, the host pool holds 66 tokens per "
                 "request (context 64 + max_decode_steps); raise EngineConfig::max_decode_steps to "
                 "the number of steps the run takes");
  }
}

}  // namespace
}  // namespace hisparse
