// The CUDA swap-in against its CPU twin, byte for byte: physical rows, per-row stats, miss plan,
// slot tables, LRU orders and every hot-buffer byte, over thousands of random multi-step sequences
// (random seq_len, top_k, hot, row sizes, padding rows, request remapping, int32/int64 lengths,
// duplicates, -1 and out-of-range selections), launched directly and replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "hotcache/hot_cache.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "support/gpu.hpp"
#include "support/swap_in_harness.hpp"

namespace hisparse {
namespace {

#if HISPARSE_WITH_CUDA
using kernels::SwapInArgs;
using test::capture_and_replay;
using test::describe;
using test::download;
using test::Harness;
using test::random_shape;
using test::run_steps;
using test::Shape;
using test::two_rows;
using test::upload;
#endif

TEST(HotcacheSwapInGpu, WorkedLruExampleAndMisses) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // Request 0, hot 4, slots hold 10..13, LRU 0..3. Hits on 11, 12 and misses 50, 60.
  const int hot = 4, top_k = 4;
  auto pool = Allocation::pinned(200 * 16, Backend::cuda, "pool");
  auto* pp = static_cast<std::uint8_t*>(pool.host_data());
  for (int i = 0; i < 200 * 16; ++i) pp[i] = static_cast<std::uint8_t>(i / 16);
  auto slot = Buffer<std::int32_t>::device(hot, Backend::cuda, "slot");
  auto lru = Buffer<std::int32_t>::device(hot, Backend::cuda, "lru");
  auto rows = Buffer<std::uint8_t>::device((hot + 1) * 16, Backend::cuda, "rows");
  auto sel = Buffer<std::int32_t>::device(top_k, Backend::cuda, "sel");
  auto lens = Buffer<std::int32_t>::device(1, Backend::cuda, "lens");
  auto real = Buffer<std::int32_t>::device(1, Backend::cuda, "real");
  auto out = Buffer<std::int32_t>::device(top_k, Backend::cuda, "out");
  auto count = Buffer<std::int32_t>::device(1, Backend::cuda, "count");
  auto ps = Buffer<std::int32_t>::device(top_k, Backend::cuda, "ps");
  auto pt = Buffer<std::int32_t>::device(top_k, Backend::cuda, "pt");
  upload(slot, {10, 11, 12, 13});
  upload(lru, {0, 1, 2, 3});
  upload(lens, {100});
  upload(real, {1});
  SwapInArgs a;
  a.selected = sel.device_data();
  a.seq_lens = lens.device_data();
  a.num_real = real.device_data();
  a.hot_buffer = {slot.device_data(), lru.device_data(), rows.device_data(), 16};
  a.host_pool = {static_cast<const std::uint8_t*>(pool.device_data()), 0, 16};
  a.copy_bytes = 16;
  a.physical_rows = out.device_data();
  a.plan = {count.device_data(), ps.device_data(), pt.device_data()};
  a.batch = 1;
  a.top_k = 2;
  a.hot = hot;
  upload(sel, {11, 12, -1, -1});
  kernels::launch_swap_in(a, nullptr);
  HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(download(lru), (std::vector<std::int32_t>{0, 3, 1, 2}));
  EXPECT_EQ(download(out)[0], 1);
  EXPECT_EQ(download(out)[1], 2);
  a.top_k = 4;
  upload(sel, {50, 11, 60, 99});
  kernels::launch_swap_in(a, nullptr);
  HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
  // Hits 11 (slot 1) and 99 (newest, slot 4); evictable in LRU order [0, 3, 2]: 50 -> 0, 60 -> 3.
  EXPECT_EQ(download(out), (std::vector<std::int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(download(slot), (std::vector<std::int32_t>{50, 11, 12, 60}));
  EXPECT_EQ(download(lru), (std::vector<std::int32_t>{2, 0, 3, 1}));
  const auto r = download(rows);
  EXPECT_EQ(r[0], 50);
  EXPECT_EQ(r[3 * 16 + 15], 60);
  upload(real, {0});  // zero real requests: -1 and nothing touched
  kernels::launch_swap_in(a, nullptr);
  HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(download(out), (std::vector<std::int32_t>{-1, -1, -1, -1}));
  EXPECT_EQ(download(lru), (std::vector<std::int32_t>{2, 0, 3, 1}));
#endif
}

#if HISPARSE_WITH_CUDA
/// 120 random shapes x 20 steps = 2,400 steps on one resolve path.
void random_multi_step_sequences(kernels::ResolvePath resolve) {
  Rng rng(77);
  int fetched_rows = 0;
  for (int config = 0; config < 120; ++config) {
    Shape s = random_shape(rng);
    s.resolve = resolve;
    Harness h(s, 1000 + static_cast<std::uint64_t>(config));
    run_steps(h, 20, "config " + std::to_string(config));
    if (::testing::Test::HasFatalFailure()) return;
    fetched_rows += h.fetched_rows();
  }
  // Rows with few misses (and 16-B rows) are fetched by the resolve block (MissPlan::fetched):
  // make sure the random shapes reached that path, so the comparisons above covered it.
  EXPECT_GT(fetched_rows, 0);
}
#endif

TEST(HotcacheSwapInGpu, RandomMultiStepSequencesMatchTheTwinByteForByte) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  random_multi_step_sequences(kernels::ResolvePath::direct);
#endif
}

TEST(HotcacheSwapInGpu, RandomMultiStepSequencesOnTheCompactDirectResolveMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The compact kernels where the lean path can run (one-tile selections without the resolve's
  // own fetch); the other shapes take the inlined kernel. DirectResolveFallsBackToTheHashFor-
  // LongSequences reaches the compact kernels' called general path.
  random_multi_step_sequences(kernels::ResolvePath::direct_compact);
#endif
}

TEST(HotcacheSwapInGpu, CompactResolveKernelOnlyWhereTheLeanPathCanRun) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The design point (top_k 2048, hot 4096, 656-B rows): the compact kernel of 4 slots per
  // thread, of 8 with hot 6144; the inlined kernel on `direct`, with a two-tile selection, a hot
  // buffer of three tiles, and where the resolve fetches the misses itself (batch 1, no bitmap).
  Shape s;
  s.requests = s.batch = 1;
  s.top_k = 2048;
  s.hot = 4096;
  s.row_bytes = s.row_stride = 656;
  s.capacity = 32768;
  s.fetch_in_resolve = false;
  auto kernel = [&s](kernels::ResolvePath resolve, int top_k, int hot, bool fetch) {
    Shape t = s;
    t.resolve = resolve;
    t.top_k = top_k;
    t.hot = hot;
    t.fetch_in_resolve = fetch;
    Harness h(t, 5);
    return kernels::swap_in_resolve_kernel(h.args(true));
  };
  using kernels::ResolvePath;
  EXPECT_EQ(kernel(ResolvePath::direct_compact, 2048, 4096, false), "swap_in_resolve_compact<4>");
  EXPECT_EQ(kernel(ResolvePath::direct_compact, 2048, 6144, false), "swap_in_resolve_compact<8>");
  EXPECT_EQ(kernel(ResolvePath::direct, 2048, 4096, false), "swap_in_resolve");
  EXPECT_EQ(kernel(ResolvePath::direct_compact, 4100, 4100, false), "swap_in_resolve");
  EXPECT_EQ(kernel(ResolvePath::direct_compact, 2048, 12288, false), "swap_in_resolve");
  EXPECT_EQ(kernel(ResolvePath::direct_compact, 2048, 4096, true), "swap_in_resolve");
  // direct takes the compact kernel only when every row is known to fit the direct table
  // (SwapInArgs::max_seq_len, HotCache's capacity), and stays exact there.
  auto bounded = [&s](std::int64_t max_seq_len) {
    Shape t = s;
    t.max_seq_len = max_seq_len;
    return t;
  };
  for (const auto& [max_seq_len, name] :
       {std::pair<std::int64_t, const char*>{32768, "swap_in_resolve_compact<4>"},
        {32769, "swap_in_resolve"},
        {0, "swap_in_resolve"}}) {
    Harness h(bounded(max_seq_len), 5);
    EXPECT_EQ(kernels::swap_in_resolve_kernel(h.args(true)), name) << max_seq_len;
  }
  Harness h(bounded(32768), 77);
  run_steps(h, 6, "direct with rows bounded by the direct table");
#endif
}

TEST(HotcacheSwapInGpu, RandomMultiStepSequencesOnTheGeneralDirectResolveMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The same shapes with the lean one-tile path off: the general code keeps its coverage.
  random_multi_step_sequences(kernels::ResolvePath::direct_general);
#endif
}

TEST(HotcacheSwapInGpu, RandomMultiStepSequencesOnTheHashResolveMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  random_multi_step_sequences(kernels::ResolvePath::hash);
#endif
}

TEST(HotcacheSwapInGpu, DirectResolveFallsBackToTheHashForLongSequences) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // Sequences of up to 70,000 tokens: rows longer than kResolveDirectTokens (32768) hash their
  // selection, shorter ones use the direct table, in the same launch; every path and the
  // benchmark's design point (top_k 2048, hot 4096) against the twin. On direct_compact the long
  // rows call the general path from the compact kernel of 4 (hot 128, 4096) or 8 slots (6144).
  struct Size {
    int top_k, hot;
  };
  for (auto resolve : {kernels::ResolvePath::direct, kernels::ResolvePath::direct_compact,
                       kernels::ResolvePath::hash}) {
    for (const auto [top_k, hot] : {Size{64, 128}, Size{2048, 4096}, Size{2048, 6144}}) {
      Shape s;
      s.requests = 6;
      s.batch = 5;
      s.top_k = top_k;
      s.hot = hot;
      s.row_bytes = s.row_stride = 16;
      s.capacity = 70000;
      s.resolve = resolve;
      // The resolve's own fetch sends every row to the general path, so the compact kernel would
      // not be chosen.
      s.fetch_in_resolve = resolve != kernels::ResolvePath::direct_compact;
      Harness h(s, 4242 + static_cast<std::uint64_t>(top_k + hot));
      if (resolve == kernels::ResolvePath::direct_compact) {
        ASSERT_EQ(kernels::swap_in_resolve_kernel(h.args(true)),
                  hot <= 4096 ? "swap_in_resolve_compact<4>" : "swap_in_resolve_compact<8>");
      }
      run_steps(h, 12,
                std::string("long sequences ") + kernels::resolve_path_name(resolve) + " top_k " +
                    std::to_string(top_k) + " hot " + std::to_string(hot));
      if (HasFatalFailure()) return;
    }
  }
#endif
}

TEST(HotcacheSwapInGpu, LargeSelectionNeedsTheSharedMemoryOptIn) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // Both with the copy kernel waiting for the resolve grid and with the early hand-off
  // (MissPlan::ready: the copy gathers each row as soon as its tokens are numbered).
  for (int hot : {4096, 8192})
    for (bool early : {false, true}) {
      Shape s;
      s.requests = 4;
      s.batch = 3;
      s.top_k = 2048;
      s.hot = hot;
      s.row_bytes = s.row_stride = 656;
      s.capacity = hot + 3 * 2048 + 64;
      s.early_handoff = early;
      Harness h(s, 5 + static_cast<std::uint64_t>(hot));
      run_steps(h, 6, "hot " + std::to_string(hot) + (early ? " early" : ""));
      if (HasFatalFailure()) return;
    }
  Shape wide;  // batch 100: the copy kernel's chunk prefix spans several warp iterations
  wide.requests = 130;
  wide.batch = 100;
  wide.top_k = 65;
  wide.hot = 200;
  wide.row_bytes = wide.row_stride = 1152;
  wide.capacity = 600;
  Harness h(wide, 99);
  run_steps(h, 8, "batch 100");
#endif
}

