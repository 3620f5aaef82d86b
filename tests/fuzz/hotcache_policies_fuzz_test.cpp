// Random multi-step traces on the CPU: the HotCache (swap-in twin) fetches exactly the rows the
// LRU policy simulation predicts, every resident row holds its token's bytes, every output row
// holds the selected token, and Belady never misses more than any other policy. Random .npy dumps
// of top-k positions are read into streams or refused with hisparse::Error, and a study of what
// was read counts every valid entry once as a hit or a miss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "hotcache/hot_cache.hpp"
#include "hotcache/policies.hpp"
#include "hotcache/policy_study.hpp"
#include "model/npy.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

TEST(HotcacheFuzz, SwapInTwinAgreesWithLruSimulationAndKeepsRowsExact) {
  Rng rng(2024);
  for (int trial = 0; trial < 40; ++trial) {
    HotCacheConfig c;
    c.requests = 1;
    c.layers = 1;
    c.hot = 1 + static_cast<int>(rng.below(40));
    c.top_k = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(c.hot)));
    c.capacity = c.hot + 80;
    c.row_bytes = 1 + rng.below(24);
    c.backend = Backend::cpu;
    HotCache cache(c);
    for (std::int64_t t = 0; t < c.capacity; ++t)
      for (std::size_t j = 0; j < c.row_bytes; ++j)
        cache.pool().row(0, 0, t)[j] =
            static_cast<std::uint8_t>(random_bits(7, static_cast<std::uint64_t>(t) * 64 + j));
    std::int64_t seq =
        1 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(c.hot) + 10));
    cache.admit(0, seq);
    SelectionTrace trace;
    std::int64_t misses = 0;
    Stream stream(Backend::cpu);
    for (int step = 0; step < 30; ++step, ++seq) {
      if (seq > c.capacity) break;
      std::vector<std::int32_t> sel(static_cast<std::size_t>(c.top_k));
      for (auto& p : sel) {
        // Mostly recent tokens (locality), some far ones, some -1, some out of range.
        const auto u = rng.below(10);
        p = u == 0   ? -1
            : u == 1 ? static_cast<std::int32_t>(seq + 3)
            : u < 6  ? static_cast<std::int32_t>(std::max<std::int64_t>(
                          0, seq - 1 - static_cast<std::int64_t>(rng.below(8))))
                     : static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(seq)));
      }
      trace.steps.push_back({seq, sel});
      const std::int32_t seq32 = static_cast<std::int32_t>(seq), real = 1;
      std::vector<std::int32_t> out(sel.size());
      SwapInStep s{sel.data(), &seq32, false, &real, nullptr, 1, out.data()};
      misses += cache.swap_in(0, s, stream).misses;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] < 0 || sel[i] >= seq) {
          ASSERT_EQ(out[i], -1);
          continue;
        }
        ASSERT_GE(out[i], 0);
        const auto row = cache.hot_buffer().row(0, 0, out[i]);

        ASSERT_EQ(std::memcmp(row.data(), cache.pool().row(0, 0, sel[i]), c.row_bytes), 0)
            << "trial " << trial << " step " << step << " entry " << i;
      }
      // The newest token's row is appended (into the reserved slot, or slot seq-1 while short) by
      // the engine; the test plays that role for the next step.
      const auto next_newest = seq;  // token seq is the newest of step seq + 1
      if (next_newest < c.capacity) {
        const int slot = cache.hot_buffer().newest_slot(next_newest + 1);
        copy_bytes(cache.hot_buffer().layer_rows(0) +
                       static_cast<std::size_t>(slot) * cache.pool().row_stride(),
                   cache.pool().row(0, 0, next_newest), c.row_bytes, Backend::cpu);
      }
      auto order = cache.hot_buffer().lru_order(0, 0);
      std::sort(order.begin(), order.end());
      for (int s2 = 0; s2 < c.hot; ++s2)
        ASSERT_EQ(order[s2], s2) << "LRU order is not a permutation";
    }
    EXPECT_EQ(misses, simulate_policy(ReplacementPolicy::lru, trace, c.hot).misses)
        << "trial " << trial;
    const auto all = analyse_policies(trace, c.hot, 5);
    for (const auto& p : all) EXPECT_LE(all[3].misses, p.misses) << name_of(p.policy);
  }
}

TEST(HotcacheFuzz, RandomIndexDumpsAreReadOrRefusedAndEveryEntryIsCounted) {
  Rng rng(77);
  const test::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  int read = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::int64_t> shape;
    // Refused: 1 dimension, a 0 in the shape, a first length of 0, a position beyond its step.
    const auto dims = 1 + rng.below(4);
    std::int64_t elements = 1;
    for (std::uint64_t d = 0; d < dims; ++d) {
      shape.push_back(rng.below(12) == 0 ? 0 : 1 + static_cast<std::int64_t>(rng.below(4)));
      elements *= shape.back();
    }
    const auto first = rng.below(12) == 0 ? 0 : 1 + static_cast<std::int64_t>(rng.below(40));
    std::vector<std::int64_t> values(static_cast<std::size_t>(elements));
    // Mostly positions of the first step's sequence or padding; rarely one beyond any step.
    for (auto& v : values)
      v = rng.below(100) == 0
              ? first + 5
              : static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(first) + 2)) - 2;
    write_npy_integers(file, rng.below(2) ? NpyType::i32 : NpyType::i64, shape, values);
    std::vector<NamedTrace> streams;
    try {
      streams = read_selection_streams(file, first);
    } catch (const Error&) {
      ++refused;
      continue;
    }
    ++read;
    std::int64_t valid = 0;
    for (const auto& named : streams)
      for (const auto& step : named.trace.steps)
        for (const auto pos : step.selected) {
          ASSERT_LT(pos, step.seq_len);
          valid += pos >= 0 ? 1 : 0;
        }
    PolicyStudyOptions o;
    o.hots = {1 + static_cast<int>(rng.below(8)), 8};
    o.policies = {ReplacementPolicy::lru, ReplacementPolicy::belady, ReplacementPolicy::random};
    try {
      const PolicyStudy study = study_policies(streams, o);
      for (const auto& cell : study.cells) {
        EXPECT_EQ(cell.total.hits + cell.total.misses, valid);
        EXPECT_LE(study.find(cell.hot, ReplacementPolicy::belady)->total.misses, cell.total.misses);
      }
    } catch (const Error& e) {  // only a hot size below a step's demand may be refused
      EXPECT_NE(std::string(e.what()).find("slots cannot serve step"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_GT(read, 30);  // both outcomes happen often enough to mean something
  EXPECT_GT(refused, 30);
}

}  // namespace
}  // namespace hisparse
