// The swap-in contract (REFERENCE.md section 1) on the CPU twin, with hand-worked expectations.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/hotcache/swap_in.hpp"
#include "kernels/hotcache/swap_in_config.hpp"

namespace hisparse::kernels {
namespace {

std::uint8_t pool_byte(int request, std::int64_t token, std::size_t j) {
  return static_cast<std::uint8_t>(request * 131 + token * 7 + static_cast<std::int64_t>(j) * 13 +
                                   1);
}

/// Host-side state of `requests` hot buffers of one layer plus the host pool, and one step's I/O.
struct Twin {
  Twin(int requests_, int hot_, int top_k_, std::size_t row_bytes_ = 8,
       std::int64_t capacity_ = 256)
      : requests(requests_), hot(hot_), top_k(top_k_), row_bytes(row_bytes_), capacity(capacity_) {
    slot_token.assign(static_cast<std::size_t>(requests * hot), -1);
    lru.resize(slot_token.size());
    for (int r = 0; r < requests; ++r)
      std::iota(lru.begin() + r * hot, lru.begin() + (r + 1) * hot, 0);
    rows.assign(static_cast<std::size_t>(requests * (hot + 1)) * row_bytes, 0xee);
    pool.resize(static_cast<std::size_t>(requests * capacity) * row_bytes);
    for (int r = 0; r < requests; ++r)
      for (std::int64_t t = 0; t < capacity; ++t)
        for (std::size_t j = 0; j < row_bytes; ++j)
          pool[(static_cast<std::size_t>(r * capacity + t)) * row_bytes + j] = pool_byte(r, t, j);
  }
  /// Slot s of request r holds token tokens[s].
  void fill(int r, const std::vector<std::int32_t>& tokens) {
    for (int s = 0; s < hot; ++s) slot_token[static_cast<std::size_t>(r * hot + s)] = tokens[s];
  }
  std::vector<std::int32_t> slots(int r) const {
    return {slot_token.begin() + r * hot, slot_token.begin() + (r + 1) * hot};
  }
  std::vector<std::int32_t> order(int r) const {
    return {lru.begin() + r * hot, lru.begin() + (r + 1) * hot};
  }
  std::vector<std::int32_t> out(int b) const {
    return {physical.begin() + b * top_k, physical.begin() + (b + 1) * top_k};
  }
  const std::uint8_t* hot_row(int r, int slot) const {
    return rows.data() + static_cast<std::size_t>(r * (hot + 1) + slot) * row_bytes;
  }
  bool row_holds(int r, int slot, std::int64_t token) const {
    for (std::size_t j = 0; j < row_bytes; ++j)
      if (hot_row(r, slot)[j] != pool_byte(r, token, j)) return false;
    return true;
  }

  void run(const std::vector<std::int32_t>& selected, const std::vector<std::int64_t>& seq_lens,
           int num_real = -1, const std::vector<std::int32_t>& request_of_row = {},
           bool int64_lens = false) {
    const int batch = static_cast<int>(seq_lens.size());
    real = num_real < 0 ? batch : num_real;
    lens32.assign(seq_lens.begin(), seq_lens.end());
    lens64 = seq_lens;
    sel = selected;
    remap = request_of_row;
    physical.assign(static_cast<std::size_t>(batch * top_k), 12345);
    stats.assign(static_cast<std::size_t>(2 * batch), 777);
    count.assign(static_cast<std::size_t>(batch), 777);
    plan_slot.assign(static_cast<std::size_t>(batch * top_k), -7);
    plan_token.assign(plan_slot.size(), -7);
    SwapInArgs a;
    a.selected = sel.data();
    a.seq_lens = int64_lens ? static_cast<const void*>(lens64.data()) : lens32.data();
    a.seq_lens_int64 = int64_lens;
    a.num_real = &real;
    a.request_of_row = remap.empty() ? nullptr : remap.data();
    a.hot_buffer = {slot_token.data(), lru.data(), rows.data(), row_bytes};
    a.host_pool = {pool.data(), static_cast<std::size_t>(capacity) * row_bytes, row_bytes};
    a.copy_bytes = row_bytes;
    a.physical_rows = physical.data();
    a.stats = stats.data();
    a.plan = {count.data(), plan_slot.data(), plan_token.data()};
    if (!resident.empty()) {  // the residency bitmap and entry slots are kept
      entry_slot.assign(plan_slot.size(), 99);
      a.plan.entry_slot = entry_slot.data();
      a.hot_buffer.resident = resident.data();
      a.hot_buffer.resident_words = resident.size() / static_cast<std::size_t>(requests);
    }
    a.batch = batch;
    a.top_k = top_k;
    a.hot = hot;
    swap_in_ref(a);
  }

