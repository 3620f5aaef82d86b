// HotCache / HostKvPool / HotBuffer on the CPU backend, and the replacement-policy analysis, with
// hand-worked expectations.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "hotcache/hot_cache.hpp"
#include "hotcache/policies.hpp"
#include "support/error_message.hpp"

namespace hisparse {
namespace {

using V = std::vector<std::int32_t>;

std::uint8_t pattern(int r, int l, std::int64_t t, std::size_t j) {
  return static_cast<std::uint8_t>(r * 101 + l * 37 + t * 11 + static_cast<std::int64_t>(j) * 3 +
                                   5);
}

void fill_pool(HotCache& cache) {
  const auto& c = cache.config();
  for (int r = 0; r < c.requests; ++r)
    for (int l = 0; l < c.layers; ++l)
      for (std::int64_t t = 0; t < c.capacity; ++t)
        for (std::size_t j = 0; j < c.row_bytes; ++j)
          cache.pool().row(r, l, t)[j] = pattern(r, l, t, j);
}

bool row_is(const HotCache& cache, int l, int r, int slot, std::int64_t token) {
  const auto row = cache.hot_buffer().row(l, r, slot);
  for (std::size_t j = 0; j < cache.config().row_bytes; ++j)
    if (row[j] != pattern(r, l, token, j)) return false;
  return true;
}

HotCacheConfig small_config() {
  HotCacheConfig c;
  c.requests = 2;
  c.layers = 2;
  c.capacity = 64;
  c.row_bytes = 20;
  c.hot = 4;
  c.top_k = 3;
  c.backend = Backend::cpu;
  return c;
}

TEST(HotcachePool, LayoutKeepsEachRequestLayerRegionContiguous) {
  HostKvPool pool({3, 2, 10, 584, RowPadding::align16}, Backend::cpu);
  EXPECT_EQ(pool.row_stride(), 592u);
  EXPECT_EQ(pool.copy_bytes(), 592u);
  EXPECT_EQ(pool.region_bytes(), 5920u);
  EXPECT_EQ(pool.bytes(), 6u * 5920u);
  EXPECT_EQ(pool.row(1, 1, 3) - pool.row(0, 0, 0), (1 * 2 + 1) * 5920 + 3 * 592);
  const auto view = pool.layer_view(1);
  EXPECT_EQ(view.base, pool.row(0, 1, 0));
  EXPECT_EQ(view.request_stride, 2u * 5920u);
  EXPECT_EQ(padded_row_stride(656, RowPadding::none), 656u);
  EXPECT_EQ(padded_row_stride(656, RowPadding::align64), 704u);
  EXPECT_THROW((void)pool.row(0, 0, 10), Error);
}

TEST(HotcachePool, BadShapesNameTheField) {
  EXPECT_EQ(test::error_message([&] {
              HostKvPool pool({1, 1, 0, 656}, Backend::cpu);
            }),
            "host KV pool: capacity is 0 tokens; use a capacity (longest sequence) between 1 "
            "and 2^31 - 1 tokens");
}

TEST(HotcacheBuffer, RowsStartZeroedEvenOnReusedMemory) {
  // Slots that no token has reached yet are never copied into, so their bytes must not depend on
  // what the allocator hands out: dirty a block of the same size first, then check every row.
  const HotBufferShape shape{3, 2, 96, 592};
  const std::size_t bytes = 3u * 2u * 97u * 592u;
  {
    auto dirty = Allocation::device(bytes, Backend::cpu, "dirty");
    std::memset(dirty.host_data(), 0xab, bytes);
  }
  const HotBuffer buffer(shape, Backend::cpu);
  for (int l = 0; l < 2; ++l)
    for (int r = 0; r < 3; ++r)
      for (int slot = 0; slot <= 96; ++slot)
        EXPECT_EQ(buffer.row(l, r, slot), std::vector<std::uint8_t>(592, 0)) << l << r << slot;
}

TEST(Buffer, ReserveDeviceGrowsOnlyWhenTheElementsDoNotFit) {
  Buffer<std::int32_t> b;
  std::int32_t* first = b.reserve_device(100, Backend::cpu, "workspace");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(b.size(), 100u);
  first[99] = 7;
  EXPECT_EQ(b.reserve_device(100, Backend::cpu, "workspace"), first);  // kept, contents too
  EXPECT_EQ(b.reserve_device(10, Backend::cpu, "workspace"), first);
  EXPECT_EQ(first[99], 7);
  EXPECT_EQ(b.size(), 100u);
  b.reserve_device(101, Backend::cpu, "workspace");
  EXPECT_EQ(b.size(), 101u);
}

TEST(HotcacheCache, AdmitThenSwapInThroughTheCpuBackend) {
  HotCache cache(small_config());
  fill_pool(cache);
  cache.admit(0, 30);  // long: slots hold 0..3, reserved slot holds 29
  cache.admit(1, 3);   // short
  EXPECT_TRUE(row_is(cache, 1, 0, 2, 2));
  EXPECT_TRUE(row_is(cache, 1, 0, 4, 29));
  EXPECT_TRUE(row_is(cache, 0, 1, 1, 1));

  const V selected{29, 2, 17, 2, 0, 9};
  const V seq_lens{30, 3};
  const std::int32_t num_real = 2;
  V out(6, 99);
  SwapInStep step{selected.data(), seq_lens.data(), false, &num_real, nullptr, 2, out.data()};
  Stream stream(Backend::cpu);
  const SwapInStats stats = cache.swap_in(1, step, stream);
  EXPECT_EQ(out, (V{4, 2, 0, 5 + 2, 5 + 0, -1}));
  EXPECT_EQ(stats.hits, 4);  // 29 (newest), 2, and request 1's 2 and 0
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.bytes, 20);
  EXPECT_TRUE(row_is(cache, 1, 0, 0, 17));
  EXPECT_EQ(cache.hot_buffer().slot_tokens(1, 0), (V{17, 1, 2, 3}));
  EXPECT_EQ(cache.hot_buffer().lru_order(1, 0), (V{1, 3, 0, 2}));
  EXPECT_EQ(cache.hot_buffer().slot_tokens(0, 0), (V{0, 1, 2, 3}));  // other layer untouched
  // The residency bitmap (one bit per token of the capacity): admit set tokens 0..3; the swap-in
  // moved token 0 out and 17 in on layer 1 only.
  using Bits = std::vector<std::uint32_t>;
  EXPECT_EQ(cache.hot_buffer().resident_bits(0, 0), (Bits{0xfu, 0u}));
  EXPECT_EQ(cache.hot_buffer().resident_bits(1, 0), (Bits{0xeu | (1u << 17), 0u}));
  // Without the speculative gather no bitmap is kept.
  HotCacheConfig plain = small_config();
  plain.speculative_gather = false;
  EXPECT_TRUE(HotCache(plain).hot_buffer().resident_bits(0, 0).empty());
  EXPECT_EQ(cache.hot_buffer().newest_slot(30), 4);
  EXPECT_EQ(cache.hot_buffer().newest_slot(3), 2);
}

TEST(HotcacheCache, RejectsTopKAboveHot) {
  auto c = small_config();
  c.top_k = 5;
  EXPECT_EQ(test::error_message([&] { HotCache cache(c); }),
            "hot cache: top_k: top_k 5 with a hot buffer of 4 slots; use 1 <= top_k <= hot "
            "(the hot buffer "
            "must hold one step's selection)");
}

TEST(HotcacheCache, RejectsBadLayerAndOversizedBatch) {
  HotCache cache(small_config());
  const V selected(9, 0), seq_lens{5, 5, 5};
  const std::int32_t num_real = 1;
  V out(9);
  Stream stream(Backend::cpu);
  SwapInStep step{selected.data(), seq_lens.data(), false, &num_real, nullptr, 1, out.data()};
  EXPECT_THROW((void)cache.swap_in(2, step, stream), Error);
  step.batch = 3;
  EXPECT_EQ(test::error_message([&] { (void)cache.swap_in(0, step, stream); }),
            "hot cache: swap_in: batch 3 exceeds max_batch 2; raise HotCacheConfig::max_batch");
}

SelectionTrace trace_of(std::vector<V> steps, std::int64_t seq_len = 100) {
  SelectionTrace t;
  for (auto& s : steps) t.steps.push_back({seq_len, std::move(s)});
  return t;
}

TEST(HotcachePolicies, LruKeepsAReusedTokenThatFifoEvicts) {
  // hot 2 holding {0, 1}. Step 1 uses 0; step 2 brings 5: LRU evicts 1, FIFO evicts 0; step 3 uses
  // 0.
  const auto trace = trace_of({{0}, {5}, {0}});
  const auto r = analyse_policies(trace, 2);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].policy, ReplacementPolicy::lru);
  EXPECT_EQ(r[0].misses, 1);
  EXPECT_EQ(r[0].hits, 2);
  EXPECT_EQ(r[1].misses, 2);  // fifo
  EXPECT_EQ(r[3].misses, 1);  // belady
  EXPECT_DOUBLE_EQ(r[1].miss_rate(), 2.0 / 3.0);
}

