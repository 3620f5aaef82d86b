// The swap-in GPU tests' harness: a random or given shape, the CUDA swap-in and its CPU twin on
// the same inputs, and the byte-for-byte comparison of every output (rows, stats, miss plan, slot
// tables, LRU orders, hot-buffer bytes), direct and through a captured CUDA graph.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/cuda_graph.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "hotcache/hot_cache.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "support/gpu.hpp"

namespace hisparse::test {

#if HISPARSE_WITH_CUDA
using kernels::SwapInArgs;

struct Shape {
  int requests = 1;
  int batch = 1;
  int hot = 4;
  int top_k = 2;
  std::size_t row_bytes = 8;
  std::size_t row_stride = 8;
  std::int64_t capacity = 64;
  bool int64_lens = false;
  bool use_pdl = true;
  int copy_blocks = 0;
  int sort_misses_from = -1;
  int copy_rows_per_chunk = -1;
  kernels::ResolvePath resolve = kernels::ResolvePath::direct;
  std::int64_t max_seq_len = 0;  ///< SwapInArgs::max_seq_len (0: unknown)
  bool fetch_in_resolve = true;  ///< MissPlan::fetched
  bool early_handoff = false;    ///< MissPlan::ready
  /// A residency bitmap and MissPlan::entry_slot (kept on every path; with early_handoff the
  /// copy kernel gathers speculatively).
  bool speculate = false;
};

inline std::string describe(const Shape& s) {
  return "requests " + std::to_string(s.requests) + " batch " + std::to_string(s.batch) + " hot " +
         std::to_string(s.hot) + " top_k " + std::to_string(s.top_k) + " row " +
         std::to_string(s.row_bytes) + "/" + std::to_string(s.row_stride) +
         (s.int64_lens ? " int64" : " int32") + (s.use_pdl ? " pdl" : "") + " copy_blocks " +
         std::to_string(s.copy_blocks) + " sort_misses_from " + std::to_string(s.sort_misses_from) +
         " copy_rows_per_chunk " + std::to_string(s.copy_rows_per_chunk) + " resolve " +
         kernels::resolve_path_name(s.resolve) + (s.fetch_in_resolve ? " fetch_in_resolve" : "") +
         (s.early_handoff ? " early" : "") + (s.speculate ? " speculate" : "");
}

template <class T>
void upload(Buffer<T>& dev, const std::vector<T>& host) {
  ASSERT_EQ(dev.size(), host.size());
  copy_bytes(dev.device_data(), host.data(), host.size() * sizeof(T), Backend::cuda);
}
template <class T>
std::vector<T> download(const Buffer<T>& dev) {
  std::vector<T> host(dev.size());
  copy_bytes(host.data(), dev.device_data(), host.size() * sizeof(T), Backend::cuda);
  return host;
}

/// Twin state on the host, the same state on the device, one shared pinned pool.
class Harness {
 public:
  Harness(const Shape& s, std::uint64_t seed) : s_(s), rng_(seed) {
    const auto req = static_cast<std::size_t>(s.requests);
    const auto tables = req * static_cast<std::size_t>(s.hot);
    const auto rows = req * static_cast<std::size_t>(s.hot + 1) * s.row_stride;
    const auto entries = static_cast<std::size_t>(s.batch) * static_cast<std::size_t>(s.top_k);
    pool_ = Allocation::pinned(req * static_cast<std::size_t>(s.capacity) * s.row_stride,
                               Backend::cuda, "test pool");
    auto* p = static_cast<std::uint8_t*>(pool_.host_data());
    for (std::size_t i = 0; i < pool_.bytes(); i += 8) {
      const std::uint64_t bits = random_bits(seed, i);
      std::memcpy(p + i, &bits, std::min<std::size_t>(8, pool_.bytes() - i));
    }
    pool_checksum_ = checksum();

    slot_token_.assign(tables, -1);
    lru_.resize(tables);
    rows_.resize(rows);
    for (std::size_t i = 0; i < rows; ++i)
      rows_[i] = static_cast<std::uint8_t>(random_bits(seed + 1, i));
    seq_.resize(req);
    for (int r = 0; r < s.requests; ++r) init_request(r);
    words_ = static_cast<std::size_t>((s.capacity + 31) / 32);
    resident_.assign(s.speculate ? req * words_ : 0, 0u);
    for (std::size_t i = 0; i < resident_.size() / words_ * static_cast<std::size_t>(s.hot); ++i)
      if (const std::int32_t t = slot_token_[i]; t >= 0)
        resident_[i / static_cast<std::size_t>(s.hot) * words_ +
                  static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);

    d_slot_ = Buffer<std::int32_t>::device(tables, Backend::cuda, "slot");
    d_lru_ = Buffer<std::int32_t>::device(tables, Backend::cuda, "lru");
    d_rows_ = Buffer<std::uint8_t>::device(rows, Backend::cuda, "rows");
    d_sel_ = Buffer<std::int32_t>::device(entries, Backend::cuda, "sel");
    d_lens_ =
        Buffer<std::int64_t>::device(static_cast<std::size_t>(s.batch), Backend::cuda, "lens");
    d_real_ = Buffer<std::int32_t>::device(1, Backend::cuda, "num_real");
    d_remap_ =
        Buffer<std::int32_t>::device(static_cast<std::size_t>(s.batch), Backend::cuda, "remap");
    d_out_ = Buffer<std::int32_t>::device(entries, Backend::cuda, "out");
    d_stats_ =
        Buffer<std::int32_t>::device(2 * static_cast<std::size_t>(s.batch), Backend::cuda, "stats");
    d_count_ =
        Buffer<std::int32_t>::device(static_cast<std::size_t>(s.batch), Backend::cuda, "count");
    d_plan_slot_ = Buffer<std::int32_t>::device(entries, Backend::cuda, "plan slot");
    d_plan_token_ = Buffer<std::int32_t>::device(entries, Backend::cuda, "plan token");
    d_fetched_ =
        Buffer<std::int32_t>::device(static_cast<std::size_t>(s.batch), Backend::cuda, "fetched");
    d_ready_ = Buffer<std::int32_t>::device(static_cast<std::size_t>(s.batch) + 1, Backend::cuda,
                                            "ready flags");
    d_entry_slot_ = Buffer<std::int32_t>::device(entries, Backend::cuda, "entry slot");
    d_resident_ = Buffer<std::uint32_t>::device(std::max<std::size_t>(resident_.size(), 1),
                                                Backend::cuda, "resident");
    if (s.speculate) upload(d_resident_, resident_);
    entry_slot_.resize(entries);
    upload(d_ready_, std::vector<std::int32_t>(d_ready_.size(), 0));
    upload(d_slot_, slot_token_);
    upload(d_lru_, lru_);
    upload(d_rows_, rows_);
    sel_.resize(entries);
    lens64_.resize(static_cast<std::size_t>(s.batch));
    lens32_.resize(static_cast<std::size_t>(s.batch));
    remap_.resize(static_cast<std::size_t>(s.batch));
    out_.resize(entries);
    stats_.resize(2 * static_cast<std::size_t>(s.batch));
    count_.resize(static_cast<std::size_t>(s.batch));
    plan_slot_.resize(entries);
    plan_token_.resize(entries);
  }

