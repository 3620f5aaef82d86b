// Quantize bf16 keys to 4-bit codes per (64-token block, channel) and write them as bit planes plus
// one fp16 scale per block and channel, in either plane layout (fathom_math.hpp).
#pragma once

#include <cstdint>

#include "core/stream.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::kernels::fathom {

struct QuantizePackArgs {
  /// Keys of `streams` independent token streams: stream s, token i, channel j at
  /// keys[s * stream_stride + i * token_stride + j] (bf16 bits).
  const std::uint16_t* keys = nullptr;
  std::int64_t token_stride = 0;
  std::int64_t stream_stride = 0;
  std::int32_t streams = 0;
  std::int64_t tokens = 0;          ///< tokens of each stream in this call (may end mid-block)
  std::int64_t first_block = 0;     ///< destination block of the first token (a block boundary)
  PlaneLayout layout;               ///< channels = head_dim
  std::uint64_t* words = nullptr;   ///< stream s at words + s * layout.words_per_stream()
  std::uint16_t* scales = nullptr;  ///< stream s at scales + s * layout.scales_per_stream()
};

#if HISPARSE_WITH_CUDA
void launch_quantize_pack(const QuantizePackArgs& args, cudaStream_t stream);
#endif
/// CPU twin. Planes of tokens past `tokens` in the last block are written as 0.
void quantize_pack_ref(const QuantizePackArgs& args);

}  // namespace hisparse::kernels::fathom