TEST(HotcacheSwapInGpu, TwoTileHotBuffersOnTheLeanPathMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // Hot buffers of 4097-8192 slots (SGLang's 6144 default among them) with a one-tile selection
  // take the lean resolve with 8 slots per thread: random shapes around the tile edges, with and
  // without the early hand-off, the speculative gather and the resolve's own fetch (which sends a
  // row back to the general path), against the twin over several steps; on direct (both lean
  // instances in one kernel) and direct_compact (the 8-slot compact kernel).
  Rng rng(8192);
  static const int kHot[] = {4097, 4127, 4135, 6144, 8191, 8192};
  static const int kTopK[] = {1, 33, 2048, 4096};
  static const std::size_t kRows[] = {7, 584, 656, 1152};
  for (int config = 0; config < 16; ++config) {
    Shape s;
    s.requests = 1 + static_cast<int>(rng.below(5));
    s.batch = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(s.requests)));
    s.hot = kHot[rng.below(6)];
    s.top_k = kTopK[rng.below(4)];
    s.row_bytes = s.row_stride = kRows[rng.below(4)];
    s.capacity = s.hot + 3 * s.top_k + 64;
    s.fetch_in_resolve = rng.below(4) == 0;
    s.early_handoff = rng.below(2) == 0;
    s.speculate = rng.below(2) == 0;
    for (auto resolve : {kernels::ResolvePath::direct, kernels::ResolvePath::direct_compact}) {
      s.resolve = resolve;
      Harness h(s, 300 + static_cast<std::uint64_t>(config));
      run_steps(h, 6,
                std::string("two tiles, ") + kernels::resolve_path_name(resolve) + ", config " +
                    std::to_string(config));
      if (HasFatalFailure()) return;
    }
  }
