#include "kernels/fathom/quantize_pack.hpp"

#include <algorithm>
#include <cmath>

namespace hisparse::kernels::fathom {

void quantize_pack_ref(const QuantizePackArgs& args) {
  const std::int64_t blocks = (args.tokens + kBlockTokens - 1) / kBlockTokens;
  for (std::int32_t s = 0; s < args.streams; ++s) {
    const std::uint16_t* keys = args.keys + s * args.stream_stride;
    std::uint64_t* words = args.words + s * args.layout.words_per_stream();
    std::uint16_t* scales = args.scales + s * args.layout.scales_per_stream();
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t first = b * kBlockTokens;
      const int count = static_cast<int>(std::min<std::int64_t>(kBlockTokens, args.tokens - first));
      for (int ch = 0; ch < args.layout.channels; ++ch) {
        float absmax = 0.0f;
        for (int i = 0; i < count; ++i)
          absmax = std::max(absmax,
                            std::fabs(bf16_to_float(keys[(first + i) * args.token_stride + ch])));
        const std::uint16_t scale_bits = block_scale_f16(absmax);
        const float scale = f16_to_float(scale_bits);
        std::uint64_t plane[kPlanes] = {0, 0, 0, 0};
        for (int i = 0; i < count; ++i) {
          const std::uint32_t code =
              quantize_code(bf16_to_float(keys[(first + i) * args.token_stride + ch]), scale);
          for (int p = 0; p < kPlanes; ++p)
            plane[p] |= static_cast<std::uint64_t>((code >> (kPlanes - 1 - p)) & 1u) << i;
        }
        const std::int64_t block = args.first_block + b;
        for (int p = 0; p < kPlanes; ++p) words[args.layout.word_index(block, ch, p)] = plane[p];
        scales[args.layout.scale_index(block, ch)] = scale_bits;
      }
    }
  }
}

}  // namespace hisparse::kernels::fathom
