// PlaneStore: the 4-bit K cache of `streams` token streams (one per request x KV head of a layer)
// as bit planes with fp16 block scales, in one of the two layouts:
//  - PlaneLayoutKind::host: pinned mapped host memory, channel-major runs (offloaded cache);
//  - PlaneLayoutKind::hbm:  device memory, 1024-token superblocks, 128-B (channel, plane) units.
// append() quantizes new tokens during decode. The block being filled is re-quantized from the
// exact keys of its tokens (kept in a small per-stream tail buffer), so its scale is always the
// absmax of the tokens it holds, as if the block had been quantized in one go.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::fathom {

using kernels::fathom::PlaneLayout;
using kernels::fathom::PlaneLayoutKind;

class PlaneStore {
 public:
  PlaneStore(Backend backend, PlaneLayoutKind kind, std::int32_t streams, int channels,
             std::int64_t capacity_tokens, std::string label = "fathom plane store");

  /// Appends `count` tokens to streams [first_stream, first_stream + stream_count), which must all
  /// hold the same number of tokens. Key of stream first_stream + s, token i, channel j (bf16 bits)
  /// at keys[s * stream_stride + i * token_stride + j], in memory the backend's kernels read
  /// (device or mapped pinned memory on CUDA, host memory on the CPU). Ordered on `stream`.
  void append(std::int32_t first_stream, std::int32_t stream_count, const std::uint16_t* keys,
              std::int64_t token_stride, std::int64_t stream_stride, std::int64_t count,
              NativeStream stream = nullptr);

  [[nodiscard]] Backend backend() const noexcept { return backend_; }
  [[nodiscard]] const PlaneLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::int32_t streams() const noexcept { return streams_; }
  [[nodiscard]] int channels() const noexcept { return layout_.channels; }
  [[nodiscard]] std::int64_t capacity_tokens() const noexcept {
    return layout_.capacity_blocks * 64;
  }
  [[nodiscard]] std::int64_t length(std::int32_t stream) const { return lengths_host_.at(stream); }
  [[nodiscard]] std::int64_t max_length() const noexcept;
  /// Where the backend's kernels read planes, scales and lengths.
  [[nodiscard]] const std::uint64_t* words() const noexcept { return words_.device_data(); }
  [[nodiscard]] const std::uint16_t* scales() const noexcept { return scales_.device_data(); }
  [[nodiscard]] const std::int64_t* lengths() const noexcept { return lengths_.device_data(); }
  /// Host views (host layout on any backend, everything on the CPU backend); nullptr otherwise.
  [[nodiscard]] const std::uint64_t* host_words() const noexcept { return words_.host_data(); }
  [[nodiscard]] const std::uint16_t* host_scales() const noexcept { return scales_.host_data(); }
  /// Stored bytes per token and stream: channels/2 of planes + 2 B per channel per 64 tokens.
  [[nodiscard]] double bytes_per_token() const noexcept {
    return layout_.channels * (0.5 + 2.0 / 64.0);
  }

 private:
  void quantize(std::int32_t first_stream, std::int32_t stream_count, const std::uint16_t* keys,
                std::int64_t token_stride, std::int64_t stream_stride, std::int64_t tokens,
                std::int64_t first_block, NativeStream stream);
  void copy_rows(std::uint16_t* dst, std::int64_t dst_stride, const std::uint16_t* src,
                 std::int64_t src_stride, std::int64_t rows, NativeStream stream);

  Backend backend_;
  PlaneLayout layout_;
  std::int32_t streams_;
  Buffer<std::uint64_t> words_;
  Buffer<std::uint16_t> scales_;
  Buffer<std::uint16_t> tail_;  ///< [streams][64][channels] exact keys of the block being filled
  Buffer<std::int64_t> lengths_;
  std::vector<std::int64_t> lengths_host_;
  std::string label_;
};

}  // namespace hisparse::fathom
