#include "hotcache/hot_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.hpp"

namespace hisparse {
namespace {
HotBufferShape checked(const HotBufferShape& s) {
  const std::string where = "hot buffer";
  if (s.requests < 1)
    throw Error(where, fmt::format("requests is {}", s.requests), "use at least 1 request");
  if (s.layers < 1)
    throw Error(where, fmt::format("layers is {}", s.layers), "use at least 1 layer");
  if (s.hot < 1 || s.hot > 32768)
    throw Error(where, fmt::format("hot is {} slots", s.hot), "use between top_k and 32768 slots");
  if (static_cast<std::int64_t>(s.requests) * (s.hot + 1) > INT32_MAX)
    throw Error(
        where,
        fmt::format("{} requests x {} slots overflow 32-bit row indices", s.requests, s.hot + 1),
        "lower the concurrency or the hot-buffer size");
  if (s.row_stride == 0) throw Error(where, "row_stride is 0", "give the KV row size in bytes");
  if (s.capacity < 0)
    throw Error(where, fmt::format("capacity is {} tokens", s.capacity),
                "give the longest sequence in tokens, or 0 for no residency bitmap");
  return s;
}
}  // namespace

HotBuffer::HotBuffer(const HotBufferShape& shape, Backend backend)
    : shape_(checked(shape)), backend_(backend) {
  const std::size_t pairs = table_index(shape_.layers, 0);  // (layer, request) pairs
  const std::size_t tables = pairs * static_cast<std::size_t>(shape_.hot);
  slot_token_ = Buffer<std::int32_t>::device(tables, backend, "hot buffer slot table");
  lru_ = Buffer<std::int32_t>::device(tables, backend, "hot buffer LRU order");
  if (shape_.capacity > 0)
    resident_ = Buffer<std::uint32_t>::device(pairs * resident_words(), backend,
                                              "hot buffer residency bitmap");
  rows_ = Buffer<std::uint8_t>::device(static_cast<std::size_t>(shape_.layers) * shape_.requests *
                                           (shape_.hot + 1) * shape_.row_stride,
                                       backend, "hot buffer rows");
  // Slots that no token has reached yet (seq_len < hot) are never copied into: zero them so that
  // the buffer's contents are the same on every backend and run, not whatever memory was reused.
  zero_bytes(rows_.device_data(), rows_.bytes(), backend);
  for (int r = 0; r < shape_.requests; ++r) reset(r);
}

std::size_t HotBuffer::bytes() const noexcept {
  return slot_token_.bytes() + lru_.bytes() + resident_.bytes() + rows_.bytes();
}

std::size_t HotBuffer::bytes_per_request() const noexcept {
  return bytes() / static_cast<std::size_t>(shape_.requests);
}

kernels::HotBufferView HotBuffer::layer_view(int layer) const {
  kernels::HotBufferView v{slot_token_.device_data() + table_offset(layer, 0),
                           lru_.device_data() + table_offset(layer, 0), layer_rows(layer),
                           shape_.row_stride};
  if (shape_.capacity > 0) {
    v.resident = resident_.device_data() + resident_offset(layer, 0);
    v.resident_words = resident_words();
  }
  return v;
}

std::uint8_t* HotBuffer::layer_rows(int layer) const {
  return rows_.device_data() +
         static_cast<std::size_t>(layer) * shape_.requests * (shape_.hot + 1) * shape_.row_stride;
}

void HotBuffer::fill_tables(int request, bool identity) {
  if (request < 0 || request >= shape_.requests)
    throw Error("hot buffer",
                fmt::format("request {} is outside 0..{}", request, shape_.requests - 1),
                "use a request index below the configured concurrency");
  std::vector<std::int32_t> order(static_cast<std::size_t>(shape_.hot));
  std::iota(order.begin(), order.end(), 0);
  const std::vector<std::int32_t> tokens =
      identity ? order : std::vector<std::int32_t>(order.size(), -1);
  const std::size_t bytes = order.size() * sizeof(std::int32_t);
  // Bits of the tokens the slots hold (identity: tokens 0..hot-1 below the capacity).
  std::vector<std::uint32_t> bits(resident_words(), 0u);
  if (identity)
    for (std::int64_t t = 0; t < std::min<std::int64_t>(shape_.hot, shape_.capacity); ++t)
      bits[static_cast<std::size_t>(t / 32)] |= 1u << (t % 32);
  for (int l = 0; l < shape_.layers; ++l) {
    copy_bytes(slot_token_.device_data() + table_offset(l, request), tokens.data(), bytes,
               backend_);
    copy_bytes(lru_.device_data() + table_offset(l, request), order.data(), bytes, backend_);
    if (!bits.empty())
      copy_bytes(resident_.device_data() + resident_offset(l, request), bits.data(),
                 bits.size() * sizeof(std::uint32_t), backend_);
  }
}

void HotBuffer::reset(int request) {
  fill_tables(request, true);
}
void HotBuffer::clear(int request) {
  fill_tables(request, false);
}

std::vector<std::int32_t> HotBuffer::slot_tokens(int layer, int request) const {
  std::vector<std::int32_t> v(static_cast<std::size_t>(shape_.hot));
  copy_bytes(v.data(), slot_token_.device_data() + table_offset(layer, request), v.size() * 4,
             backend_);
  return v;
}

std::vector<std::int32_t> HotBuffer::lru_order(int layer, int request) const {
  std::vector<std::int32_t> v(static_cast<std::size_t>(shape_.hot));
  copy_bytes(v.data(), lru_.device_data() + table_offset(layer, request), v.size() * 4, backend_);
  return v;
}

std::vector<std::uint32_t> HotBuffer::resident_bits(int layer, int request) const {
  std::vector<std::uint32_t> v(resident_words());  // none without a capacity
  if (!v.empty())
    copy_bytes(v.data(), resident_.device_data() + resident_offset(layer, request), v.size() * 4,
               backend_);
  return v;
}

std::vector<std::uint8_t> HotBuffer::row(int layer, int request, int slot) const {
  std::vector<std::uint8_t> v(shape_.row_stride);
  copy_bytes(
      v.data(),
      layer_rows(layer) + static_cast<std::size_t>(physical_row(request, slot)) * shape_.row_stride,
      v.size(), backend_);
  return v;
}

}  // namespace hisparse
