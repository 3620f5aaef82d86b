// HotRowCache: the DecodeEngine's HiSparse placement. One hisparse::HotCache whose cache slots are
// the engine's KV streams: one per request on MLA models (the latent row), kv_heads per request on
// GQA models (stream = request * kv_heads + kv_head, row = [K | V] of that head). Rows are stored
// in the engine's layout (floats on the CPU engine, bf16 on the CUDA engine) so that attention
// over hot rows reads exactly the values the GPU-resident baseline reads; the bytes a deployment
// moves are accounted separately (deployed_row_bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/device.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "hotcache/hot_cache.hpp"
#include "hotcache/policies.hpp"

namespace hisparse {

struct HotRowShape {
  int streams = 1;
  int layers = 1;
  std::int64_t capacity = 0;  ///< tokens per stream the host pool holds
  int row_elements = 0;       ///< elements per row in the engine's layout
  int element_bytes = 4;      ///< 4: float rows (CPU engine), 2: bf16 rows (CUDA engine)
  int hot = 0;                ///< slots per (stream, layer), top_k <= hot <= 32768
  int width = 0;              ///< entries of one step's selection per stream (the swap-in top_k)
};

class HotRowCache {
 public:
  HotRowCache(const HotRowShape& shape, Backend backend);

  [[nodiscard]] const HotRowShape& shape() const noexcept { return shape_; }
  /// The host-pool row of `token` (write the context here before admit_all()).
  [[nodiscard]] std::uint8_t* pool_row_bytes(int stream, int layer, std::int64_t token);
  /// The same for float rows (element_bytes 4).
  [[nodiscard]] float* pool_row(int stream, int layer, std::int64_t token) {
    return reinterpret_cast<float*>(pool_row_bytes(stream, layer, token));
  }
  [[nodiscard]] std::size_t row_bytes() const noexcept {
    return static_cast<std::size_t>(shape_.row_elements) *
           static_cast<std::size_t>(shape_.element_bytes);
  }
  /// Bytes from one token's pool row to the next of the same (stream, layer).
  [[nodiscard]] std::size_t pool_row_stride() const noexcept { return cache_.pool().row_stride(); }
  /// Starts every stream with `seq_len` tokens in the pool (HotCache::admit).
  void admit_all(std::int64_t seq_len);
  /// The newest token (position seq_len - 1) of `stream`: into the host pool and into the
  /// reserved newest-token slot of the hot buffer.
  void append(int layer, int stream, std::int64_t seq_len, const void* row);
  /// Swap-in of one step's selection for `layer` ([streams][width] positions, -1 none) at
  /// `seq_len`: writes the hot-buffer slot of every entry ([streams][width], -1 none), records
  /// the selection in the layer's traces, returns the hits and misses.
  SwapInStats swap_in(int layer, const std::int32_t* selected, std::int64_t seq_len,
                      std::int32_t* slots);
#if HISPARSE_WITH_CUDA
  // CUDA engine. Positions and lengths are device arrays [streams] that the kernels read when
  // they run, so that a CUDA graph of the step replays at every length; `seq_len` is what they
  // hold this step (the host's bounds check and the traces).
  /// append() of every stream at once from device rows [streams][row_elements], token
  /// positions[s] (= seq_len - 1), enqueued on `stream` (the pool row from the GPU, the
  /// newest-token slot on the GPU), ordered before the next swap-in on the same stream.
  void append_device(int layer, std::int64_t seq_len, const void* rows,
                     const std::int64_t* positions, const Stream& stream);
  /// swap_in() with the selection, the lengths (seq_lens[s] = seq_len) and the slots in device
  /// memory, enqueued on `stream` without waiting: the counts and a copy of the selection land in
  /// pinned memory of the layer, which finish_step_device() reads once the stream has passed them.
  void swap_in_device(int layer, const std::int32_t* selected, std::int64_t seq_len,
                      const std::int64_t* seq_lens, std::int32_t* slots, const Stream& stream);
  /// After the step's work has finished (the engine synchronised its stream): the hits and
  /// misses of every swap_in_device() since the last call, summed, and their selections recorded
  /// in the traces.
  SwapInStats finish_step_device();
  /// A CUDA graph captured the swap_in_device() calls since the last finish and none of them ran:
  /// forgets them and returns their layers, for replayed().
  [[nodiscard]] std::vector<int> forget_pending();
  /// A replay of that graph at `seq_len` ran swap_in_device() of `layers`: finish_step_device()
  /// reads them.
  void replayed(const std::vector<int>& layers, std::int64_t seq_len);
#endif
  /// The layer's hot rows: slot s of stream r at (r * (hot + 1) + s) * row_elements elements.
  [[nodiscard]] const std::uint8_t* layer_rows_bytes(int layer) const;
  [[nodiscard]] const float* layer_rows(int layer) const {
    return reinterpret_cast<const float*>(layer_rows_bytes(layer));
  }
  /// Selection traces, index layer * streams + stream, one TraceStep per swap_in().
  [[nodiscard]] const std::vector<SelectionTrace>& traces() const noexcept {
    return traces_;
  }

 private:
  HotRowShape shape_;
  HotCache cache_;
  Stream stream_;
  std::vector<std::int64_t> seq_lens_;
  std::vector<std::int32_t> physical_;
  std::vector<SelectionTrace> traces_;
  void record_traces(int layer, const std::int32_t* selected, std::int64_t seq_len);
  // CUDA engine: device copies of the swap-in's inputs and output, and a host copy of a selection
  Buffer<std::int32_t> num_real_device_, physical_device_;
  /// Per layer, pinned: the swap-in's [streams][2] counts and a copy of its selection
  Buffer<std::int32_t> stats_pinned_, selected_pinned_;
  struct PendingSwapIn {
    int layer;
    std::int64_t seq_len;
  };
  std::vector<PendingSwapIn> pending_;  ///< swap_in_device() calls finish_step_device() reads
};

}  // namespace hisparse