TEST(HotcachePolicies, BeladyBeatsLruWhenTheFutureIsKnown) {
  // hot 2 holding {0, 1}; steps {2}, {0}, {1}. LRU: 3 misses. Belady evicts 1 (used last): 2.
  const auto trace = trace_of({{2}, {0}, {1}});
  EXPECT_EQ(simulate_policy(ReplacementPolicy::lru, trace, 2).misses, 3);
  EXPECT_EQ(simulate_policy(ReplacementPolicy::belady, trace, 2).misses, 2);
}

TEST(HotcachePolicies, ShortStepsNewestAndInvalidPositionsFollowTheSwapIn) {
  SelectionTrace t;
  t.steps.push_back({2, {0, 1, 5, -1}});   // short: 2 valid hits
  t.steps.push_back({10, {9, 7, 7, 20}});  // 9 newest hit, 7 miss once (duplicate is a hit)
  const auto s = simulate_policy(ReplacementPolicy::lru, t, 2);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(parse_policy("belady", "x"), ReplacementPolicy::belady);
  EXPECT_THROW((void)parse_policy("mru", "--policy"), Error);
}

// Positions from 2^24 up are indexed by a hash map instead of an array: a trace whose positions
// beyond the hot buffer are moved up by 2^25 (order kept, so Belady's tie-break too) must give
// the same hits and misses under every policy.
TEST(HotcachePolicies, PositionsBeyondTheArrayLimitGiveTheSameCounts) {
  Rng rng(11);
  constexpr int kHot = 24;
  constexpr std::int32_t kShift = 1 << 25;
  SelectionTrace low, high;
  for (int step = 0; step < 60; ++step) {
    const std::int64_t seq_len = 200 + step;
    V picks;
    for (int e = 0; e < 16; ++e)
      picks.push_back(static_cast<std::int32_t>(rng.below(e < 12 ? 48 : seq_len)) - (e == 0));
    picks.push_back(static_cast<std::int32_t>(seq_len - 1));  // the newest token
    V moved = picks;
    for (auto& p : moved)
      if (p >= kHot) p += kShift;
    low.steps.push_back({seq_len, picks});
    high.steps.push_back({seq_len + kShift, moved});
  }
  for (const auto policy : kReplacementPolicies) {
    const PolicyStats a = simulate_policy(policy, low, kHot, 5);
    const PolicyStats b = simulate_policy(policy, high, kHot, 5);
    EXPECT_EQ(a.misses, b.misses) << name_of(policy);
    EXPECT_EQ(a.hits, b.hits) << name_of(policy);
    EXPECT_GT(a.misses, 0) << name_of(policy);
  }
  EXPECT_EQ(largest_step_demand(low, kHot).slots, largest_step_demand(high, kHot).slots);
}