  int requests, hot, top_k;
  std::size_t row_bytes;
  std::int64_t capacity;
  std::vector<std::int32_t> slot_token, lru, physical, stats, count, plan_slot, plan_token, sel,
      remap, lens32;
  std::vector<std::int64_t> lens64;
  std::vector<std::uint8_t> rows, pool;
  std::vector<std::int32_t> entry_slot;
  std::vector<std::uint32_t> resident;  ///< [requests][words]; empty: not kept
  std::int32_t real = 0;
};

using V = std::vector<std::int32_t>;

TEST(HotcacheSwapInRef, HitsRefreshLruWithoutIo) {
  Twin t(1, 4, 2);
  t.fill(0, {10, 11, 12, 13});
  const auto rows_before = t.rows;
  t.run({11, 12}, {100});
  EXPECT_EQ(t.out(0), (V{1, 2}));
  EXPECT_EQ(t.order(0), (V{0, 3, 1, 2}));  // REFERENCE.md's worked example
  EXPECT_EQ(t.slots(0), (V{10, 11, 12, 13}));
  EXPECT_EQ(t.rows, rows_before);
  EXPECT_EQ(t.stats, (V{2, 0}));
  EXPECT_EQ(t.count, (V{0}));
}

TEST(HotcacheSwapInRef, ResidencyBitmapAndEntrySlotsFollowTheMisses) {
  Twin t(1, 4, 5);
  t.fill(0, {10, 11, 12, 13});
  t.resident = {(1u << 10) | (1u << 11) | (1u << 12) | (1u << 13), 0u};  // tokens 0..63
  // 99 is the newest, 11 a hit; misses 50 (first at entry 0, again at 3) and 60 take the
  // evictable slots 0 and 2 (LRU order 0, 2, 3): tokens 10 and 12 leave, 50 and 60 arrive.
  t.run({50, 11, 60, 50, 99}, {100});
  EXPECT_EQ(t.entry_slot, (V{0, -1, 2, -1, -1}));  // first occurrences of misses only
  EXPECT_EQ(t.resident, (std::vector<std::uint32_t>{(1u << 11) | (1u << 13),
                                                    (1u << (50 - 32)) | (1u << (60 - 32))}));
  t.run({50, 11, 60, 50, 99}, {100}, 0);  // a padding row: every entry -1, the bitmap kept
  EXPECT_EQ(t.entry_slot, (V{-1, -1, -1, -1, -1}));
  EXPECT_EQ(t.resident[1], (1u << (50 - 32)) | (1u << (60 - 32)));
  t.run({70, 1, 2, -1, 99}, {4});  // a short row (seq_len <= hot): no misses, nothing changes
  EXPECT_EQ(t.entry_slot, (V{-1, -1, -1, -1, -1}));
  EXPECT_EQ(t.resident[0], (1u << 11) | (1u << 13));
}

TEST(HotcacheSwapInRef, HitsKeepTheirPreviousRelativeOrder) {
  Twin t(1, 4, 2);
  t.fill(0, {10, 11, 12, 13});
  t.lru = {2, 0, 3, 1};
  t.run({11, 12}, {100});  // hits on slots 1 and 2; previous order puts 2 before 1
  EXPECT_EQ(t.order(0), (V{0, 3, 2, 1}));
}

TEST(HotcacheSwapInRef, MissesTakeOldestEvictableSlotsInMissOrder) {
  Twin t(1, 4, 3);
  t.fill(0, {10, 11, 12, 13});
  t.run({50, 11, 60}, {100});
  // Slot 1 is a hit; evictable in LRU order: 0, 2, 3. Miss 50 -> slot 0, miss 60 -> slot 2.
  EXPECT_EQ(t.out(0), (V{0, 1, 2}));
  EXPECT_EQ(t.slots(0), (V{50, 11, 60, 13}));
  EXPECT_EQ(t.order(0), (V{3, 0, 2, 1}));  // untouched, misses, hits
  EXPECT_TRUE(t.row_holds(0, 0, 50));
  EXPECT_TRUE(t.row_holds(0, 2, 60));
  EXPECT_EQ(t.hot_row(0, 1)[0], 0xee);  // hit rows untouched
  EXPECT_EQ(t.stats, (V{1, 2}));
  EXPECT_EQ(t.count, (V{2}));
  EXPECT_EQ(t.plan_slot[0], 0);
  EXPECT_EQ(t.plan_token[0], 50);
  EXPECT_EQ(t.plan_slot[1], 2);
  EXPECT_EQ(t.plan_token[1], 60);
}

TEST(HotcacheSwapInRef, NewestTokenIsAHitInTheReservedSlot) {
  Twin t(1, 4, 2);
  t.fill(0, {10, 11, 12, 13});
  t.run({99, 10}, {100});
  EXPECT_EQ(t.out(0), (V{4, 0}));  // reserved slot index == hot
  EXPECT_EQ(t.order(0), (V{1, 2, 3, 0}));
  EXPECT_EQ(t.stats, (V{2, 0}));
  EXPECT_EQ(t.rows[4 * 8], 0xee);  // the reserved row is the appender's, never written here
}

TEST(HotcacheSwapInRef, RequestIndexRemapping) {
  Twin t(3, 2, 2);
  t.fill(0, {1, 2});
  t.fill(1, {5, 6});
  t.fill(2, {7, 8});
  // Row 0 serves request 2, row 1 serves request 0; request 1 is not in the batch.
  t.run({8, 40, 2, -1}, {50, 60}, -1, {2, 0});
  EXPECT_EQ(t.out(0), (V{2 * 3 + 1, 2 * 3 + 0}));
  EXPECT_EQ(t.out(1), (V{0 * 3 + 1, -1}));
  EXPECT_EQ(t.slots(2), (V{40, 8}));
  EXPECT_TRUE(t.row_holds(2, 0, 40));
  EXPECT_EQ(t.slots(1), (V{5, 6}));
  EXPECT_EQ(t.order(1), (V{0, 1}));
  EXPECT_EQ(t.order(0), (V{0, 1}));
  EXPECT_EQ(t.order(2), (V{0, 1}));  // untouched: none; miss slot 0; hit slot 1
}

TEST(HotcacheSwapInRef, AllHitsAndAllMisses) {
  Twin t(1, 4, 4);
  t.fill(0, {10, 11, 12, 13});
  t.run({13, 12, 11, 10}, {100});
  EXPECT_EQ(t.out(0), (V{3, 2, 1, 0}));
  EXPECT_EQ(t.order(0), (V{0, 1, 2, 3}));
  EXPECT_EQ(t.stats, (V{4, 0}));
  t.lru = {3, 1, 0, 2};
  t.run({20, 21, 22, 23}, {100});
  EXPECT_EQ(t.out(0), (V{3, 1, 0, 2}));
  EXPECT_EQ(t.slots(0), (V{22, 21, 23, 20}));
  EXPECT_EQ(t.order(0), (V{3, 1, 0, 2}));
  for (int s = 0; s < 4; ++s) EXPECT_TRUE(t.row_holds(0, s, t.slots(0)[s])) << s;
  EXPECT_EQ(t.stats, (V{0, 4}));
}

TEST(HotcacheSwapInRef, EmptyBufferFillsSlotsInLruOrder) {
  Twin t(1, 4, 3);
  t.lru = {2, 3, 0, 1};
  t.run({7, -1, 9}, {30});
  EXPECT_EQ(t.out(0), (V{2, -1, 3}));
  EXPECT_EQ(t.slots(0), (V{-1, -1, 7, 9}));
  EXPECT_EQ(t.order(0), (V{0, 1, 2, 3}));
  EXPECT_TRUE(t.row_holds(0, 2, 7));
  EXPECT_TRUE(t.row_holds(0, 3, 9));
}

TEST(HotcacheSwapInRef, ShortSequencesAtAndAroundHot) {
  for (std::int64_t seq : {3, 4}) {  // seq_len <= hot: token t in slot t, nothing changes
    Twin t(1, 4, 3);
    t.fill(0, {0, 1, 2, 3});
    t.lru = {1, 0, 3, 2};
    const auto rows_before = t.rows;
    t.run({static_cast<std::int32_t>(seq - 1), 0, 2}, {seq});
    EXPECT_EQ(t.out(0), (V{static_cast<std::int32_t>(seq - 1), 0, 2})) << seq;
    EXPECT_EQ(t.order(0), (V{1, 0, 3, 2})) << seq;
    EXPECT_EQ(t.slots(0), (V{0, 1, 2, 3})) << seq;
    EXPECT_EQ(t.rows, rows_before);
    EXPECT_EQ(t.stats, (V{3, 0}));
  }
  Twin t(1, 4, 3);  // seq_len = hot + 1: the first long step, newest in the reserved slot
  t.fill(0, {0, 1, 2, 3});
  t.run({4, 0, 2}, {5});
  EXPECT_EQ(t.out(0), (V{4, 0, 2}));
  EXPECT_EQ(t.order(0), (V{1, 3, 0, 2}));
}

TEST(HotcacheSwapInRef, SeqLenZeroAndPositionsOutOfRangeGiveMinusOne) {
  Twin t(2, 4, 3);
  t.fill(1, {10, 11, 12, 13});
  t.run({0, 1, -1, 10, 200, -5}, {0, 100});
  EXPECT_EQ(t.out(0), (V{-1, -1, -1}));
  EXPECT_EQ(t.out(1), (V{5 + 0, -1, -1}));
  EXPECT_EQ(t.stats, (V{0, 0, 1, 0}));
}

TEST(HotcacheSwapInRef, ZeroRealRequestsTouchNothing) {
  Twin t(2, 4, 2);
  t.fill(0, {10, 11, 12, 13});
  const auto slots = t.slot_token;
  const auto lru = t.lru;
  const auto rows = t.rows;
  t.run({50, 60, 70, 80}, {100, 100}, 0);
  EXPECT_EQ(t.physical, (V{-1, -1, -1, -1}));
  EXPECT_EQ(t.slot_token, slots);
  EXPECT_EQ(t.lru, lru);
  EXPECT_EQ(t.rows, rows);
  EXPECT_EQ(t.stats, (V{0, 0, 0, 0}));
  EXPECT_EQ(t.count, (V{0, 0}));
  t.run({50, 60, 70, 80}, {100, 100}, 1);  // only row 0 is real
  EXPECT_EQ(t.out(1), (V{-1, -1}));
  EXPECT_EQ(t.slots(0), (V{50, 60, 12, 13}));
  EXPECT_EQ(t.slots(1), (V{-1, -1, -1, -1}));
}

TEST(HotcacheSwapInRef, TopKOneHotOne) {
  Twin t(1, 1, 1);
  t.run({3}, {10});
  EXPECT_EQ(t.out(0), (V{0}));
  EXPECT_EQ(t.slots(0), (V{3}));
  t.run({3}, {10});
  EXPECT_EQ(t.stats, (V{1, 0}));
  t.run({9}, {10});  // newest
  EXPECT_EQ(t.out(0), (V{1}));
  EXPECT_EQ(t.slots(0), (V{3}));
  t.run({4}, {10});
  EXPECT_EQ(t.slots(0), (V{4}));
  EXPECT_TRUE(t.row_holds(0, 0, 4));
}

TEST(HotcacheSwapInRef, DuplicatedPositionsShareOneRowAndOneFetch) {
  Twin t(1, 4, 4);
  t.fill(0, {10, 11, 12, 13});
  t.run({50, 11, 50, 11}, {100});
  EXPECT_EQ(t.out(0), (V{0, 1, 0, 1}));
  EXPECT_EQ(t.count, (V{1}));
  EXPECT_EQ(t.stats, (V{3, 1}));
  EXPECT_EQ(t.order(0), (V{2, 3, 0, 1}));
}

TEST(HotcacheSwapInRef, Int64SequenceLengths) {
  Twin t(1, 4, 2);
  t.fill(0, {10, 11, 12, 13});
  t.run({11, 40}, {std::int64_t{3'000'000'000} / 30'000'000}, -1, {}, true);  // seq 100
  EXPECT_EQ(t.out(0), (V{1, 0}));
  EXPECT_EQ(t.slots(0), (V{40, 11, 12, 13}));
}

TEST(HotcacheSwapInRef, RepeatedReplacementOverSteps) {
  Twin t(1, 3, 2);
  t.fill(0, {0, 1, 2});
  // step 1 (seq 10): 5 miss -> slot 0; 1 hit. order [2, 0, 1]
  t.run({5, 1}, {10});
  EXPECT_EQ(t.out(0), (V{0, 1}));
  EXPECT_EQ(t.order(0), (V{2, 0, 1}));
  // step 2 (seq 11): 6 miss -> slot 2 (oldest); 5 hit. order [1, 2, 0]
  t.run({6, 5}, {11});
  EXPECT_EQ(t.out(0), (V{2, 0}));
  EXPECT_EQ(t.order(0), (V{1, 2, 0}));
  // step 3 (seq 12): 10 (was newest at step 2, now a normal token) miss -> slot 1; 11 newest.
  t.run({10, 11}, {12});
  EXPECT_EQ(t.out(0), (V{1, 3}));
  EXPECT_EQ(t.slots(0), (V{5, 10, 6}));
  EXPECT_EQ(t.order(0), (V{2, 0, 1}));
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(t.row_holds(0, s, t.slots(0)[s])) << s;
}

TEST(HotcacheSwapInRef, ByteExactRefetchForOddRowSizes) {
  for (std::size_t bytes : {1, 7, 15, 20, 584, 656, 1028, 1152}) {
    Twin t(2, 3, 2, bytes, 64);
    t.run({17, 40, 63, 2}, {64, 64});
    EXPECT_TRUE(t.row_holds(0, 0, 17)) << bytes;
    EXPECT_TRUE(t.row_holds(0, 1, 40)) << bytes;
    EXPECT_TRUE(t.row_holds(1, 0, 2)) << bytes;
    EXPECT_EQ(t.out(1), (V{4 + 3, 4 + 0}));  // request 1: newest in slot 3, token 2 in slot 0
    // Bytes just past each copied row are untouched.
    EXPECT_EQ(t.hot_row(0, 1)[bytes], 0xee) << bytes;
  }
}

TEST(HotcacheSwapInRef, SharedMemoryFootprintMatchesTheKnownDesignPoints) {
  EXPECT_EQ(swap_in_hash_capacity(1), 32);
  EXPECT_EQ(swap_in_hash_capacity(2048), 4096);
  EXPECT_EQ(swap_in_hash_capacity(2049), 8192);
  EXPECT_LE(swap_in_shared_bytes(2048, 4096), 48u * 1024);
  EXPECT_GT(swap_in_shared_bytes(2048, 8192), 48u * 1024);  // needs the dynamic opt-in
  EXPECT_LE(swap_in_shared_bytes(8192, 32768), 227u * 1024);
}

TEST(HotcacheSwapInRef, DirectPathWidensTheSelectionTableAndAddsThePlanEntries) {
  // 32768 tokens x 4 B replace the 4096-entry hash (32 KB) at the benchmark's design point, and
  // 2 B per selection entry hold each miss's plan entry (the early hand-off lists tokens before
  // numbering them); the rest of the layout is unchanged, and it stays under the sm_90 opt-in
  // limit.
  EXPECT_EQ(swap_in_config::kResolveDirectTokens, 32768);
  EXPECT_EQ(swap_in_direct_shared_bytes(2048, 4096) - swap_in_shared_bytes(2048, 4096),
            131072u - 32768u + 2u * 2048u);
  EXPECT_LE(swap_in_direct_shared_bytes(2048, 8192),
            static_cast<std::size_t>(swap_in_config::kMaxResolveSharedBytes));
  // A hash at least as large as the direct table (16384 entries x 8 B): only the entries.
  EXPECT_EQ(swap_in_direct_shared_bytes(8192, 32768) - swap_in_shared_bytes(8192, 32768),
            2u * 8192u);
  EXPECT_EQ(swap_in_direct_shared_bytes(16384, 16384) - swap_in_shared_bytes(16384, 16384),
            2u * 16384u);
  EXPECT_STREQ(swap_in_phase_name(3), "build");
  EXPECT_STREQ(swap_in_phase_name(kSwapInPhaseStamps - 1), "commit");
  EXPECT_STREQ(swap_in_phase_name(kSwapInPhaseStamps), "?");
  EXPECT_STREQ(resolve_path_name(ResolvePath::direct_compact), "direct_compact");
  EXPECT_STREQ(resolve_path_name(ResolvePath::hash), "hash");
  for (const ResolvePath path : kResolvePaths)
    EXPECT_EQ(resolve_path_named(resolve_path_name(path)), path) << resolve_path_name(path);
  EXPECT_EQ(resolve_path_named("compact"), std::nullopt);
  EXPECT_EQ(resolve_path_named("?"), std::nullopt);
}

}  // namespace
}  // namespace hisparse::kernels
