// HotRowCache's CUDA-engine entry points: the newest rows and the selection come from device
// memory, all copies are enqueued on the engine's stream (so they are ordered with its kernels).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>

#include "core/cuda_check.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "model/engine_hot_rows.hpp"

namespace hisparse {

void HotRowCache::append_device(int layer, std::int64_t seq_len, const void* rows,
                                const std::int64_t* positions, const Stream& stream) {
  (void)pool_row_bytes(0, layer, seq_len - 1);  // checks the token against the pool's capacity
  const HotBuffer& hb = cache_.hot_buffer();
  const kernels::HostPoolView pool = cache_.pool().layer_view(layer);
  kernels::AppendRowsArgs a;
  a.src = static_cast<const std::uint8_t*>(rows);
  // The pool's device address (mapped pinned memory): the kernel writes host memory directly.
  a.pool = const_cast<std::uint8_t*>(pool.base);
  a.pool_stride = pool.request_stride;
  a.pool_row_stride = pool.row_stride;
  a.hot = hb.layer_rows(layer);
  a.hot_stride = static_cast<std::size_t>(hb.physical_row(1, 0)) * hb.shape().row_stride;
  a.hot_slot_stride = hb.shape().row_stride;
  a.newest_slot_max = hb.shape().hot;  // HotBuffer::newest_slot: min(position, hot)
  a.positions = positions;
  a.rows = shape_.streams;
  a.bytes = static_cast<int>(row_bytes());
  kernels::launch_append_rows(a, stream.native());
}

void HotRowCache::swap_in_device(int layer, const std::int32_t* selected, std::int64_t seq_len,
                                 const std::int64_t* seq_lens, std::int32_t* slots,
                                 const Stream& stream) {
  const std::size_t entries = physical_.size();
  const auto streams = static_cast<std::size_t>(shape_.streams);
  SwapInStep step;
  step.selected = selected;
  step.seq_lens = seq_lens;
  step.seq_lens_int64 = true;
  step.num_real = num_real_device_.device_data();
  step.batch = shape_.streams;
  step.physical_rows = physical_device_.device_data();
  step.stats = stats_pinned_.device_data() + static_cast<std::size_t>(layer) * streams * 2;
  (void)cache_.swap_in(layer, step, stream, StatsMode::skip);
  kernels::SlotsFromPhysicalArgs a;
  a.physical = physical_device_.device_data();
  a.slots = slots;
  a.rows = shape_.streams;
  a.width = shape_.width;
  a.hot = shape_.hot;
  kernels::launch_slots_from_physical(a, stream.native());
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(
      selected_pinned_.host_data() + static_cast<std::size_t>(layer) * entries, selected,
      entries * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream.native()));
  pending_.push_back({layer, seq_len});
}

SwapInStats HotRowCache::finish_step_device() {
  SwapInStats total;
  const auto streams = static_cast<std::size_t>(shape_.streams);
  for (const PendingSwapIn& p : pending_) {
    const std::int32_t* counts =
        stats_pinned_.host_data() + static_cast<std::size_t>(p.layer) * streams * 2;
    for (std::size_t r = 0; r < streams; ++r) {
      total.hits += counts[2 * r];
      total.misses += counts[2 * r + 1];
    }
    record_traces(
        p.layer,
        selected_pinned_.host_data() + static_cast<std::size_t>(p.layer) * physical_.size(),
        p.seq_len);
  }
  total.bytes = total.misses * static_cast<std::int64_t>(cache_.pool().copy_bytes());
  pending_.clear();
  return total;
}

std::vector<int> HotRowCache::forget_pending() {
  std::vector<int> layers;
  for (const PendingSwapIn& p : pending_) layers.push_back(p.layer);
  pending_.clear();
  return layers;
}

void HotRowCache::replayed(const std::vector<int>& layers, std::int64_t seq_len) {
  for (int layer : layers) pending_.push_back({layer, seq_len});
}

}  // namespace hisparse
