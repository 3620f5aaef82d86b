// Quality metrics of sparse steps: selection recall against each query head's exact top-k and
// the relative L2 error of the attention output against dense attention. Hand-worked cases for
// the functions, then what the engine reports per mode.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/decode_engine.hpp"
#include "model/selection_quality.hpp"

namespace hisparse {
namespace {

// Keys t0 = (1, 0), t1 = (0, 1), t2 = (1, 1), t3 = (-1, 0). Head 0 asks (1, 0): logits
// 1, 0, 1, -1, so its top-2 is {0, 2}; head 1 asks (0, 1): logits 0, 1, 1, 0, top-2 {1, 2}.
const std::vector<float> kKeys{1, 0, 0, 1, 1, 1, -1, 0};
const std::vector<float> kQueries{1, 0, 0, 1};

SelectionRecallArgs args(const std::vector<std::int32_t>& selected, int top_k, int groups = 1,
                         int kv_heads = 1) {
  SelectionRecallArgs a;
  a.q = kQueries.data();
  a.k = kKeys.data();
  a.batch = 1;
  a.q_heads = 2;
  a.kv_heads = kv_heads;
  a.dim = 2;
  a.capacity = 4;
  a.seq_len = 4;
  a.selected = selected.data();
  a.groups = groups;
  a.width = static_cast<int>(selected.size()) / groups;
  a.top_k = top_k;
  return a;
}

TEST(EngineQuality, RecallCountsEachHeadsExactTopK) {
  const std::vector<std::int32_t> all{0, 1, 2};
  EXPECT_DOUBLE_EQ(selection_recall(args(all, 2)), 1.0);
  const std::vector<std::int32_t> some{2, 3, -1};
  EXPECT_DOUBLE_EQ(selection_recall(args(some, 2)), 0.5);  // {2} of {0,2} and of {1,2}
  const std::vector<std::int32_t> none{3, -1, -1};
  EXPECT_DOUBLE_EQ(selection_recall(args(none, 2)), 0.0);
}

TEST(EngineQuality, RecallBreaksTiesTowardsTheLowerPosition) {
  // Head 0's logits tie at t0 and t2: its top-1 is t0. Head 1's top-1 is t1 (tie with t2).
  const std::vector<std::int32_t> low{0, 1};
  EXPECT_DOUBLE_EQ(selection_recall(args(low, 1)), 1.0);
  const std::vector<std::int32_t> high{2};
  EXPECT_DOUBLE_EQ(selection_recall(args(high, 1)), 0.0);
}

TEST(EngineQuality, RecallUsesTheSelectionOfTheHeadsGroup) {
  // Two KV heads sharing the same keys layout: head 0 -> group 0, head 1 -> group 1.
  std::vector<float> keys2 = kKeys;
  keys2.insert(keys2.end(), kKeys.begin(), kKeys.end());
  const std::vector<std::int32_t> per_group{0, 2, 3, 0};  // group 0 {0,2}, group 1 {3,0}
  SelectionRecallArgs a = args(per_group, 2, 2, 2);
  a.k = keys2.data();
  EXPECT_DOUBLE_EQ(selection_recall(a), (1.0 + 0.0) / 2);
  // top_k beyond the sequence: the exact set is every token.
  const std::vector<std::int32_t> three{0, 1, 2};
  EXPECT_DOUBLE_EQ(selection_recall(args(three, 9)), 0.75);
}

TEST(EngineQuality, RelativeErrorIsPerVectorAndAveraged) {
  const std::vector<float> exact{0, 5, 1, 0, 0, 0};
  const std::vector<float> approx{3, 4, 1, 0, 0, 0};
  // sqrt(9 + 1) / 5, then 0, then 0 for a zero vector met exactly.
  EXPECT_DOUBLE_EQ(mean_relative_l2_error(approx.data(), exact.data(), 3, 2),
                   std::sqrt(10.0) / 5 / 3);
  const std::vector<float> off{0, 0, 0, 0, 1, 0};
  EXPECT_DOUBLE_EQ(mean_relative_l2_error(off.data(), exact.data(), 3, 2), (1.0 + 1.0 + 1.0) / 3);
}

StepStats one_step(const char* model, Mode mode, int top_k, bool quality = true) {
  EngineConfig c;
  c.mode = mode;
  c.top_k = top_k;
  c.concurrency = 2;
  c.context_length = 120;
  c.quality_metrics = quality;
  DecodeEngine engine(load_model(model), c);
  return engine.step();
}

TEST(EngineQuality, DenseIsNotMeasuredAndFullSelectionsAreExact) {
  for (const char* model : {"tiny-dsa", "tiny-gqa"}) {
    SCOPED_TRACE(model);
    const StepStats dense = one_step(model, Mode::dense, 0);
    EXPECT_EQ(dense.recall, -1.0);
    EXPECT_EQ(dense.attention_rel_error, -1.0);
    EXPECT_EQ(dense.quality_ms, 0.0);
    // top_k above the sequence: every token is selected, in dense order.
    const StepStats full = one_step(model, Mode::sparse_gpu, 200);
    EXPECT_EQ(full.recall, 1.0);
    EXPECT_EQ(full.attention_rel_error, 0.0);
    EXPECT_GT(full.quality_ms, 0.0);
    const StepStats sparse = one_step(model, Mode::sparse_gpu, 16);
    EXPECT_GT(sparse.recall, 0.0);
    EXPECT_LT(sparse.recall, 1.0);
    EXPECT_GT(sparse.attention_rel_error, 0.0);
    EXPECT_LT(sparse.attention_rel_error, 1.0);
    const StepStats off = one_step(model, Mode::sparse_gpu, 16, false);
    EXPECT_EQ(off.recall, -1.0);
    EXPECT_EQ(off.next_tokens, sparse.next_tokens);  // measuring changes nothing
  }
}

TEST(EngineQuality, LargerSelectionsAreCloserToDense) {
  const StepStats small = one_step("tiny-gqa", Mode::sparse_gpu, 8);
  const StepStats large = one_step("tiny-gqa", Mode::sparse_gpu, 64);
  EXPECT_LT(large.attention_rel_error, small.attention_rel_error);
}

}  // namespace
}  // namespace hisparse
