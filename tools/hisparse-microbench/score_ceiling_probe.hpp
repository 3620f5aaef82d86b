// Device half of the scoring-ceiling probe (bench_score_ceiling.cpp): how fast the HBM plane
// scan's arithmetic alone can read, to bound what the full scan (plane_scan.cu) can reach.
// The probe keeps only what no scan of this score definition can avoid: superblocks staged by
// cp.async, each 64-token block's code bytes built from its plane words (the sub-token layout of
// plane_scan_fragments.hpp), the per-block scale multiplier applied, the integer MMAs for a group
// of 4 query heads, and one comparison of every score with a threshold. It leaves out the depth
// plan, slot ordering, weight quantization, the constant term and the candidate selection, so
// what it reaches is an upper bound for the full scan.
#pragma once

#include <cstdint>

#include "kernels/fathom/fathom_math.hpp"

#if HISPARSE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hisparse::microbench {

inline constexpr int kCeilingHeads = 4;  ///< query heads per stream (one GQA group of 4)

/// What one probe launch does per 64-token block.
enum class CeilingWork : std::uint8_t {
  score,        ///< code bytes, multipliers, MMAs and the threshold test
  unscaled,     ///< the same with every multiplier 1 (no scale reads, no byte multiplies)
  mask_only,    ///< unscaled, each code byte one mask of its word: bit x + 8i lands on bit x of
                ///< byte i (x = lane / 4), so row x's sums come out times 2^x / 8, which the
                ///< threshold test takes into account (the counts are unscaled's)
  expand_only,  ///< code bytes and multipliers only, summed (IDP4A) instead of the MMAs
  stage_only,   ///< the staging alone: every staged word and scale folded into a checksum
};

/// Streams of `tokens` tokens (a multiple of 1024) in the HBM layout; channels 0..slots-1 read
/// at depth 1 (plane 0). Block b's multiplier of slot s is ceiling_multiplier(scale of (b, s)).
/// weights: [kCeilingHeads][slots] int8. counts[stream]: (score, unscaled, mask_only) the (token, head) pairs
/// whose integer sum reaches `threshold`; (expand_only) the sum of every code byte times its
/// multiplier, modulo 2^32; (stage_only) the staged words and scales that are not zero.
struct ScoreCeilingArgs {
  const std::uint64_t* words = nullptr;
  const std::uint16_t* scales = nullptr;
  kernels::fathom::PlaneLayout layout;
  const std::int8_t* weights = nullptr;
  int slots = 0;  ///< a multiple of 16, at most kernels::fathom::kMaxChannels and layout.channels
  int streams = 0;
  std::int64_t tokens = 0;
  int threshold = 0;
  std::int32_t* counts = nullptr;
  CeilingWork work = CeilingWork::score;
  int warps = 8;  ///< warps per block: 8 (2 blocks of each superblock per warp) or 4 (4 per warp)
};

/// The multiplier a block's fp16 scale bits give its slot (1..16): a cheap stand-in for the scan's
/// rounded quotient by the scale group's largest scale, so that the probe stays a lower bound on
/// the work.
HISPARSE_HD int ceiling_multiplier(std::uint16_t scale_bits) {
  return 1 + ((scale_bits >> 8) & 15);
}

/// CPU twin: the counts the probe must return.
void score_ceiling_ref(const ScoreCeilingArgs& a, const std::uint64_t* words,
                       const std::uint16_t* scales, const std::int8_t* weights,
                       std::int32_t* counts);

#if HISPARSE_WITH_CUDA
/// Launches the probe with `chunks` blocks per stream (each a contiguous range of superblocks).
void launch_score_ceiling(const ScoreCeilingArgs& a, int chunks, cudaStream_t stream);
/// Probe blocks resident per SM (for sizing `chunks`).
[[nodiscard]] int score_ceiling_resident_blocks(const ScoreCeilingArgs& a);
#endif

}  // namespace hisparse::microbench