#endif
}

TEST(HotcacheSwapInGpu, SpeculativeGatherMatchesTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The design point (top_k 2048, hot 4096, 656-B rows) at batch 1-8, where the early hand-off
  // lets the copy kernel load the rows the residency bitmap calls not resident before the
  // resolve has found the misses; then a correct bitmap (every guess right) and a scrambled one
  // (guesses wrong both ways: rows loaded for hits, misses fetched late) give the same bytes.
  auto design_point = [](int batch, int copy_blocks, kernels::ResolvePath resolve) {
    Shape s;
    s.resolve = resolve;
    s.requests = batch + 1;
    s.batch = batch;
    s.top_k = 2048;
    s.hot = 4096;
    s.row_bytes = s.row_stride = 656;
    s.capacity = s.hot + 3 * s.top_k + 64;
    s.early_handoff = s.speculate = true;
    s.copy_blocks = copy_blocks;
    return s;
  };
  for (auto resolve : {kernels::ResolvePath::direct, kernels::ResolvePath::direct_compact,
                       kernels::ResolvePath::direct_general})
    for (int batch : {1, 3, 7, 8})  // 8: the largest speculative batch
      for (bool scramble : {false, true}) {
        Harness h(design_point(batch, 0, resolve), 60 + static_cast<std::uint64_t>(batch));
        run_steps(h, 5,
                  "batch " + std::to_string(batch) + " " + kernels::resolve_path_name(resolve) +
                      (scramble ? " scrambled hint" : ""),
                  scramble);
        if (HasFatalFailure()) return;
      }
  // A copy grid smaller than the batch cannot give every row a block: the plain early hand-off
  // runs instead (2 blocks); with one block per row (5), each block takes its row's whole
  // selection in passes of 128 entries.
  for (int blocks : {2, 5}) {
    Harness h(design_point(5, blocks, kernels::ResolvePath::direct),
              90 + static_cast<std::uint64_t>(blocks));
    run_steps(h, 4, "copy blocks " + std::to_string(blocks), true);
    if (HasFatalFailure()) return;
  }
  Rng rng(123);  // random shapes with the speculative gather on, the hint scrambled every step
  for (int config = 0; config < 40; ++config) {
    Shape s = random_shape(rng);
    s.early_handoff = s.speculate = true;
    s.resolve = kernels::kResolvePaths[config % std::size(kernels::kResolvePaths)];
    Harness h(s, 700 + static_cast<std::uint64_t>(config));
    run_steps(h, 8, "random config " + std::to_string(config), config % 2 == 1);
    if (HasFatalFailure()) return;
  }
#endif
}