  /// Random state: empty, identity (grown through the short path) or random resident tokens.
  void init_request(int r) {
    const auto base = static_cast<std::size_t>(r) * s_.hot;
    auto* st = slot_token_.data() + base;
    auto* lru = lru_.data() + base;
    std::iota(lru, lru + s_.hot, 0);
    seq_[r] = static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(s_.capacity - 40)));
    const auto kind = rng_.below(3);
    for (int i = 0; i < s_.hot; ++i) st[i] = kind == 1 ? i : -1;
    if (kind == 2 && seq_[r] > s_.hot + 1) {  // distinct random tokens below the newest
      std::vector<std::int32_t> pick;
      while (static_cast<int>(pick.size()) < s_.hot) {
        const auto t =
            static_cast<std::int32_t>(rng_.below(static_cast<std::uint64_t>(seq_[r] - 1)));
        if (std::find(pick.begin(), pick.end(), t) == pick.end()) pick.push_back(t);
      }
      for (int i = 0; i < s_.hot; ++i) st[i] = rng_.below(8) == 0 ? -1 : pick[i];
      for (int i = s_.hot - 1; i > 0; --i)
        std::swap(lru[i], lru[rng_.below(static_cast<std::uint64_t>(i) + 1)]);
    }
  }

  /// One step's inputs: real rows, remapping, lengths and selections.
  void make_step(int num_real) {
    real_ = num_real;
    std::vector<std::int32_t> requests(static_cast<std::size_t>(s_.requests));
    std::iota(requests.begin(), requests.end(), 0);
    for (int i = s_.requests - 1; i > 0; --i)
      std::swap(requests[i], requests[rng_.below(static_cast<std::uint64_t>(i) + 1)]);
    for (int b = 0; b < s_.batch; ++b) {
      const int r = remap_[b] = requests[b];
      if (rng_.below(16) == 0)
        seq_[r] =
            static_cast<std::int64_t>(rng_.below(static_cast<std::uint64_t>(s_.capacity - 1)));
      if (seq_[r] >= s_.capacity) seq_[r] = s_.capacity / 2;  // stay inside the pool region
      const std::int64_t seq = seq_[r];
      lens64_[b] = seq;
      lens32_[b] = static_cast<std::int32_t>(seq);
      const std::int32_t* st = slot_token_.data() + static_cast<std::size_t>(r) * s_.hot;
      std::int32_t* sel = sel_.data() + static_cast<std::size_t>(b) * s_.top_k;
      for (int i = 0; i < s_.top_k; ++i) {
        const auto u = rng_.below(20);
        std::int32_t p;
        if (u == 0) {
          p = -1;
        } else if (u == 1) {
          p = static_cast<std::int32_t>(seq +
                                        static_cast<std::int64_t>(rng_.below(3)));  // out of range
        } else if (u == 2 && i > 0) {
          p = sel[rng_.below(static_cast<std::uint64_t>(i))];  // duplicate
        } else if (u == 3) {
          p = static_cast<std::int32_t>(seq - 1);  // newest
        } else if (u < 12) {
          p = st[rng_.below(static_cast<std::uint64_t>(s_.hot))];  // likely a hit
        } else if (seq > 0) {
          p = static_cast<std::int32_t>(rng_.below(static_cast<std::uint64_t>(seq)));
        } else {
          p = 0;
        }
        sel[i] = p;
      }
    }
  }

  [[nodiscard]] SwapInArgs args(bool device) {
    SwapInArgs a;
    a.seq_lens_int64 = s_.int64_lens;
    a.copy_bytes = s_.row_bytes;
    a.batch = s_.batch;
    a.top_k = s_.top_k;
    a.hot = s_.hot;
    a.use_pdl = s_.use_pdl;
    a.copy_blocks = s_.copy_blocks;
    a.sort_misses_from = s_.sort_misses_from;
    a.copy_rows_per_chunk = s_.copy_rows_per_chunk;
    a.resolve = s_.resolve;
    a.max_seq_len = s_.max_seq_len;
    const auto request_stride = static_cast<std::size_t>(s_.capacity) * s_.row_stride;
    if (device) {
      a.selected = d_sel_.device_data();
      a.seq_lens = d_lens_.device_data();
      a.num_real = d_real_.device_data();
      a.request_of_row = d_remap_.device_data();
      a.hot_buffer = {d_slot_.device_data(), d_lru_.device_data(), d_rows_.device_data(),
                      s_.row_stride};
      a.host_pool = {static_cast<const std::uint8_t*>(pool_.device_data()), request_stride,
                     s_.row_stride};
      a.physical_rows = d_out_.device_data();
      a.stats = d_stats_.device_data();
      a.plan = {d_count_.device_data(),
                d_plan_slot_.device_data(),
                d_plan_token_.device_data(),
                s_.fetch_in_resolve ? d_fetched_.device_data() : nullptr,
                s_.early_handoff ? d_ready_.device_data() : nullptr,
                s_.speculate ? d_entry_slot_.device_data() : nullptr};
      if (s_.speculate) {
        a.hot_buffer.resident = d_resident_.device_data();
        a.hot_buffer.resident_words = words_;
      }
    } else {
      a.selected = sel_.data();
      a.seq_lens = s_.int64_lens ? static_cast<const void*>(lens64_.data()) : lens32_.data();
      a.num_real = &real_;
      a.request_of_row = remap_.data();
      a.hot_buffer = {slot_token_.data(), lru_.data(), rows_.data(), s_.row_stride};
      a.host_pool = {static_cast<const std::uint8_t*>(pool_.host_data()), request_stride,
                     s_.row_stride};
      a.physical_rows = out_.data();
      a.stats = stats_.data();
      a.plan = {count_.data(), plan_slot_.data(), plan_token_.data()};
      if (s_.speculate) {
        a.plan.entry_slot = entry_slot_.data();
        a.hot_buffer.resident = resident_.data();
        a.hot_buffer.resident_words = words_;
      }
    }
    return a;
  }

  /// Inputs to the device (outside any graph: the graph reads them in place).
  void upload_inputs() {
    upload(d_sel_, sel_);
    if (s_.int64_lens) {
      upload(d_lens_, lens64_);
    } else {
      copy_bytes(d_lens_.device_data(), lens32_.data(), lens32_.size() * 4, Backend::cuda);
    }
    copy_bytes(d_real_.device_data(), &real_, 4, Backend::cuda);
    upload(d_remap_, remap_);
  }

  void run_twin() {
    kernels::swap_in_ref(args(false));
    for (int b = 0; b < std::min(real_, s_.batch); ++b) ++seq_[remap_[b]];
  }

  /// Compares everything the contract defines; `where` names the step.
  void expect_equal(const std::string& where) {
    const std::string ctx = describe(s_) + " " + where;
    ASSERT_EQ(download(d_out_), out_) << ctx;
    ASSERT_EQ(download(d_stats_), stats_) << ctx;
    ASSERT_EQ(download(d_count_), count_) << ctx;
    // The plan's (slot, token) pairs must match; the kernel may list them grouped by host address
    // or, with the early hand-off, in the order its warps found them.
    const auto slot = download(d_plan_slot_), token = download(d_plan_token_);
    for (int b = 0; b < s_.batch; ++b) {
      std::vector<std::pair<std::int32_t, std::int32_t>> gpu, cpu;
      for (int m = 0; m < count_[b]; ++m) {
        const auto i = static_cast<std::size_t>(b) * s_.top_k + m;
        gpu.emplace_back(token[i], slot[i]);
        cpu.emplace_back(plan_token_[i], plan_slot_[i]);
      }
      if (s_.sort_misses_from != 0 || s_.early_handoff) {
        std::sort(gpu.begin(), gpu.end());
        std::sort(cpu.begin(), cpu.end());
      }
      ASSERT_EQ(gpu, cpu) << ctx << " plan row " << b;
    }
    ASSERT_EQ(download(d_slot_), slot_token_) << ctx;
    ASSERT_EQ(download(d_lru_), lru_) << ctx;
    if (s_.speculate) {
      ASSERT_EQ(download(d_entry_slot_), entry_slot_) << ctx;
      ASSERT_EQ(download(d_resident_), resident_) << ctx << ": residency bitmaps differ";
    }
    ASSERT_TRUE(download(d_rows_) == rows_) << ctx << ": hot-buffer bytes differ";
    // The early hand-off's flags are back to zero for the next call (the last copy block resets
    // them), whichever batch the call had.
    ASSERT_EQ(download(d_ready_), std::vector<std::int32_t>(d_ready_.size(), 0)) << ctx;
    if (s_.fetch_in_resolve) {  // which rows the resolve fetched itself (results are the same)
      const auto fetched = download(d_fetched_);
      for (int b = 0; b < s_.batch; ++b) {
        ASSERT_TRUE(fetched[b] == 0 || fetched[b] == 1) << ctx << " row " << b;
        if (fetched[b] == 1 && count_[b] > 0) ++fetched_rows_;
      }
    }
  }
  /// Rows with misses that a resolve block fetched itself, over every expect_equal so far.
  [[nodiscard]] int fetched_rows() const { return fetched_rows_; }

  [[nodiscard]] std::uint64_t checksum() const {
    std::uint64_t h = 1469598103934665603ull;
    const auto* p = static_cast<const std::uint8_t*>(pool_.host_data());
    for (std::size_t i = 0; i < pool_.bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
  [[nodiscard]] bool pool_unchanged() const { return checksum() == pool_checksum_; }
  /// Overwrites the residency bitmap with random words on both sides: a stale hint must cost
  /// time only (the swap-in then keeps both in step from the same wrong start).
  void scramble_resident() {
    for (auto& w : resident_) w = static_cast<std::uint32_t>(rng_.below(1ull << 32));
    upload(d_resident_, resident_);
  }
  Rng& rng() { return rng_; }
  [[nodiscard]] const Shape& shape() const { return s_; }

 private:
  Shape s_;
  Rng rng_;
  Allocation pool_;
  std::uint64_t pool_checksum_ = 0;
  std::vector<std::int32_t> slot_token_, lru_, sel_, lens32_, remap_, out_, stats_, count_,
      plan_slot_, plan_token_;
  std::vector<std::int64_t> lens64_, seq_;
  std::vector<std::uint8_t> rows_;
  std::vector<std::int32_t> entry_slot_;
  std::vector<std::uint32_t> resident_;
  std::size_t words_ = 0;
  std::int32_t real_ = 0;
  int fetched_rows_ = 0;
  Buffer<std::int32_t> d_slot_, d_lru_, d_sel_, d_real_, d_remap_, d_out_, d_stats_, d_count_,
      d_plan_slot_, d_plan_token_, d_fetched_, d_ready_, d_entry_slot_;
  Buffer<std::uint32_t> d_resident_;
  Buffer<std::int64_t> d_lens_;
  Buffer<std::uint8_t> d_rows_;
};

inline Shape random_shape(Rng& rng) {
  static const int kTopK[] = {1, 31, 32, 33, 63, 64, 65, 128, 131, 1024};
  static const std::size_t kRows[] = {1, 7, 15, 20, 584, 656, 1028, 1152};
  Shape s;
  s.requests = 1 + static_cast<int>(rng.below(6));
  s.batch = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(s.requests)));
  s.top_k = kTopK[rng.below(10)];
  s.hot = s.top_k + static_cast<int>(rng.below(3) == 0 ? 0 : rng.below(1100));
  if (rng.below(4) == 0) s.hot = (s.hot + 31) / 32 * 32 + (rng.below(2) ? 7 : 0);  // e.g. 1031
  s.row_bytes = kRows[rng.below(8)];
  s.row_stride = rng.below(3) == 0 ? (s.row_bytes + 15) / 16 * 16 : s.row_bytes;
  s.capacity = s.hot + 3 * s.top_k + 64;
  s.int64_lens = rng.below(2) == 0;
  s.use_pdl = rng.below(4) != 0;
  s.copy_blocks = rng.below(3) == 0 ? 1 + static_cast<int>(rng.below(40)) : 0;
  s.sort_misses_from = static_cast<int>(rng.below(3)) - 1;  // library default, never, always
  // A fixed chunk size, the one-wave size, or the library default.
  s.copy_rows_per_chunk =
      rng.below(4) == 0 ? 1 + static_cast<int>(rng.below(8)) : static_cast<int>(rng.below(2)) - 1;
  s.fetch_in_resolve = rng.below(4) != 0;
  s.early_handoff = rng.below(2) == 0;
  s.speculate = rng.below(3) != 0;
  return s;
}

