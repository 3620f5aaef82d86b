// The policy study over recorded selections: reading .npy dumps of top-k positions into named
// streams, hand-worked miss counts with and without warm-up, sums over streams, and one message
// per kind of bad input.
#include "hotcache/policy_study.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.hpp"
#include "model/npy.hpp"
#include "support/error_message.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

using test::TempDir;

TEST(HotcachePolicyStudy, NpyDumpBecomesOneNamedStreamPerLeadingIndex) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  // [2 layers, 1 request, 2 steps, 3 positions]; -1 is padding, -7 too (every negative is).
  write_npy_integers(file, NpyType::i64, {2, 1, 2, 3}, {0, 5, -1, 1, 2, 10, 3, -7, 4, 9, 8, 7});
  const auto streams = read_selection_streams(file, 10);
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[0].name, file.string() + "[0, 0]");
  EXPECT_EQ(streams[1].name, file.string() + "[1, 0]");
  const auto& first = streams[0].trace.steps;
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].seq_len, 10);
  EXPECT_EQ(first[1].seq_len, 11);  // one token more per decode step
  EXPECT_EQ(first[0].selected, (std::vector<std::int32_t>{0, 5, -1}));
  EXPECT_EQ(first[1].selected, (std::vector<std::int32_t>{1, 2, 10}));
  EXPECT_EQ(streams[1].trace.steps[0].selected, (std::vector<std::int32_t>{3, -1, 4}));

  // Two dimensions: one stream named after the file; int32 reads the same.
  write_npy_integers(file, NpyType::i32, {1, 2}, {4, 0});
  const auto one = read_selection_streams(file, 5);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].name, file.string());
  EXPECT_EQ(one[0].trace.steps[0].selected, (std::vector<std::int32_t>{4, 0}));
}

TEST(HotcachePolicyStudy, TextTracesPassThroughUnchanged) {
  const TempDir dir;
  const auto file = dir.write("t.txt", "# recorded\n8: 1 2 7\n9: 3\n");
  const auto streams = read_selection_streams(file, 0);  // a text trace carries its lengths
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0].name, file.string());
  ASSERT_EQ(streams[0].trace.steps.size(), 2u);
  EXPECT_EQ(streams[0].trace.steps[1].seq_len, 9);
  EXPECT_EQ(streams[0].trace.steps[0].selected, (std::vector<std::int32_t>{1, 2, 7}));
}