TEST(HotcacheSwapInGpu, SelectionsAndHotBuffersWiderThanOneTileMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The resolve kernel works in tiles of 4096 entries (1024 threads x 4): top_k 4100 and hot 9000
  // take two and three tiles, with partial last tiles.
  Shape s = two_rows(4100, 9000);
  for (int sort : {0, 1}) {
    s.sort_misses_from = sort;
    Harness h(s, 31 + static_cast<std::uint64_t>(sort));
    run_steps(h, 4, "two tiles, sort " + std::to_string(sort));
    if (HasFatalFailure()) return;
  }
#endif
}

TEST(HotcacheSwapInGpu, GroupedPlanWalksTheHostRegionInAddressBuckets) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // With sort_misses_from 1 each row's plan is grouped in buckets of 2^shift tokens, where shift
  // is the smallest with (seq_len - 1) >> shift < kSwapInBuckets: buckets never decrease.
  Shape s;
  s.requests = 4;
  s.batch = 4;
  s.top_k = 512;
  s.hot = 1024;
  s.row_bytes = s.row_stride = 64;
  s.capacity = 40000;
  s.sort_misses_from = 1;
  Harness h(s, 8);
  Stream stream(Backend::cuda);
  h.make_step(s.batch);
  h.upload_inputs();
  const auto a = h.args(true);
  kernels::launch_swap_in(a, stream.native());
  stream.synchronize();
  h.run_twin();
  h.expect_equal("grouped");
  if (HasFatalFailure()) return;
  std::vector<std::int32_t> count(static_cast<std::size_t>(s.batch)), token(512 * 4);
  std::vector<std::int64_t> lens(static_cast<std::size_t>(s.batch));
  copy_bytes(count.data(), a.plan.count, count.size() * 4, Backend::cuda);
  copy_bytes(token.data(), a.plan.token, token.size() * 4, Backend::cuda);
  copy_bytes(lens.data(), a.seq_lens, lens.size() * 8 / (s.int64_lens ? 1 : 2), Backend::cuda);
  int grouped_rows = 0;
  for (int b = 0; b < s.batch; ++b) {
    const std::int64_t seq = s.int64_lens ? lens[static_cast<std::size_t>(b)]
                                          : reinterpret_cast<const std::int32_t*>(lens.data())[b];
    int shift = 0;
    while (((seq - 1) >> shift) >= kernels::kSwapInBuckets) ++shift;
    for (int m = 1; m < count[static_cast<std::size_t>(b)]; ++m)
      ASSERT_LE(token[static_cast<std::size_t>(b * 512 + m - 1)] >> shift,
                token[static_cast<std::size_t>(b * 512 + m)] >> shift)
          << "row " << b << " entry " << m;
    grouped_rows += count[static_cast<std::size_t>(b)] > 8 ? 1 : 0;
  }
  EXPECT_GT(grouped_rows, 0) << "no row had enough misses to check the grouping";
