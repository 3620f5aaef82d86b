// DecodeEngine fathom and hisparse+fathom modes on the CPU backend (GQA models): plane-scan
// selection, byte accounting, and the hot buffer in front of Fathom changing only the bytes moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "fathom/key_centre.hpp"
#include "fathom/klt.hpp"
#include "fathom/plane_store.hpp"
#include "fathom/selector.hpp"
#include "model/decode_engine.hpp"
#include "model/engine_fathom_index.hpp"
#include "support/engine_outputs.hpp"
#include "support/error_message.hpp"

namespace hisparse {
namespace {

struct Totals {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<float>> attention;
  std::vector<std::int64_t> scanned;  ///< per step
  std::vector<std::int64_t> lengths;  ///< sequence length each step attended over
  std::int64_t hits = 0, misses = 0, bytes_h2d = 0;
  std::vector<double> recall, error;
  std::vector<std::int64_t> plans, plan_active_channels;
  std::vector<double> plan_bits;
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
    t.plans.push_back(st.plans);
    t.plan_bits.push_back(st.plan_bits);
    t.plan_active_channels.push_back(st.plan_active_channels);
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
    // One plan per layer and stream, each 32 channels x (4 planes + 0.25 bit of scale).
    EXPECT_EQ(t.plans[s], kLayers * kStreamsPerLayer);
    EXPECT_EQ(t.plan_bits[s], static_cast<double>(kLayers * kStreamsPerLayer) * 136.0);
    EXPECT_EQ(t.plan_active_channels[s], kLayers * kStreamsPerLayer * 32);
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
  // Each plan spends its 40 planes (the paper rule fills the budget here) and pays 0.25 bit per
  // active channel: bits = 40 + active / 4 per plan, in sum over the step's plans.
  const double plans = static_cast<double>(b40.plans[0]);
  EXPECT_EQ(b40.plans[0], kLayers * kStreamsPerLayer);
  EXPECT_EQ(b40.plan_bits[0], plans * 40 + static_cast<double>(b40.plan_active_channels[0]) * 0.25);
  EXPECT_LT(b40.plan_active_channels[0], b128.plan_active_channels[0]);
}

TEST(EngineFathom, HeadBudgetsShiftEachKvHeadsPlan) {
  // A table with equal budgets shifts nothing: the run is the plain one, bit for bit.
  EngineConfig flat = config(Mode::fathom, 48, 0);
  flat.fathom_head_budgets = {30, 30};
  const Totals plain = run(config(Mode::fathom, 48, 0), 2), same = run(flat, 2);
  EXPECT_EQ(same.tokens, plain.tokens);
  EXPECT_EQ(same.attention, plain.attention);
  EXPECT_EQ(same.scanned, plain.scanned);
  // Table (10, 30) at budget_bits 20 (mean 20): KV head 0 plans 10 planes, KV head 1 30. Every
  // plan spends its budget, so the step's planes are 40 per (request, layer), as with equal
  // budgets, but the plans differ.
  EngineConfig split = config(Mode::fathom, 20, 0);
  split.fathom_head_budgets = {10, 30};
  const Totals t = run(split, 1);
  const double planes = t.plan_bits[0] - 0.25 * static_cast<double>(t.plan_active_channels[0]);
  EXPECT_EQ(planes, 40.0 * 2 * kLayers);
  EXPECT_LE(t.plan_active_channels[0], 2 * kLayers * 32);
  const Totals even = run(config(Mode::fathom, 20, 0), 1);
  EXPECT_EQ(even.plan_bits[0] - 0.25 * static_cast<double>(even.plan_active_channels[0]),
            20.0 * 2 * 2 * kLayers);
  EXPECT_NE(t.scanned, even.scanned);
  // The KLT basis and the measured rule plan per stream too (their bases and read tables are the
  // plan's period). Table (0, 256) at budget 64: KV head 0 plans nothing, KV head 1 every plane
  // (128), so exactly KV head 1's 32 channels per (request, layer) are active.
  EngineConfig klt = config(Mode::fathom, 64, 0);
  klt.fathom_head_budgets = {0, 256};
  klt.fathom_klt = true;
  const Totals k = run(klt, 1);
  EXPECT_EQ(k.plan_active_channels[0], 2 * kLayers * 32);
  EXPECT_EQ(k.plan_bits[0], 2.0 * kLayers * (128 + 0.25 * 32));
  EngineConfig measured = klt;
  measured.fathom_klt = false;
  measured.fathom_rule = fathom::PlanRule::measured;
  const Totals m = run(measured, 1);  // buys only planes that lower the error: at most these
  EXPECT_LE(m.plan_active_channels[0], 2 * kLayers * 32);
  EXPECT_GT(m.plan_active_channels[0], 0);
  // A table whose size is not a multiple of the KV heads is refused by the engine too.
  EngineConfig bad = config(Mode::fathom, 48, 0);
  bad.fathom_head_budgets = {1, 2, 3};
  EXPECT_EQ(test::error_message([&] { DecodeEngine engine(load_model("tiny-gqa"), bad); }),
            "fathom.head_budgets: 3 per-head budgets for a model with 2 KV heads; give 2 budgets "
            "per layer (one per KV head), layer by layer");
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

// Correlated keys (independent channels with spread variances, mixed by a random matrix): the
// index with klt must select exactly what the selector's own KLT path selects on keys rotated by
// each stream's calibration basis.
TEST(EngineFathomKlt, IndexSelectsLikeTheSelectorsKltPath) {
  constexpr int kStreams = 2, kDim = 32, kGroup = 4;
  constexpr std::int64_t kTokens = 700;
  Rng rng(31);
  std::vector<float> mix(kDim * kDim);
  for (auto& m : mix) m = static_cast<float>(rng.normal());
  std::vector<float> keys(static_cast<std::size_t>(kStreams) * kTokens * kDim);
  for (std::size_t row = 0; row < keys.size() / kDim; ++row) {
    float independent[kDim];
    for (int j = 0; j < kDim; ++j)
      independent[j] =
          static_cast<float>(rng.normal()) * std::pow(10.0f, -1.5f * static_cast<float>(j) / kDim);
    for (int i = 0; i < kDim; ++i) {
      float sum = 0;
      for (int j = 0; j < kDim; ++j) sum += mix[i * kDim + j] * independent[j];
      keys[row * kDim + i] = sum;
    }
  }
  std::vector<float> queries(static_cast<std::size_t>(kStreams) * kGroup * kDim);
  for (auto& q : queries) q = static_cast<float>(rng.normal());
  const fathom::SelectorConfig selector{96, 4, 32, 40};

  FathomIndexShape shape;
  shape.streams = kStreams;
  shape.head_dim = kDim;
  shape.group = kGroup;
  shape.capacity = kTokens;
  shape.klt = true;
  FathomKeyIndex index(shape, selector, Backend::cpu);
  index.load_context(0, keys.data(), kTokens * kDim, kTokens);
  std::vector<std::int32_t> got(static_cast<std::size_t>(kStreams) * index.width());
  (void)index.select(0, queries.data(), got.data());

  fathom::PlaneStore store(Backend::cpu, fathom::PlaneLayoutKind::host, kStreams, kDim, kTokens);
  std::vector<fathom::KltBasis> bases;
  for (int s = 0; s < kStreams; ++s) {
    std::vector<std::uint16_t> bf(static_cast<std::size_t>(kTokens) * kDim), rotated(bf.size());
    for (std::size_t i = 0; i < bf.size(); ++i)
      bf[i] = float_to_bf16(keys[static_cast<std::size_t>(s) * bf.size() + i]);
    bases.push_back(fathom::KltBasis::calibrate(bf.data(), kTokens, kDim, 16, kTokens));
    bases.back().rotate_keys(bf.data(), rotated.data(), kTokens);
    store.append(s, 1, rotated.data(), kDim, 0, kTokens);
  }
  fathom::SelectorConfig with_klt = selector;
  with_klt.klt = true;
  fathom::FathomSelector reference(Backend::cpu, with_klt);
  reference.set_klt_bases(bases);
  const auto want = reference.select(store, queries.data(), kGroup, nullptr, 1);
  for (int s = 0; s < kStreams; ++s) {
    std::vector<std::int32_t> row(got.begin() + s * index.width(),
                                  got.begin() + (s + 1) * index.width());
    row.erase(std::find(row.begin(), row.end(), -1), row.end());
    EXPECT_EQ(row, want[static_cast<std::size_t>(s)]) << "stream " << s;
  }
  // The eigenbasis concentrates the variance: its planner gives the leading rotated channels
  // the deepest reads, which it cannot do on the mixed channels.
  const auto& depths = reference.last_depths();
  EXPECT_EQ(depths[0], 4);
  EXPECT_EQ(depths[kDim - 1], 0);
}

TEST(EngineFathomKlt, DecodeRunsWithTheKltBasis) {
  EngineConfig c = config(Mode::fathom, 48, 0);
  c.fathom_klt = true;
  const Totals klt = run(c, 2);
  for (double r : klt.recall) {
    EXPECT_GE(r, 0.0);
    EXPECT_LE(r, 1.0);
  }
  // The budget, not the basis, sets what a step scans: at the full budget both read everything.
  EngineConfig full = config(Mode::fathom, 128, 0);
  const Totals plain = run(full, 1);
  full.fathom_klt = true;
  EXPECT_EQ(run(full, 1).scanned, plain.scanned);
}

// The index with the measured rule calibrates each stream's plane reads on its context keys and
// selects what the selector's measured rule selects with those calibrations; with centre_keys,
// on keys minus each stream's calibration mean (the same 16 skipped tokens). Again after one
// appended token (a large key that raises its block's scales).
void expect_index_selects_like_the_selector(bool centre_keys) {
  constexpr int kStreams = 2, kDim = 32, kGroup = 4;
  constexpr std::int64_t kTokens = 700;
  Rng rng(37);
  std::vector<float> keys(static_cast<std::size_t>(kStreams) * kTokens * kDim);
  for (std::size_t i = 0; i < keys.size(); ++i)  // spread channel scales, a biased channel
    keys[i] = static_cast<float>(rng.normal() * std::exp2(static_cast<double>(i % kDim) / 4.0)) +
              (i % kDim == 3 ? 20.0f : 0.0f);
  std::vector<float> queries(static_cast<std::size_t>(kStreams) * kGroup * kDim);
  for (auto& q : queries) q = static_cast<float>(rng.normal());
  fathom::SelectorConfig selector{96, 4, 32, 40};

  FathomIndexShape shape;
  shape.streams = kStreams;
  shape.head_dim = kDim;
  shape.group = kGroup;
  shape.capacity = kTokens + 1;
  shape.centre_keys = centre_keys;
  selector.rule = fathom::PlanRule::measured;
  FathomKeyIndex index(shape, selector, Backend::cpu);
  index.load_context(0, keys.data(), kTokens * kDim, kTokens);
  std::vector<std::int32_t> got(static_cast<std::size_t>(kStreams) * index.width());
  (void)index.select(0, queries.data(), got.data());

  fathom::PlaneStore store(Backend::cpu, fathom::PlaneLayoutKind::host, kStreams, kDim,
                           kTokens + 1);
  std::vector<fathom::PlaneReadCalibration> reads;
  std::vector<fathom::KeyCentre> centres;
  for (int s = 0; s < kStreams; ++s) {
    std::vector<std::uint16_t> bf(static_cast<std::size_t>(kTokens) * kDim);
    for (std::size_t i = 0; i < bf.size(); ++i)
      bf[i] = float_to_bf16(keys[static_cast<std::size_t>(s) * bf.size() + i]);
    centres.push_back(centre_keys
                          ? fathom::KeyCentre::calibrate(bf.data(), kTokens, kDim, 16, kTokens)
                          : fathom::KeyCentre::none(kDim));
    centres.back().apply(bf.data(), bf.data(), kTokens);
    reads.push_back(fathom::calibrate_plane_reads(bf.data(), kTokens, kDim, 16, kTokens));
    store.append(s, 1, bf.data(), kDim, 0, kTokens);
  }
  fathom::FathomSelector reference(Backend::cpu, selector);
  const auto expect_same = [&](const char* when) {
    // The stored planes and scales of every block that holds tokens (keys centred alike),
    // then the selections.
    const fathom::PlaneStore& held = index.store(0);
    const auto& L = held.layout();
    int differ = 0;
    for (int s = 0; s < kStreams; ++s)
      for (std::int64_t b = 0; b * 64 < held.length(s); ++b)
        for (int j = 0; j < kDim; ++j) {
          const auto at =
              static_cast<std::int64_t>(s) * L.scales_per_stream() + L.scale_index(b, j);
          differ += held.host_scales()[at] != store.host_scales()[at];
          for (int p = 0; p < 4; ++p) {
            const auto w =
                static_cast<std::int64_t>(s) * L.words_per_stream() + L.word_index(b, j, p);
            differ += held.host_words()[w] != store.host_words()[w];
          }
        }
    EXPECT_EQ(differ, 0) << "words or scales differ, " << when;
    const fathom::ReadTables tables(Backend::cpu, reads, kDim);
    const auto want = reference.select(store, queries.data(), kGroup, nullptr, 1, &tables);
    for (int s = 0; s < kStreams; ++s) {
      std::vector<std::int32_t> row(got.begin() + s * index.width(),
                                    got.begin() + (s + 1) * index.width());
      row.erase(std::find(row.begin(), row.end(), -1), row.end());
      EXPECT_EQ(row, want[static_cast<std::size_t>(s)]) << "stream " << s << ", " << when;
    }
  };
  expect_same("context");
  std::vector<float> next(static_cast<std::size_t>(kStreams) * kDim);
  for (std::size_t i = 0; i < next.size(); ++i) next[i] = 30.0f + static_cast<float>(i % 7);
  index.append(0, next.data());
  (void)index.select(0, queries.data(), got.data());
  for (int s = 0; s < kStreams; ++s) {
    std::vector<std::uint16_t> bf(kDim);
    for (int j = 0; j < kDim; ++j) bf[j] = float_to_bf16(next[s * kDim + j]);
    centres[static_cast<std::size_t>(s)].apply(bf.data(), bf.data(), 1);
    store.append(s, 1, bf.data(), kDim, 0, 1);
  }
  expect_same("after one appended token");
}

TEST(EngineFathomMeasured, IndexSelectsLikeTheSelectorsMeasuredRule) {
  expect_index_selects_like_the_selector(false);
}

TEST(EngineFathomMeasured, CentredIndexSelectsLikeTheSelectorOnCentredKeys) {
  expect_index_selects_like_the_selector(true);
}

TEST(EngineFathomMeasured, DecodeRunsWithTheMeasuredRule) {
  EngineConfig c = config(Mode::fathom, 48, 0);
  c.fathom_rule = fathom::PlanRule::measured;
  EngineConfig centred = c;
  centred.fathom_centre_keys = true;
  for (double r : run(centred, 2).recall) {
    EXPECT_GT(r, 0.5);
    EXPECT_LE(r, 1.0);
  }
  const Totals measured = run(c, 2);
  const Totals paper = run(config(Mode::fathom, 48, 0), 2);
  ASSERT_EQ(measured.recall.size(), 2u);
  for (double r : measured.recall) {
    EXPECT_GT(r, 0.5);
    EXPECT_LE(r, 1.0);
  }
  // Here (200 tokens) it reads fewer channels, each more deeply: fewer fp16 scales for the same
  // planes. The runs differ, so the rule reached the planner.
  for (std::size_t s = 0; s < measured.scanned.size(); ++s)
    EXPECT_LT(measured.scanned[s], paper.scanned[s]) << "step " << s;
}

TEST(EngineFathom, ConfigurationErrorsNameTheFix) {
  auto error_of = [](const std::string& model, const EngineConfig& c) {
    return test::error_message([&] { DecodeEngine e(load_model(model), c); });
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