TEST(HotcachePolicyStudy, BadDumpsNameTheFileTheEntryAndTheFix) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  const std::string at = file.string();
  const auto error = [&](std::int64_t first) {
    return test::error_message([&] { (void)read_selection_streams(file, first); });
  };
  write_npy(file, NpyType::f32, {1, 2}, {1, 2});
  EXPECT_EQ(error(8), at + ": element type '<f4' is not an integer type; store the selected "
                           "positions as int32 ('<i4') or int64 ('<i8'), e.g. numpy.save(path, "
                           "indices.astype(numpy.int32))");
  write_npy_integers(file, NpyType::i32, {3}, {1, 2, 3});
  EXPECT_EQ(error(8), at + ": shape [3] has 1 dimension(s); recorded selections are [..., steps, "
                           "top_k]; save at least a steps dimension and a top_k dimension");
  write_npy_integers(file, NpyType::i32, {0, 2, 2}, {});
  EXPECT_EQ(error(8), at + ": shape [0, 2, 2] holds no selections; save at least one stream of "
                           "one step with one selected position");
  write_npy_integers(file, NpyType::i32, {2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(error(0), at + ": an .npy of positions does not say how long the sequences were; "
                           "give the sequence length at the first recorded step (it grows by one "
                           "per step)");
  // Step 1 has length 5 + 1 = 6, so position 6 cannot be selected there.
  write_npy_integers(file, NpyType::i32, {2, 2}, {1, 4, 6, 2});
  EXPECT_EQ(error(5), at + " step 1 entry 0: position 6 is beyond the step's sequence length 6 "
                           "(the first recorded step's length 5 plus 1); give the sequence "
                           "length the first recorded step really had (at least 6)");
  EXPECT_EQ(error(std::int64_t{1} << 31),
            at + ": a sequence length of 2147483648 does not fit the 32-bit positions of a "
                 "selection; give a length below 2^31");
}

// Hot 2, sequence length 10 at every step, so token 9 (the newest) is always a hit and never
// takes a slot. The cache starts with tokens 0 and 1.
//   step 0: {5, 9}  5 misses (evicts 0)          1 hit, 1 miss
//   step 1: {5, 9}  5 hits                        2 hits
//   step 2: {6, 1}  6 misses (evicts 5), 1 hits   1 hit, 1 miss
SelectionTrace worked_trace() {
  return {{{10, {5, 9}}, {10, {5, 9}}, {10, {6, 1}}}};
}

TEST(HotcachePolicyStudy, HandWorkedMissesWithAndWithoutWarmup) {
  const std::vector<NamedTrace> streams{{"a", worked_trace()}};
  PolicyStudyOptions o;
  o.hots = {2};
  o.policies = {ReplacementPolicy::lru};
  const PolicyStudy all = study_policies(streams, o);
  ASSERT_EQ(all.cells.size(), 1u);
  EXPECT_EQ(all.cells[0].total.hits, 4);
  EXPECT_EQ(all.cells[0].total.misses, 2);
  EXPECT_EQ(all.counted_steps, 3);
  o.warmup_steps = 1;  // step 0 still fills the cache, so step 1 is a hit
  const PolicyStudy warm = study_policies(streams, o);
  EXPECT_EQ(warm.cells[0].total.hits, 3);
  EXPECT_EQ(warm.cells[0].total.misses, 1);
  EXPECT_EQ(warm.counted_steps, 2);
  o.warmup_steps = 5;  // longer than the trace: nothing counted
  const PolicyStudy none = study_policies(streams, o);
  EXPECT_EQ(none.cells[0].total.hits + none.cells[0].total.misses, 0);
  EXPECT_EQ(none.counted_steps, 0);
}

TEST(HotcachePolicyStudy, CellsSumTheStreamsInHotThenPolicyOrder) {
  // Three random streams of different lengths over a 600-token sequence.
  Rng rng(7);
  std::vector<NamedTrace> streams;
  for (int s = 0; s < 3; ++s) {
    NamedTrace named{"s" + std::to_string(s), {}};
    for (int t = 0; t < 20 + 5 * s; ++t) {
      TraceStep step{600 + t, {}};
      for (int e = 0; e < 64; ++e)
        step.selected.push_back(static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(
            e < 48 ? 120 : step.seq_len))));  // a reused head of 120 tokens and a random tail
      named.trace.steps.push_back(std::move(step));
    }
    streams.push_back(std::move(named));
  }
  PolicyStudyOptions o;
  o.hots = {64, 128};
  o.policies = {ReplacementPolicy::belady, ReplacementPolicy::lru, ReplacementPolicy::random};
  o.seed = 3;
  o.threads = 1;
  const PolicyStudy one = study_policies(streams, o);
  o.threads = 4;
  const PolicyStudy four = study_policies(streams, o);
  EXPECT_EQ(one.streams, 3);
  EXPECT_EQ(one.counted_steps, 30);
  EXPECT_EQ(one.stream_steps, 20 + 25 + 30);
  ASSERT_EQ(one.cells.size(), 6u);
  for (std::size_t c = 0; c < one.cells.size(); ++c) {
    const auto& cell = one.cells[c];
    EXPECT_EQ(cell.hot, o.hots[c / 3]);
    EXPECT_EQ(cell.policy, o.policies[c % 3]);
    EXPECT_EQ(one.find(cell.hot, cell.policy), &cell);
    PolicyStats sum;
    for (std::size_t s = 0; s < streams.size(); ++s) {
      const PolicyStats alone = simulate_policy(cell.policy, streams[s].trace, cell.hot, 3);
      EXPECT_EQ(cell.per_stream[s].misses, alone.misses);
      sum.hits += alone.hits;
      sum.misses += alone.misses;
    }
    EXPECT_EQ(cell.total.hits, sum.hits);
    EXPECT_EQ(cell.total.misses, sum.misses);
    EXPECT_EQ(four.cells[c].total.misses, cell.total.misses);  // threads change nothing
    const std::size_t worst = cell.worst_stream();
    for (const auto& s : cell.per_stream)
      EXPECT_LE(s.miss_rate(), cell.per_stream[worst].miss_rate());
  }
  for (const int hot : o.hots)  // the optimum is a lower bound
    EXPECT_LE(one.find(hot, ReplacementPolicy::belady)->total.misses,
              one.find(hot, ReplacementPolicy::lru)->total.misses);
  EXPECT_EQ(one.find(32, ReplacementPolicy::lru), nullptr);
}

TEST(HotcachePolicyStudy, AHotBufferBelowAStepsDemandIsRefusedByName) {
  const std::vector<NamedTrace> streams{{"a", worked_trace()}, {"b", {{{10, {1, 2, 3, 9}}}}}};
  EXPECT_EQ(largest_demand(streams, 2).slots, 3);
  EXPECT_EQ(largest_demand(streams, 2).stream, "b");
  EXPECT_EQ(largest_demand(streams, 10).slots, 0);  // seq_len <= hot: every token has a slot
  PolicyStudyOptions o;
  o.hots = {4, 2};
  o.policies = {ReplacementPolicy::lru};
  o.hots_source = "--hot";
  EXPECT_EQ(test::error_message([&] { (void)study_policies(streams, o); }),
            "--hot: 2 slots cannot serve step 0 of b, which needs 3 at once (its distinct "
            "positions other than the newest token); give hot-buffer sizes of at least 3");
  o.hots = {0};
  EXPECT_EQ(test::error_message([&] { (void)study_policies(streams, o); }),
            "--hot: a hot buffer of 0 slots; use at least 1 slot");
  o.hots = {4};
  o.warmup_steps = -1;
  EXPECT_EQ(test::error_message([&] { (void)study_policies(streams, o); }),
            "policy study: warm-up of -1 steps; give 0 or more warm-up steps");
  EXPECT_EQ(test::error_message([&] { (void)study_policies({}, o); }),
            "policy study: no recorded streams were given; pass at least one trace file");
}

}  // namespace
}  // namespace hisparse