#endif
}

TEST(HotcacheSwapInGpu, CudaGraphReplayMatchesTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  Rng rng(9);
  for (int config = 0; config < 12; ++config) {
    Shape s = random_shape(rng);
    s.resolve = kernels::kResolvePaths[config % std::size(kernels::kResolvePaths)];
    Harness h(s, 500 + static_cast<std::uint64_t>(config));
    kernels::configure_swap_in(s.top_k, s.hot);  // not allowed while capturing
    capture_and_replay(h, rng, 25, "graph config " + std::to_string(config));
    if (HasFatalFailure()) return;
    EXPECT_TRUE(h.pool_unchanged());
  }
#endif
}

TEST(HotcacheSwapInGpu, ConfiguringASmallerShapeKeepsTheLargerSharedMemoryLimit) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  // The kernels' limits are remembered per device and never lowered (allow_dynamic_shared): a
  // graph captured for top_k 2048 / hot 8192 still launches after a small shape was configured.
  const Shape s = two_rows(2048, 8192);
  Harness h(s, 77);
  kernels::configure_swap_in(s.top_k, s.hot);
  kernels::configure_swap_in(16, 32);
  Rng rng(78);
  capture_and_replay(h, rng, 6, "after a smaller configure");
  if (HasFatalFailure()) return;
  EXPECT_TRUE(h.pool_unchanged());
#endif
}

