// HotBuffer: per (layer, request) the GPU hot slots of HiSparse: `hot` slots plus the reserved
// newest-token slot (index hot), the slot -> token table (-1 empty) and the LRU order (slot
// indices, least recently used first), plus a residency bitmap (one bit per token, set while a
// slot holds it) when the shape gives a capacity. All live in device memory (host memory on the
// CPU backend) and are only changed by the swap-in and by reset() / clear().
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/memory.hpp"
#include "kernels/hotcache/swap_in.hpp"

namespace hisparse {

struct HotBufferShape {
  int requests = 1;
  int layers = 1;
  int hot = 4096;              ///< slots per (layer, request), excluding the reserved slot
  std::size_t row_stride = 0;  ///< bytes per hot row
  /// Longest sequence, tokens: sizes the residency bitmap (HotBufferView::resident, one bit per
  /// token); 0: no bitmap (the CUDA copy then cannot gather speculatively).
  std::int64_t capacity = 0;
};

class HotBuffer {
 public:
  /// Allocates the tables and rows and resets every request. Throws Error naming the field.
  HotBuffer(const HotBufferShape& shape, Backend backend);

  [[nodiscard]] const HotBufferShape& shape() const noexcept { return shape_; }
  [[nodiscard]] Backend backend() const noexcept { return backend_; }
  [[nodiscard]] std::size_t bytes() const noexcept;
  /// Device bytes per request over all layers (tables and rows).
  [[nodiscard]] std::size_t bytes_per_request() const noexcept;

  /// The layer as the swap-in kernel addresses it.
  [[nodiscard]] kernels::HotBufferView layer_view(int layer) const;
  /// Device address of the layer's rows: physical row p of a swap-in output is at p * row_stride.
  [[nodiscard]] std::uint8_t* layer_rows(int layer) const;

  /// Slot s holds token s and the LRU order is 0..hot-1: the state of a sequence that grew through
  /// the short-sequence path (token t in slot t) to its first step beyond `hot`.
  void reset(int request);
  /// Every slot empty (-1), LRU order 0..hot-1.
  void clear(int request);

  /// Copies of the state, for tests and debugging (synchronous).
  [[nodiscard]] std::vector<std::int32_t> slot_tokens(int layer, int request) const;
  [[nodiscard]] std::vector<std::int32_t> lru_order(int layer, int request) const;
  /// The residency bitmap's words (empty without one).
  [[nodiscard]] std::vector<std::uint32_t> resident_bits(int layer, int request) const;
  [[nodiscard]] std::vector<std::uint8_t> row(int layer, int request, int slot) const;

  /// Where the newest token of a sequence of `seq_len` tokens lives.
  [[nodiscard]] int newest_slot(std::int64_t seq_len) const noexcept {
    return seq_len <= shape_.hot ? static_cast<int>(seq_len - 1) : shape_.hot;
  }
  /// Index of (request, slot) among the layer's rows, as the swap-in outputs it.
  [[nodiscard]] std::int32_t physical_row(int request, int slot) const noexcept {
    return request * (shape_.hot + 1) + slot;
  }

 private:
  void fill_tables(int request, bool identity);
  /// Index of (layer, request) among the per-(layer, request) tables, layer-major.
  [[nodiscard]] std::size_t table_index(int layer, int request) const noexcept {
    return static_cast<std::size_t>(layer) * static_cast<std::size_t>(shape_.requests) +
           static_cast<std::size_t>(request);
  }
  [[nodiscard]] std::size_t table_offset(int layer, int request) const noexcept {
    return table_index(layer, request) * static_cast<std::size_t>(shape_.hot);
  }
  [[nodiscard]] std::size_t resident_words() const noexcept {
    return static_cast<std::size_t>((shape_.capacity + 31) / 32);
  }
  [[nodiscard]] std::size_t resident_offset(int layer, int request) const noexcept {
    return table_index(layer, request) * resident_words();
  }

  HotBufferShape shape_;
  Backend backend_;
  Buffer<std::int32_t> slot_token_;  ///< [layers][requests][hot]
  Buffer<std::int32_t> lru_;         ///< [layers][requests][hot]
  Buffer<std::uint32_t> resident_;   ///< [layers][requests][resident_words()]
  Buffer<std::uint8_t> rows_;        ///< [layers][requests][hot + 1][row_stride]
};

}  // namespace hisparse