TEST(HotcachePolicies, AStepNeedingMoreSlotsThanTheBufferIsRefusedByEveryPolicy) {
  // Step 1 needs 3 slots at once (the newest token 99 needs none); hot 2 cannot serve it.
  const auto trace = trace_of({{5, 99}, {1, 2, 3, 99}});
  for (const auto policy : kReplacementPolicies)
    EXPECT_EQ(test::error_message([&] { (void)simulate_policy(policy, trace, 2); }),
              "policy analysis: trace step 1: more distinct selected positions than the 2 slots "
              "of the hot buffer; use hot >= top_k")
        << name_of(policy);
  // Hot 3 holds {0, 1, 2}: 5 evicts 0, then 1 and 2 hit and 3 misses.
  EXPECT_EQ(simulate_policy(ReplacementPolicy::lru, trace, 3).misses, 2);
  EXPECT_EQ(largest_step_demand(trace, 2).slots, 3);
  EXPECT_EQ(largest_step_demand(trace, 2).step, 1);
}

TEST(HotcachePolicies, TraceFileRoundTripAndErrors) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = dir / "hotcache_trace_test.txt";
  const auto trace = trace_of({{1, 2, 3}, {-1, 40}}, 50);
  write_selection_trace(trace, path);
  const auto back = read_selection_trace(path);
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.steps[1].seq_len, 50);
  EXPECT_EQ(back.steps[1].selected, (V{-1, 40}));
  {
    std::ofstream bad(path);
    bad << "# comment\n10: 1 2\n12: 3 x4\n";
  }
  EXPECT_EQ(test::error_message([&] { (void)read_selection_trace(path); }),
            path.string() + ":3: 'x4' is not a valid position; use decimal integers");
  {
    std::ofstream bad(path);
    bad << ": 1 2\n";  // found by tests/fuzz (selection_trace): it threw std::out_of_range
  }
  EXPECT_EQ(test::error_message([&] { (void)read_selection_trace(path); }),
            path.string() + ":1: '' is not a valid sequence length; use decimal integers");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace hisparse
