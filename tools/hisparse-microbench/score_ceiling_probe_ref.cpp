// CPU twin of the scoring-ceiling probe (score_ceiling_probe.cu).
#include "score_ceiling_probe.hpp"

#include <bit>

namespace hisparse::microbench {

void score_ceiling_ref(const ScoreCeilingArgs& a, const std::uint64_t* words,
                       const std::uint16_t* scales, const std::int8_t* weights,
                       std::int32_t* counts) {
  namespace kf = kernels::fathom;
  const std::int64_t blocks = a.tokens / kf::kBlockTokens;
  for (int s = 0; s < a.streams; ++s) {
    const std::uint64_t* w = words + static_cast<std::int64_t>(s) * a.layout.words_per_stream();
    const std::uint16_t* sc = scales + static_cast<std::int64_t>(s) * a.layout.scales_per_stream();
    std::int32_t count = 0;
    for (std::int64_t b = 0; b < blocks; ++b) {
      if (a.work == CeilingWork::stage_only) {
        for (int sl = 0; sl < a.slots; ++sl)
          count += (w[a.layout.word_index(b, sl, 0)] != 0 ? 1 : 0) +
                   (sc[a.layout.scale_index(b, sl)] != 0 ? 1 : 0);
        continue;
      }
      if (a.work == CeilingWork::expand_only) {  // modulo 2^32, as the probe's atomics wrap
        for (int sl = 0; sl < a.slots; ++sl)
          count = static_cast<std::int32_t>(
              static_cast<std::uint32_t>(count) +
              8u * static_cast<std::uint32_t>(std::popcount(w[a.layout.word_index(b, sl, 0)]) *
                                              ceiling_multiplier(sc[a.layout.scale_index(b, sl)])));
        continue;
      }
      const bool scaled = a.work == CeilingWork::score;
      for (int i = 0; i < kf::kBlockTokens; ++i)
        for (int h = 0; h < kCeilingHeads; ++h) {
          int sum = 0;
          for (int sl = 0; sl < a.slots; ++sl) {
            const int bit = static_cast<int>((w[a.layout.word_index(b, sl, 0)] >> i) & 1u);
            sum += weights[h * a.slots + sl] * (bit << 3) *
                   (scaled ? ceiling_multiplier(sc[a.layout.scale_index(b, sl)]) : 1);
          }
          count += sum >= a.threshold ? 1 : 0;
        }
    }
    counts[s] = count;
  }
}

}  // namespace hisparse::microbench
