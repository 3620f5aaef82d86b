// HotRowCache's CUDA-engine entry points: the newest rows and the selection come from device
// memory, all copies are enqueued on the engine's stream (so they are ordered with its kernels).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "model/engine_hot_rows.hpp"

namespace hisparse {

void HotRowCache::append_device(int layer, std::int64_t seq_len, const void* rows,
                                const Stream& stream) {
  const std::size_t bytes = row_bytes();
  const HotBuffer& hb = cache_.hot_buffer();
  const int slot = hb.newest_slot(seq_len);
  for (int s = 0; s < shape_.streams; ++s) {
    const auto* row = static_cast<const std::uint8_t*>(rows) + static_cast<std::size_t>(s) * bytes;
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(pool_row_bytes(s, layer, seq_len - 1), row, bytes,
                                        cudaMemcpyDeviceToHost, stream.native()));
    std::uint8_t* dst = hb.layer_rows(layer) +
                        static_cast<std::size_t>(hb.physical_row(s, slot)) * hb.shape().row_stride;
    HISPARSE_CUDA_CHECK(
        cudaMemcpyAsync(dst, row, bytes, cudaMemcpyDeviceToDevice, stream.native()));
  }
}

SwapInStats HotRowCache::swap_in_device(int layer, const std::int32_t* selected,
                                        std::int64_t seq_len, std::int32_t* slots,
                                        const Stream& stream) {
  std::fill(seq_lens_.begin(), seq_lens_.end(), seq_len);
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(seq_lens_device_.device_data(), seq_lens_.data(),
                                      seq_lens_.size() * sizeof(std::int64_t),
                                      cudaMemcpyHostToDevice, stream.native()));
  SwapInStep step;
  step.selected = selected;
  step.seq_lens = seq_lens_device_.device_data();
  step.seq_lens_int64 = true;
  step.num_real = num_real_device_.device_data();
  step.batch = shape_.streams;
  step.physical_rows = physical_device_.device_data();
  // StatsMode::read waits for the stream: the host-side seq_lens_ copy above has been read.
  const SwapInStats stats = cache_.swap_in(layer, step, stream);
  kernels::SlotsFromPhysicalArgs a;
  a.physical = physical_device_.device_data();
  a.slots = slots;
  a.rows = shape_.streams;
  a.width = shape_.width;
  a.hot = shape_.hot;
  kernels::launch_slots_from_physical(a, stream.native());
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(selected_host_.data(), selected,
                                      selected_host_.size() * sizeof(std::int32_t),
                                      cudaMemcpyDeviceToHost, stream.native()));
  stream.synchronize();
  record_traces(layer, selected_host_.data(), seq_len);
  return stats;
}

}  // namespace hisparse
