// DecodeEngine fathom and hisparse+fathom modes on the CPU backend (GQA models): plane-scan
// selection, byte accounting, and the hot buffer in front of Fathom changing only the bytes moved.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/decode_engine.hpp"
#include "support/engine_outputs.hpp"

namespace hisparse {
namespace {

struct Totals {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<float>> attention;
  std::vector<std::int64_t> scanned;  ///< per step
  std::vector<std::int64_t> lengths;  ///< sequence length each step attended over
  std::int64_t hits = 0, misses = 0, bytes_h2d = 0;
  std::vector<double> recall, error;
};

EngineConfig config(Mode mode, int budget, int hot, int top_k = 64) {
  EngineConfig c;
  c.mode = mode;
  c.concurrency = 2;
  c.context_length = 200;
  c.top_k = top_k;
  c.hot_buffer = hot;
  c.budget_bits = budget;
  c.max_decode_steps = 4;
  return c;
}

Totals run(const EngineConfig& c, int steps = 3) {
  DecodeEngine engine(load_model("tiny-gqa"), c);
  Totals t;
  for (int s = 0; s < steps; ++s) {
    t.lengths.push_back(engine.sequence_length() + 1);
    const StepStats st = engine.step();
    t.tokens.push_back(st.next_tokens);
    t.attention.push_back(test::all_layers_attention(engine));
    t.scanned.push_back(st.bytes_scanned);
    t.hits += st.hits;
    t.misses += st.misses;
    t.bytes_h2d += st.bytes_h2d;
    t.recall.push_back(st.recall);
    t.error.push_back(st.attention_rel_error);
    EXPECT_TRUE(st.phase_ms.count("scan"));
  }
  return t;
}

// tiny-gqa: 2 layers, 2 KV heads of head_dim 32, 4 query heads per KV head; a KV row of one head
// is K + V in bf16 = 128 B.
constexpr std::int64_t kRowBytes = 128;
constexpr std::int64_t kStreamsPerLayer = 2 * 2;  // requests x KV heads
constexpr std::int64_t kLayers = 2;

TEST(EngineFathom, FullBudgetScansEveryPlaneAndScale) {
  // Budget 4 x head_dim: every channel at 4 planes. Per stream and 64-token block the scan reads
  // 32 channels x 4 planes x 8 B of plane words and 32 x 2 B of fp16 scales.
  const Totals t = run(config(Mode::fathom, 128, 0));
  for (std::size_t s = 0; s < t.scanned.size(); ++s) {
    const std::int64_t blocks = (t.lengths[s] + 63) / 64;
    EXPECT_EQ(t.scanned[s], kLayers * kStreamsPerLayer * blocks * (32 * 4 * 8 + 32 * 2));
  }
}

TEST(EngineFathom, SmallerBudgetsScanFewerBytes) {
  const Totals b40 = run(config(Mode::fathom, 40, 0), 1);
  const Totals b80 = run(config(Mode::fathom, 80, 0), 1);
  const Totals b128 = run(config(Mode::fathom, 128, 0), 1);
  EXPECT_LT(b40.scanned[0], b80.scanned[0]);
  EXPECT_LT(b80.scanned[0], b128.scanned[0]);
  // At most budget planes + one scale per channel: (40 x 8 + 32 x 2) B per block and stream.
  EXPECT_LE(b40.scanned[0], kLayers * kStreamsPerLayer * 4 * (40 * 8 + 32 * 2));
}

TEST(EngineFathom, EverySelectedRowCrossesTheLink) {
  const Totals t = run(config(Mode::fathom, 48, 0));
  EXPECT_EQ(t.hits + t.misses, 0);
  EXPECT_EQ(t.bytes_h2d % kRowBytes, 0);
  const std::int64_t rows = t.bytes_h2d / kRowBytes;
  const std::int64_t lookups = 3 * kLayers * kStreamsPerLayer;
  // Each stream selects at least top_k rows (4 sinks + 32 recent + 28 per head, some shared) and
  // at most 4 + 32 + 4 x 28 = 148.
  EXPECT_GE(rows, lookups * 64);
  EXPECT_LE(rows, lookups * 148);
  for (double r : t.recall) {
    EXPECT_GT(r, 0.5);
    EXPECT_LE(r, 1.0);
  }
  for (double e : t.error) {
    EXPECT_GT(e, 0.0);
    EXPECT_LT(e, 1.0);
  }
}

TEST(EngineFathom, HotBufferInFrontChangesOnlyTheBytesMoved) {
  const Totals fathom = run(config(Mode::fathom, 48, 0));
  for (int hot : {148, 200, 256}) {
    SCOPED_TRACE("hot " + std::to_string(hot));
    const Totals both = run(config(Mode::hisparse_fathom, 48, hot));
    EXPECT_EQ(both.tokens, fathom.tokens);
    ASSERT_EQ(both.attention.size(), fathom.attention.size());
    for (std::size_t s = 0; s < both.attention.size(); ++s)
      EXPECT_TRUE(both.attention[s] == fathom.attention[s]) << "step " << s;
    EXPECT_EQ(both.scanned, fathom.scanned);
    EXPECT_EQ(both.recall, fathom.recall);
    EXPECT_EQ(both.error, fathom.error);
    EXPECT_EQ(both.hits + both.misses, fathom.bytes_h2d / kRowBytes);
    EXPECT_EQ(both.bytes_h2d, both.misses * kRowBytes);
    if (hot >= 200 + 3) {
      EXPECT_EQ(both.misses, 0);
    } else {
      EXPECT_GT(both.misses, 0);
    }
    EXPECT_LT(both.bytes_h2d, fathom.bytes_h2d);
  }
}

TEST(EngineFathom, ConfigurationErrorsNameTheFix) {
  auto error_of = [](const std::string& model, const EngineConfig& c) -> std::string {
    try {
      DecodeEngine e(load_model(model), c);
    } catch (const Error& err) {
      return err.what();
    }
    return {};
  };
  EXPECT_EQ(error_of("tiny-gqa", config(Mode::hisparse_fathom, 48, 128)),
            "hot_buffer: hot_buffer 128 cannot hold one Fathom selection of up to 148 rows (4 "
            "sinks + 32 recent + 4 query heads x (top_k 64 - 36)); use hot_buffer >= 148");
  EXPECT_EQ(error_of("tiny-gqa", config(Mode::fathom, 48, 0, 30)),
            "fathom selector: top_k: top_k 30 leaves no room beyond 4 sinks and 32 recent tokens; "
            "use top_k > 36");
  EXPECT_EQ(error_of("tiny-gqa", config(Mode::fathom, 200, 0)),
            "budget_bits: budget 200 plane bits is outside 0..128 for head_dim 32; use a budget "
            "such as 40, 48, 64, 80 or 128");
  EXPECT_EQ(error_of("tiny-dsa", config(Mode::hisparse_fathom, 48, 200)),
            "mode hisparse+fathom: mode hisparse+fathom needs a GQA model (tiny-dsa uses MLA); "
            "pick a mode the model supports");
}

}  // namespace
}  // namespace hisparse
