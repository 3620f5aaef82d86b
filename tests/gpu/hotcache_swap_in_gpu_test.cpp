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

namespace hisparse {
namespace {

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

std::string describe(const Shape& s) {
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

Shape random_shape(Rng& rng) {
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
Shape two_rows(int top_k, int hot) {
  Shape s;
  s.requests = 3;
  s.batch = 2;
  s.top_k = top_k;
  s.hot = hot;
  s.row_bytes = s.row_stride = 656;
  s.capacity = hot + 3 * top_k + 64;
  return s;
}

void run_steps(Harness& h, int steps, const std::string& label, bool scramble_hint = false) {
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
void capture_and_replay(Harness& h, Rng& rng, int steps, const std::string& label) {
  Stream stream(Backend::cuda);
  const int batch = h.shape().batch;
  h.make_step(batch);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  HISPARSE_CUDA_CHECK(cudaStreamBeginCapture(stream.native(), cudaStreamCaptureModeThreadLocal));
  kernels::launch_swap_in(h.args(true), stream.native());
  HISPARSE_CUDA_CHECK(cudaStreamEndCapture(stream.native(), &graph));
  HISPARSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < steps; ++step) {
    const int real =
        step % 5 == 4 ? static_cast<int>(rng.below(static_cast<std::uint64_t>(batch) + 1)) : batch;
    h.make_step(real);
    h.upload_inputs();
    HISPARSE_CUDA_CHECK(cudaGraphLaunch(exec, stream.native()));
    stream.synchronize();
    h.run_twin();
    h.expect_equal(label + " step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
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
