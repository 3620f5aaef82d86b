// HotCache: HiSparse for one model on one device. Owns the host KV pool, the hot buffers and the
// swap-in workspace, and runs the swap-in for one layer and a batch of requests, on the CUDA kernel
// or its CPU twin according to the backend. The DecodeEngine calls, per layer of a `hisparse` step:
//   cache.swap_in(layer, step, stream)  ->  step.physical_rows index
//   cache.hot_buffer().layer_rows(layer)
#pragma once

#include <cstdint>
#include <memory>

#include "core/memory.hpp"
#include "core/stream.hpp"
#include "hotcache/host_kv_pool.hpp"
#include "hotcache/hot_buffer.hpp"
#include "kernels/hotcache/swap_in.hpp"

namespace hisparse {

struct HotCacheConfig {
  int requests = 1;  ///< concurrent requests (cache slots)
  int layers = 1;
  std::int64_t capacity = 0;  ///< longest sequence, tokens
  std::size_t row_bytes = 656;
  RowPadding padding = RowPadding::none;
  int hot = 4096;  ///< top_k <= hot <= 32768
  int top_k = 2048;
  int max_batch = 0;  ///< batch rows per swap-in call; 0: requests
  Backend backend = Backend::cpu;
  /// CUDA resolve kernel (results identical): direct, the faster one (reports/hotcache_tuning.md);
  /// hash is the earlier kernel, kept to compare and to switch back to.
  kernels::ResolvePath resolve = kernels::ResolvePath::direct;
  /// CUDA: a row with few misses is fetched by its resolve block (MissPlan::fetched), which saves
  /// the copy kernel's hand-off; false: the copy kernel fetches every row. Results identical.
  bool fetch_in_resolve = true;
  /// CUDA, batch < 8: the copy kernel starts with the resolve and gathers each row's misses as
  /// soon as they are numbered (MissPlan::ready); false: it waits for the whole resolve. Results
  /// identical.
  bool early_handoff = true;
  /// CUDA, with the early hand-off: the copy kernel loads the host rows of the selected tokens
  /// that the residency bitmap calls not resident as soon as it starts, before the resolve has
  /// found the misses (MissPlan::entry_slot). false: it waits for the resolve's miss list, and
  /// the hot buffer keeps no residency bitmap (capacity / 8 B per layer and request). Results
  /// identical.
  bool speculative_gather = true;
};

/// One step's inputs and output for one layer. Pointers are device memory on the CUDA backend
/// (host memory on the CPU backend); nothing is copied, so a CUDA graph capturing swap_in() can be
/// replayed after the caller rewrites the inputs in place.
struct SwapInStep {
  const std::int32_t* selected = nullptr;  ///< [batch][top_k], -1 none
  const void* seq_lens = nullptr;          ///< [batch] int32, or int64 with seq_lens_int64
  bool seq_lens_int64 = false;
  const std::int32_t* num_real = nullptr;  ///< one int32: rows >= it are padding
  const std::int32_t* request_of_row =
      nullptr;  ///< [batch] cache slot per row; null: row == request
  int batch = 0;
  std::int32_t* physical_rows = nullptr;  ///< [batch][top_k] output
  /// Optional [batch][2] (hits, misses) output, device-visible (mapped pinned memory on CUDA):
  /// the caller reads it after the stream has passed the call (StatsMode::skip); null: the
  /// cache's own counts, which swap_in returns with StatsMode::read.
  std::int32_t* stats = nullptr;
};

struct SwapInStats {
  std::int64_t hits = 0;    ///< selected entries served from the hot buffer
  std::int64_t misses = 0;  ///< rows fetched from the host pool
  std::int64_t bytes = 0;   ///< bytes fetched
  [[nodiscard]] double miss_rate() const noexcept {
    return hits + misses > 0 ? static_cast<double>(misses) / static_cast<double>(hits + misses)
                             : 0.0;
  }
};

enum class StatsMode {
  read,  ///< wait for the call and return the counts
  skip,  ///< return immediately (asynchronous; use inside CUDA-graph capture)
};

class HotCache {
 public:
  /// Allocates pool, hot buffers and workspace. Throws Error naming the field for bad sizes
  /// (top_k > hot, hot > 32768, shared memory beyond the device's limit) and on allocation failure.
  explicit HotCache(const HotCacheConfig& config);

  [[nodiscard]] const HotCacheConfig& config() const noexcept { return config_; }
  [[nodiscard]] HostKvPool& pool() noexcept { return pool_; }
  [[nodiscard]] const HostKvPool& pool() const noexcept { return pool_; }
  [[nodiscard]] HotBuffer& hot_buffer() noexcept { return hot_; }
  [[nodiscard]] const HotBuffer& hot_buffer() const noexcept { return hot_; }

  /// Starts serving `request` with `seq_len` tokens already in the pool: every layer's table is
  /// reset (slot t holds token t) and the rows of tokens 0..min(hot, seq_len)-1, and of the newest
  /// token when seq_len > hot, are copied from the pool into the hot buffer (synchronous).
  void admit(int request, std::int64_t seq_len);

  /// Swap-in for one layer. On the CPU backend it runs at once; on CUDA it is enqueued on
  /// `stream` (resolve + copy kernels) and, with StatsMode::read, waited for.
  SwapInStats swap_in(int layer, const SwapInStep& step, const Stream& stream,
                      StatsMode stats = StatsMode::read);

  /// The kernel arguments swap_in() uses (for tests and microbenchmarks).
  [[nodiscard]] kernels::SwapInArgs kernel_args(int layer, const SwapInStep& step) const;
  /// Sums the per-row counts of the last call (waits for `stream`).
  [[nodiscard]] SwapInStats last_stats(int batch, const Stream& stream) const;

 private:
  HotCacheConfig config_;
  HostKvPool pool_;
  HotBuffer hot_;
  Buffer<std::int32_t> plan_count_;       ///< [max_batch]
  Buffer<std::int32_t> plan_slot_;        ///< [max_batch][top_k]
  Buffer<std::int32_t> plan_token_;       ///< [max_batch][top_k]
  Buffer<std::int32_t> plan_fetched_;     ///< [max_batch]: rows the resolve fetched itself
  Buffer<std::int32_t> plan_ready_;       ///< [max_batch + 1]: early hand-off flags, zeroed
  Buffer<std::int32_t> plan_entry_slot_;  ///< [max_batch][top_k]: slot of each first miss, or -1
  Buffer<std::int32_t> stats_;            ///< [max_batch][2], pinned: read on the host after a sync
};

}  // namespace hisparse