// Two batch rows of three requests, 656-B rows, long enough sequences for every step to miss.
inline Shape two_rows(int top_k, int hot) {
  Shape s;
  s.requests = 3;
  s.batch = 2;
  s.top_k = top_k;
  s.hot = hot;
  s.row_bytes = s.row_stride = 656;
  s.capacity = hot + 3 * top_k + 64;
  return s;
}

inline void run_steps(Harness& h, int steps, const std::string& label, bool scramble_hint = false) {
  Stream stream(Backend::cuda);
  for (int step = 0; step < steps; ++step) {
    const int real =
        h.rng().below(5) == 0
            ? static_cast<int>(h.rng().below(static_cast<std::uint64_t>(h.shape().batch) + 1))
            : h.shape().batch;
    h.make_step(real);
    h.upload_inputs();
    if (scramble_hint) h.scramble_resident();
    kernels::launch_swap_in(h.args(true), stream.native());
    stream.synchronize();
    h.run_twin();
    h.expect_equal(label + " step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_TRUE(h.pool_unchanged()) << "the swap-in wrote to the host pool";
}

// Captures one swap-in of h's shape in a CUDA graph and replays it `steps` times, with new
// selections, lengths and numbers of real requests written in place at fixed device addresses,
// each replay against the twin. The launcher does not configure the kernels while capturing:
// the caller has.
inline void capture_and_replay(Harness& h, Rng& rng, int steps, const std::string& label) {
  Stream stream(Backend::cuda);
  const int batch = h.shape().batch;
  h.make_step(batch);
  const CudaGraph graph(
      stream, [&] { kernels::launch_swap_in(h.args(true), stream.native()); }, "swap-in test");
  for (int step = 0; step < steps; ++step) {
    const int real =
        step % 5 == 4 ? static_cast<int>(rng.below(static_cast<std::uint64_t>(batch) + 1)) : batch;
    h.make_step(real);
    h.upload_inputs();
    graph.launch(stream);
    stream.synchronize();
    h.run_twin();
    h.expect_equal(label + " step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) break;
  }
}
#endif

}  // namespace hisparse::test
