// The CPU twin of hisparse-microbench's scoring-ceiling probe (fathom_score_ceiling), on a case
// worked by hand: the probe's GPU run is checked against this twin before it is timed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "score_ceiling_probe.hpp"

namespace hisparse::microbench {
namespace {
namespace kf = kernels::fathom;

// One stream of 1,024 tokens (one superblock), 16 channels read at depth 1. Only two plane
// words are set: block 0 channel 0 has tokens 0 and 2 (scale bits 0x0300: multiplier 4), block 3
// channel 5 has its last token, 255 (scale 0: multiplier 1). Weights: head 0 x channel 0 = 10,
// head 1 x channel 0 = -3, head 2 x channel 5 = 7. So tokens 0 and 2 score 10 x 8 x 4 = 320 on
// head 0 and -96 on head 1, token 255 scores 7 x 8 = 56 on head 2, and every other score is 0.
struct HandCase {
  kf::PlaneLayout layout{kf::PlaneLayoutKind::hbm, 16, 16};
  std::vector<std::uint64_t> words;
  std::vector<std::uint16_t> scales;
  std::vector<std::int8_t> weights = std::vector<std::int8_t>(kCeilingHeads * 16, 0);
  HandCase() {
    words.assign(static_cast<std::size_t>(layout.words_per_stream()), 0);
    scales.assign(static_cast<std::size_t>(layout.scales_per_stream()), 0);
    words[static_cast<std::size_t>(layout.word_index(0, 0, 0))] = 0b101;
    words[static_cast<std::size_t>(layout.word_index(3, 5, 0))] = std::uint64_t{1} << 63;
    words[static_cast<std::size_t>(layout.word_index(3, 5, 1))] = ~std::uint64_t{0};  // unread
    scales[static_cast<std::size_t>(layout.scale_index(0, 0))] = 0x0300;
    weights[0 * 16 + 0] = 10;
    weights[1 * 16 + 0] = -3;
    weights[2 * 16 + 5] = 7;
  }
  std::int32_t count(CeilingWork work, int threshold) const {
    ScoreCeilingArgs a;
    a.layout = layout;
    a.slots = 16;
    a.streams = 1;
    a.tokens = 1024;
    a.threshold = threshold;
    a.work = work;
    std::int32_t n = -1;
    score_ceiling_ref(a, words.data(), scales.data(), weights.data(), &n);
    return n;
  }
};

TEST(MicrobenchScoreCeiling, TwinCountsTheScoresWorkedByHand) {
  const HandCase c;
  EXPECT_EQ(ceiling_multiplier(0x0300), 4);
  EXPECT_EQ(ceiling_multiplier(0x0000), 1);
  EXPECT_EQ(ceiling_multiplier(0x0f00), 16);
  EXPECT_EQ(c.count(CeilingWork::score, 1), 3);   // 320, 320 (head 0) and 56 (head 2)
  EXPECT_EQ(c.count(CeilingWork::score, 57), 2);  // the two 320s
  EXPECT_EQ(c.count(CeilingWork::score, 321), 0);
  EXPECT_EQ(c.count(CeilingWork::score, 0), 4096 - 2);  // all but the two -96s of head 1
  // Without multipliers tokens 0 and 2 score 80 on head 0.
  EXPECT_EQ(c.count(CeilingWork::unscaled, 80), 2);
  EXPECT_EQ(c.count(CeilingWork::unscaled, 81), 0);
  // mask_only computes the same sums scaled per row on the GPU; its counts are unscaled's.
  EXPECT_EQ(c.count(CeilingWork::mask_only, 80), 2);
  EXPECT_EQ(c.count(CeilingWork::mask_only, 81), 0);
  // Code bytes times multipliers: 2 bits x 8 x 4 + 1 bit x 8 x 1.
  EXPECT_EQ(c.count(CeilingWork::expand_only, 0), 72);
  // Non-zero plane-0 words (2) and scales (1) of the 16 channels.
  EXPECT_EQ(c.count(CeilingWork::stage_only, 0), 3);
}

}  // namespace
}  // namespace hisparse::microbench