void hot_cache_on_cuda_matches_cpu([[maybe_unused]] kernels::ResolvePath resolve) {
#if HISPARSE_WITH_CUDA
  HotCacheConfig c;
  c.resolve = resolve;
  c.requests = 3;
  c.layers = 2;
  c.capacity = 600;
  c.row_bytes = 584;
  c.padding = RowPadding::align16;
  c.hot = 96;
  c.top_k = 33;
  c.backend = Backend::cpu;
  HotCache cpu(c);
  c.backend = Backend::cuda;
  HotCache gpu(c);
  for (int r = 0; r < c.requests; ++r)
    for (int l = 0; l < c.layers; ++l)
      for (std::int64_t t = 0; t < c.capacity; ++t)
        for (std::size_t j = 0; j < gpu.pool().row_stride(); ++j)
          cpu.pool().row(r, l, t)[j] = gpu.pool().row(r, l, t)[j] = static_cast<std::uint8_t>(
              random_bits(3, static_cast<std::uint64_t>(((r * 2 + l) * 600 + t) * 600) + j));
  for (int r = 0; r < c.requests; ++r) {
    cpu.admit(r, 90 + 20 * r);
    gpu.admit(r, 90 + 20 * r);
  }
  Rng rng(4);
  Stream cpu_stream(Backend::cpu), gpu_stream(Backend::cuda);
  auto d_sel = Buffer<std::int32_t>::device(3 * 33, Backend::cuda, "sel");
  auto d_lens = Buffer<std::int64_t>::device(3, Backend::cuda, "lens");
  auto d_real = Buffer<std::int32_t>::device(1, Backend::cuda, "real");
  auto d_out = Buffer<std::int32_t>::device(3 * 33, Backend::cuda, "out");
  std::vector<std::int64_t> lens{90, 110, 130};
  const std::int32_t real = 3;
  upload(d_real, {real});
  for (int step = 0; step < 40; ++step) {
    const int layer = step % 2;
    std::vector<std::int32_t> sel(3 * 33), out(3 * 33);
    for (int b = 0; b < 3; ++b)
      for (int i = 0; i < 33; ++i)
        sel[static_cast<std::size_t>(b * 33 + i)] = static_cast<std::int32_t>(
            lens[b] - 1 - static_cast<std::int64_t>(rng.below(rng.below(2) ? 40 : 200)));
    upload(d_sel, sel);
    upload(d_lens, lens);
    const SwapInStats a = cpu.swap_in(
        layer, {sel.data(), lens.data(), true, &real, nullptr, 3, out.data()}, cpu_stream);
    const SwapInStats b = gpu.swap_in(layer,
                                      {d_sel.device_data(), d_lens.device_data(), true,
                                       d_real.device_data(), nullptr, 3, d_out.device_data()},
                                      gpu_stream);
    ASSERT_EQ(download(d_out), out) << step;
    EXPECT_EQ(a.hits, b.hits);
    EXPECT_EQ(a.misses, b.misses);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(b.bytes, b.misses * 592);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(cpu.hot_buffer().slot_tokens(layer, r), gpu.hot_buffer().slot_tokens(layer, r));
      ASSERT_EQ(cpu.hot_buffer().lru_order(layer, r), gpu.hot_buffer().lru_order(layer, r));
      ASSERT_EQ(cpu.hot_buffer().resident_bits(layer, r), gpu.hot_buffer().resident_bits(layer, r));
      for (int slot = 0; slot < c.hot; ++slot)
        ASSERT_EQ(cpu.hot_buffer().row(layer, r, slot), gpu.hot_buffer().row(layer, r, slot));
    }
    if (layer == 1)
      for (auto& l : lens) ++l;
  }
#endif
}

TEST(HotcacheSwapInGpu, HotCacheOnCudaMatchesHotCacheOnCpuHashResolve) {
  HISPARSE_REQUIRE_GPU();
  hot_cache_on_cuda_matches_cpu(kernels::ResolvePath::hash);
}

TEST(HotcacheSwapInGpu, HotCacheOnCudaMatchesHotCacheOnCpuDirectResolve) {
  HISPARSE_REQUIRE_GPU();
  hot_cache_on_cuda_matches_cpu(kernels::ResolvePath::direct);
}

TEST(HotcacheSwapInGpu, HotCacheOnCudaMatchesHotCacheOnCpuCompactDirectResolve) {
  HISPARSE_REQUIRE_GPU();
  hot_cache_on_cuda_matches_cpu(kernels::ResolvePath::direct_compact);
}

TEST(HotcacheSwapInGpu, PinnedPoolFailureNamesTheSize) {
  HISPARSE_REQUIRE_GPU();
  try {
    HostKvPool pool({1024, 1024, 1 << 20, 1024}, Backend::cuda);  // 1 PiB
    FAIL() << "pinned 1 PiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find(
            "host KV pool (1024 requests x 1024 layers x 1048576 tokens x 1024 B): cannot pin"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("raise the memlock limit"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace hisparse
