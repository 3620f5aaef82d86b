// Fathom arithmetic shared verbatim by the CUDA kernels and their CPU twins (REFERENCE.md section
// 2). Every function orders its floating-point operations explicitly (fmaf where a fused
// multiply-add is meant, exact products elsewhere) so that the GPU and the CPU produce identical
// bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/config.hpp"
#include "core/dtypes.hpp"

namespace hisparse::kernels::fathom {

inline constexpr int kBlockTokens = 64;  ///< tokens per quantization block (one plane word)
inline constexpr int kPlanes = 4;        ///< 4-bit codes, 4 bit planes
inline constexpr int kSuperblockBlocks =
    16;                                   ///< HBM layout: 16 blocks (1024 tokens) per superblock
inline constexpr int kMaxChannels = 256;  ///< head_dim limit of the kernels
inline constexpr int kMaxGroupHeads = 8;  ///< query heads per KV head limit of the kernels

/// Depth bytes (one per channel of a plan): the number of planes read, 0..kPlanes, or kSignRead:
/// the top plane (the sign bit) alone, read without the block scales. The scan takes each block's
/// scale of such a channel as 1, and the calibrated constant that stands in for it is folded into
/// the query (apply_read_gains), so the channel costs 1 bit per token instead of 1.25.
inline constexpr std::uint8_t kSignRead = 0x81;
/// Planes a depth byte reads (0 for a byte that is no depth: the scan skips that channel).
HISPARSE_HD int read_planes(std::uint8_t depth) {
  return depth == kSignRead ? 1 : (depth <= kPlanes ? depth : 0);
}
/// Whether a depth byte reads its channel's block scales.
HISPARSE_HD bool reads_scale(std::uint8_t depth) {
  return depth >= 1 && depth <= kPlanes;
}

HISPARSE_HD float fused_multiply_add(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// Where the words and scales of (block, channel, plane) live.
/// host: [channel][plane][capacity_blocks] words and [channel][capacity_blocks] scales, so the
/// first
///       t planes of a channel are t runs of n/8 bytes (one run of t x n/8 bytes when the store is
///       exactly full);
/// hbm:  [superblock][channel][plane][16] words (128 B per (channel, plane) unit) and
///       [superblock][channel][16] scales.
/// In both layouts the 16 words of one (channel, plane) for 16 consecutive blocks starting at a
/// multiple of 16 are contiguous, which is what the scan kernel loads.
enum class PlaneLayoutKind : std::uint8_t { host, hbm };

struct PlaneLayout {
  PlaneLayoutKind kind = PlaneLayoutKind::hbm;
  std::int32_t channels = 0;
  std::int64_t capacity_blocks = 0;  ///< a multiple of 16

  // Both layouts split an index into a per-run part and a per-block part, so a loop over the
  // pieces of many runs (the scan's stage) computes the block's part once per block:
  //   word_index(b, c, p) = (c kPlanes + p) x unit_stride() + block_offset(b, kPlanes)
  //   scale_index(b, c)   = c x unit_stride() + block_offset(b, 1)
  [[nodiscard]] HISPARSE_HD std::int64_t unit_stride() const {
    return kind == PlaneLayoutKind::host ? capacity_blocks : kSuperblockBlocks;
  }
  /// `runs_per_channel`: kPlanes for words, 1 for scales.
  [[nodiscard]] HISPARSE_HD std::int64_t block_offset(std::int64_t block,
                                                      int runs_per_channel) const {
    if (kind == PlaneLayoutKind::host) return block;
    return (block / kSuperblockBlocks) * channels * runs_per_channel * kSuperblockBlocks +
           block % kSuperblockBlocks;
  }
  [[nodiscard]] HISPARSE_HD std::int64_t word_index(std::int64_t block, int channel,
                                                    int plane) const {
    return (static_cast<std::int64_t>(channel) * kPlanes + plane) * unit_stride() +
           block_offset(block, kPlanes);
  }
  [[nodiscard]] HISPARSE_HD std::int64_t scale_index(std::int64_t block, int channel) const {
    return static_cast<std::int64_t>(channel) * unit_stride() + block_offset(block, 1);
  }
  [[nodiscard]] HISPARSE_HD std::int64_t words_per_stream() const {
    return capacity_blocks * channels * kPlanes;
  }
  [[nodiscard]] HISPARSE_HD std::int64_t scales_per_stream() const {
    return capacity_blocks * channels;
  }
};

/// The published quantizer: scale a = absmax rounded to fp16 (clamped to the fp16 range), cell
/// s = a / 8, code = clip(floor(k / s), -8, 7) + 8. An all-zero block gets a = 0 and code 8.
HISPARSE_HD std::uint16_t block_scale_f16(float absmax) {
  const float clamped = absmax > 65504.0f ? 65504.0f : absmax;
  return float_to_f16(clamped);
}
HISPARSE_HD std::uint32_t quantize_code(float key, float scale) {
  if (!(scale > 0.0f)) return 8u;
  const float cell = scale * 0.125f;  // exact: division by a power of two
  const float q = floorf(key / cell);
  const float c = q < -8.0f ? -8.0f : (q > 7.0f ? 7.0f : q);
  return static_cast<std::uint32_t>(static_cast<int>(c) + 8);
}

/// Midpoint reconstruction from the first t planes, as a multiple of the block scale a:
/// (c_t + 0.5 - 2^(t-1)) / 2^(t-1) = (2 c_t + 1 - 2^t) * 2^-t; exact in float. t = 0 gives 0.
HISPARSE_HD float partial_multiplier(std::uint32_t code_t, int t) {
  if (t == 0) return 0.0f;
  const int numerator = 2 * static_cast<int>(code_t) + 1 - (1 << t);
  // 2^-t built from its exponent bits: exact, and no float division in the scan's inner loop.
  const float inverse = detail::bits_float(static_cast<std::uint32_t>(127 - t) << 23);
  return static_cast<float>(numerator) * inverse;
}
/// The value a partial read of `t` planes of `code4` (the full 4-bit code) reconstructs.
HISPARSE_HD float partial_value(std::uint32_t code4, int t, float scale) {
  return scale * partial_multiplier(code4 >> (kPlanes - t), t);
}

// ---- Quantized-weight scores (what the tensor-core scan computes; REFERENCE.md partial read) ----
// Scale groups of 16 blocks (1024 tokens, one HBM superblock, aligned at multiples of 16 blocks):
// per group and active channel j, S_j = max of the block scales a_bj of the group's blocks that
// hold tokens, and each block's scale becomes a multiplier m_bj = rint(a_bj x fl(16 / S_j)) in
// 0..16 (a_bj ~ m_bj S_j / 16). Per group and query head: u_j = q_j * S_j over the active channels, one
// power-of-two scale 2^s that maps max |u_j| into [64, 128), W_j = clamp(rint(u_j * 2^s), +-127).
// The partial read of channel j is a_bj * (2 c_j + o_j) / 16 with c_j the code with its unread
// planes zeroed and o_j = 2^(4 - t_j) - 16, so the score is the exact integer
// I = sum_j W_j m_bj (2 c_j + o_j) times 2^-(s + 8). m_bj c_j <= 240 is one unsigned byte, so the
// tensor-core kernel multiplies its code bytes by m_bj and its weights stay the same for the 16
// blocks of a group. Integer sums are order-free, so the kernel and the CPU twin agree bit for bit.

inline constexpr int kScaleGroupBlocks = 16;  ///< blocks that share one set of weights
inline constexpr int kScaleSteps = 16;        ///< multiplier of the group's largest scale

/// The group's multiplier step 16 / S, correctly rounded on both backends; 0 when S is 0,
/// negative or not finite (every multiplier of the group is then 0).
HISPARSE_HD float scale_step(float group_max) {
  if (!(group_max > 0.0f) || !(group_max <= 3.0e38f)) return 0.0f;
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(static_cast<float>(kScaleSteps), group_max);
#else
  return static_cast<float>(kScaleSteps) / group_max;
#endif
}
/// m = rint(a x step) in 0..16 for a block scale `a` and its group's scale_step; 0 when `a` is
/// 0, negative or not a number. One multiply per block: the division is per group (the scan
/// computes it once per lane of four blocks), and one rounding of a / S x 16 or of a x (16 / S)
/// is as good as the other. Clamped before the rounding, with no branch: the bounds are
/// integers, so that equals rounding first, and fmaxf turns a NaN product (an infinite scale
/// times the step 0 of its group, or a NaN scale) into 0. The scan's record prologue converts
/// every (block, slot) of a chunk here; the branches took about 14 instructions a block.
HISPARSE_HD int scale_multiplier_by(float a, float step) {
#if defined(__CUDA_ARCH__)
  const float x = __fmul_rn(a, step);
#else
  const float x = a * step;
#endif
  return static_cast<int>(rintf(fminf(fmaxf(x, 0.0f), static_cast<float>(kScaleSteps))));
}
/// scale_multiplier_by(a, scale_step(group_max)).
HISPARSE_HD int scale_multiplier(float a, float group_max) {
  return scale_multiplier_by(a, scale_step(group_max));
}
/// Largest of two block scales, skipping NaN (fmaxf on both backends).
HISPARSE_HD float group_scale_max(float acc, float a) {
  return fmaxf(acc, a);
}

inline constexpr int kWeightLimit = 127;
inline constexpr int kNoWeights =
    -1000;  ///< weight shift of a (scale group, head) whose weights are all 0

/// 2^e as a float for e in [-126, 127] (built from the exponent bits: exact).
HISPARSE_HD float pow2_float(int e) {
  return detail::bits_float(static_cast<std::uint32_t>(e + 127) << 23);
}
/// The 4-bit code with the planes a depth-t read does not see zeroed (t = 0 gives 0).
HISPARSE_HD std::uint32_t masked_code(std::uint32_t code4, int t) {
  return code4 & ((0xF0u >> t) & 0xFu);
}
/// o_t = 2^(4 - t) - 16: 2 m + o_t is 16 x the cell-midpoint multiplier of a depth-t read.
HISPARSE_HD int code_offset(int t) {
  return t == 0 ? 0 : (1 << (4 - t)) - 16;
}
/// Shift s of one (scale group, head) so that max_abs * 2^s lies in [64, 128); kNoWeights when
/// max_abs is 0, below 2^-103 or not finite (every weight is then 0).
HISPARSE_HD int weight_shift(float max_abs) {
  const int e = static_cast<int>((detail::float_bits(max_abs) >> 23) & 0xffu);
  if (e < 24 || e == 0xff) return kNoWeights;
  return 6 - (e - 127);
}
HISPARSE_HD int quantize_weight(float w, int shift) {
  if (shift == kNoWeights) return 0;
  const float r = rintf(w * pow2_float(shift));  // the product is exact: a power-of-two scale
  if (!(r == r)) return 0;
  if (r > static_cast<float>(kWeightLimit)) return kWeightLimit;
  if (r < -static_cast<float>(kWeightLimit)) return -kWeightLimit;
  return static_cast<int>(r);
}
/// Score of the integer sum I: I * 2^-(shift + 8) (exact: |I| < 2^23 for head_dim <= 256).
HISPARSE_HD float quantized_score(int sum, int shift) {
  if (shift == kNoWeights) return 0.0f;
  return static_cast<float>(sum) * pow2_float(-shift - 8);
}
/// A lower bound (conservative by at least one) on the integer sums whose score reaches `floor`:
/// quantized_score(I, shift) >= floor implies I >= min_candidate_sum(floor, shift).
HISPARSE_HD int min_candidate_sum(float floor_score, int shift) {
  constexpr int kNone = 0x3fffffff;
  if (shift == kNoWeights) return 0.0f >= floor_score ? -kNone : kNone;
  const float x = floor_score * pow2_float(shift + 8);  // floor / unit, exact unless tiny
  if (!(x < 268435456.0f)) return kNone;                // 2^28: above every sum (|I| < 2^23)
  if (!(x > -268435456.0f)) return -kNone;
  return static_cast<int>(floorf(x)) - 1;
}

/// Monotone map of a float to an unsigned key (larger float -> larger key).
HISPARSE_HD std::uint32_t orderable_key(float score) {
  const std::uint32_t u = detail::float_bits(score);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
HISPARSE_HD float key_to_float(std::uint32_t key) {
  return detail::bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}
/// Unique selection key: higher score first, then lower position first. Always > 0.
HISPARSE_HD std::uint64_t selection_key(float score, std::uint32_t position) {
  return (static_cast<std::uint64_t>(orderable_key(score)) << 32) |
         static_cast<std::uint64_t>(0xffffffffu - position);
}
HISPARSE_HD std::uint32_t selection_key_position(std::uint64_t key) {
  return 0xffffffffu - static_cast<std::uint32_t>(key & 0xffffffffu);
}
/// Positions [first, end) of a stream of n tokens outside its sinks and its recent window: the
/// tokens each head's top `keep` is chosen from (sinks and recent tokens are always selected).
/// In the type of n: the scan kernel takes it in 32 bits (positions fit in 31), where ptxas
/// recomputes the bounds in every round rather than hold them, at a third of the 64-bit cost.
template <class I>
struct EligibleWindowOf {
  I first = 0, end = 0;
  [[nodiscard]] HISPARSE_HD I size() const { return end - first; }
};
using EligibleWindow = EligibleWindowOf<std::int64_t>;
template <class I>
HISPARSE_HD EligibleWindowOf<I> eligible_window(I n, std::type_identity_t<I> sinks,
                                                std::type_identity_t<I> recent) {
  const I first = n < sinks ? n : sinks;
  return {first, n - recent > first ? n - recent : first};
}
/// The filter a seed score gives a streaming top-k: every key of a score >= seed lies above it,
/// every key of a lower score at or below it. 0 (no filter) for a NaN or -infinity seed.
HISPARSE_HD std::uint64_t seed_threshold(float seed) {
  if (!(seed >= -3.402823466e38f)) return 0;  // NaN or -infinity
  return (static_cast<std::uint64_t>(orderable_key(seed)) << 32) - 1u;
}
/// A head's seed from an earlier step's range of selected scores (keep-th, top): margin x the
/// range below the keep-th, so that a query that moved a little still finds `keep` tokens above
/// it. NaN (no seed) when either is NaN.
HISPARSE_HD float seed_score(float kth, float top, float margin) {
  return kth - margin * (top - kth);
}

/// log2(x) with a fixed sequence of IEEE operations (identical on both backends; |error| < 1e-6).
/// x <= 0 or subnormal gives -1e30 (such a channel never receives a plane).
HISPARSE_HD float reproducible_log2(float x) {
  const std::uint32_t bits = detail::float_bits(x);
  if (!(x >= 1.17549435e-38f) || (bits >= 0x7f800000u)) return x > 0.0f ? 1e30f : -1e30f;
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  float m = detail::bits_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  int e = exponent;
  if (m > 1.41421356f) {  // centre the mantissa on 1 for a short series
    m = m * 0.5f;
    e += 1;
  }
  // log2(m) = 2/ln2 * atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172.
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = 1.0f / 11.0f;
  p = fused_multiply_add(p, s2, 1.0f / 9.0f);
  p = fused_multiply_add(p, s2, 1.0f / 7.0f);
  p = fused_multiply_add(p, s2, 1.0f / 5.0f);
  p = fused_multiply_add(p, s2, 1.0f / 3.0f);
  p = fused_multiply_add(p, s2, 1.0f);
  const float atanh_s = s * p;
  return fused_multiply_add(atanh_s, 2.88539008f, static_cast<float>(e));
}

/// Importance accumulation: sum over the group's query heads of q^2, in head order.
HISPARSE_HD float accumulate_q_squared(float sum, float q) {
  return fused_multiply_add(q, q, sum);
}

/// Depth of a channel with log2 importance `log2_g` at log2(theta) = x:
/// clip(round(log4(g / theta)), 0, 4) = #{m in 1..4 : log2_g - x >= 2m - 1}.
HISPARSE_HD int depth_at(float log2_g, float x) {
  const float d = log2_g - x;
  return (d >= 1.0f) + (d >= 3.0f) + (d >= 5.0f) + (d >= 7.0f);
}

inline constexpr int kBisectionSteps = 30;
inline constexpr float kBisectionLow = -60.0f;
inline constexpr float kBisectionHigh = 60.0f;

}  // namespace hisparse::kernels::fathom
