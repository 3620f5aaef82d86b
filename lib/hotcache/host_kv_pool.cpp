#include "hotcache/host_kv_pool.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse {

std::size_t padded_row_stride(std::size_t row_bytes, RowPadding padding) noexcept {
  const std::size_t align = padding == RowPadding::align64   ? 64
                            : padding == RowPadding::align16 ? 16
                                                             : 1;
  return (row_bytes + align - 1) / align * align;
}

namespace {
HostKvPoolShape checked(const HostKvPoolShape& s) {
  const std::string where = "host KV pool";
  if (s.requests < 1)
    throw Error(where, fmt::format("requests is {}", s.requests), "use at least 1 request");
  if (s.layers < 1)
    throw Error(where, fmt::format("layers is {}", s.layers), "use at least 1 layer");
  if (s.capacity < 1 || s.capacity > INT32_MAX)
    throw Error(where, fmt::format("capacity is {} tokens", s.capacity),
                "use a capacity (longest sequence) between 1 and 2^31 - 1 tokens");
  if (s.row_bytes == 0)
    throw Error(where, "row_bytes is 0", "give the KV row size in bytes (e.g. 656)");
  return s;
}
}  // namespace

HostKvPool::HostKvPool(const HostKvPoolShape& shape, Backend backend)
    : shape_(checked(shape)), row_stride_(padded_row_stride(shape.row_bytes, shape.padding)) {
  const std::size_t total = static_cast<std::size_t>(shape_.requests) *
                            static_cast<std::size_t>(shape_.layers) * region_bytes();
  alloc_ =
      Allocation::pinned(total, backend,
                         fmt::format("host KV pool ({} requests x {} layers x {} tokens x {} B)",
                                     shape_.requests, shape_.layers, shape_.capacity, row_stride_));
}

std::size_t HostKvPool::copy_bytes() const noexcept {
  return shape_.padding == RowPadding::none ? shape_.row_bytes : row_stride_;
}

std::size_t HostKvPool::region_bytes() const noexcept {
  return static_cast<std::size_t>(shape_.capacity) * row_stride_;
}

std::uint8_t* HostKvPool::row(int request, int layer, std::int64_t token) const {
  if (request < 0 || request >= shape_.requests || layer < 0 || layer >= shape_.layers ||
      token < 0 || token >= shape_.capacity)
    throw Error(
        "host KV pool",
        fmt::format(
            "row (request {}, layer {}, token {}) is outside {} requests x {} layers x {} tokens",
            request, layer, token, shape_.requests, shape_.layers, shape_.capacity),
        "raise the pool capacity to the longest sequence served");
  const std::size_t region =
      static_cast<std::size_t>(request) * shape_.layers + static_cast<std::size_t>(layer);
  return static_cast<std::uint8_t*>(alloc_.host_data()) + region * region_bytes() +
         static_cast<std::size_t>(token) * row_stride_;
}

kernels::HostPoolView HostKvPool::layer_view(int layer) const {
  kernels::HostPoolView v;
  v.base = static_cast<const std::uint8_t*>(alloc_.device_data()) +
           static_cast<std::size_t>(layer) * region_bytes();
  v.request_stride = static_cast<std::size_t>(shape_.layers) * region_bytes();
  v.row_stride = row_stride_;
  return v;
}

}  // namespace hisparse
