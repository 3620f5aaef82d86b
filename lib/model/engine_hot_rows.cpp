#include "model/engine_hot_rows.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse {
namespace {
HotCacheConfig cache_config(const HotRowShape& s, Backend backend) {
  HotCacheConfig c;
  c.requests = s.streams;
  c.layers = s.layers;
  c.capacity = s.capacity;
  c.row_bytes =
      static_cast<std::size_t>(s.row_elements) * static_cast<std::size_t>(s.element_bytes);
  c.padding = RowPadding::none;
  c.hot = s.hot;
  c.top_k = s.width;
  c.max_batch = s.streams;
  c.backend = backend;
  return c;
}
}  // namespace

HotRowCache::HotRowCache(const HotRowShape& shape, Backend backend)
    : shape_(shape),
      cache_(cache_config(shape, backend)),
      stream_(backend),
      seq_lens_(static_cast<std::size_t>(shape.streams)),
      physical_(static_cast<std::size_t>(shape.streams) * static_cast<std::size_t>(shape.width)),
      traces_(static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.streams)) {
  if (backend != Backend::cuda) return;
  const auto streams = static_cast<std::size_t>(shape.streams);
  num_real_device_ = Buffer<std::int32_t>::device(1, backend, "hisparse swap-in batch");
  physical_device_ =
      Buffer<std::int32_t>::device(physical_.size(), backend, "hisparse swap-in rows");
  const auto layers = static_cast<std::size_t>(shape.layers);
  stats_pinned_ =
      Buffer<std::int32_t>::pinned(layers * streams * 2, backend, "hisparse swap-in counts (host)");
  selected_pinned_ = Buffer<std::int32_t>::pinned(layers * physical_.size(), backend,
                                                  "hisparse selections (host)");
  const std::int32_t real = shape.streams;
  copy_bytes(num_real_device_.device_data(), &real, sizeof(real), backend);
}

std::uint8_t* HotRowCache::pool_row_bytes(int stream, int layer, std::int64_t token) {
  if (token < 0 || token >= shape_.capacity)
    throw Error(
        "hisparse host pool",
        fmt::format("token {} is beyond the pool's {} tokens per request", token, shape_.capacity),
        "raise EngineConfig::max_decode_steps to the number of steps the run takes");
  return cache_.pool().row(stream, layer, token);
}

void HotRowCache::admit_all(std::int64_t seq_len) {
  for (int r = 0; r < shape_.streams; ++r) cache_.admit(r, seq_len);
}

void HotRowCache::append(int layer, int stream, std::int64_t seq_len, const void* row) {
  const std::size_t bytes = row_bytes();
  std::memcpy(pool_row_bytes(stream, layer, seq_len - 1), row, bytes);
  const HotBuffer& hb = cache_.hot_buffer();
  std::uint8_t* slot = hb.layer_rows(layer) +
                       static_cast<std::size_t>(hb.physical_row(stream, hb.newest_slot(seq_len))) *
                           hb.shape().row_stride;
  copy_bytes(slot, row, bytes, hb.backend());
}

SwapInStats HotRowCache::swap_in(int layer, const std::int32_t* selected, std::int64_t seq_len,
                                 std::int32_t* slots) {
  std::fill(seq_lens_.begin(), seq_lens_.end(), seq_len);
  const std::int32_t num_real = shape_.streams;
  SwapInStep step;
  step.selected = selected;
  step.seq_lens = seq_lens_.data();
  step.seq_lens_int64 = true;
  step.num_real = &num_real;
  step.batch = shape_.streams;
  step.physical_rows = physical_.data();
  const SwapInStats stats = cache_.swap_in(layer, step, stream_);
  const auto width = static_cast<std::size_t>(shape_.width);
  for (int r = 0; r < shape_.streams; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * width;
    const std::int32_t base = r * (shape_.hot + 1);
    for (std::size_t i = 0; i < width; ++i)
      slots[at + i] = physical_[at + i] < 0 ? -1 : physical_[at + i] - base;
  }
  record_traces(layer, selected, seq_len);
  return stats;
}

void HotRowCache::record_traces(int layer, const std::int32_t* selected, std::int64_t seq_len) {
  const auto width = static_cast<std::size_t>(shape_.width);
  for (int r = 0; r < shape_.streams; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * width;
    traces_[static_cast<std::size_t>(layer) * static_cast<std::size_t>(shape_.streams) +
            static_cast<std::size_t>(r)]
        .steps.push_back(
            {seq_len, std::vector<std::int32_t>(selected + at, selected + at + width)});
  }
}

const std::uint8_t* HotRowCache::layer_rows_bytes(int layer) const {
  return cache_.hot_buffer().layer_rows(layer);
}

}  // namespace hisparse
