// KeyCentre: a KV stream's calibration mean per key channel, subtracted from its keys before
// they are quantized into planes (optional: scenario key fathom.centre_keys, `quality
// --centre-keys`).
// Why: a channel with a large mean (the slowest RoPE pairs, which barely rotate over a context;
// outlier channels) spends its block absmax on the offset, so its first planes say little.
// Subtracting a constant moves every score of a query head by the same q.mean, so rankings and
// selections do not change, and the codes spend their range on what varies. Exact attention still
// reads the original keys.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace hisparse::fathom {

class KeyCentre {
 public:
  /// Zero mean: apply() only copies.
  [[nodiscard]] static KeyCentre none(int channels);
  /// Mean over tokens [skip, skip + count) of bf16 keys [tokens][channels] (all tokens when
  /// fewer than 2 remain after skip, as calibration_variance does).
  [[nodiscard]] static KeyCentre calibrate(const std::uint16_t* keys, std::int64_t tokens,
                                           int channels, int skip, int count);
  /// out = bf16(keys - mean) for `tokens` rows; out may be keys.
  void apply(const std::uint16_t* keys, std::uint16_t* out, std::int64_t tokens) const;
  [[nodiscard]] std::span<const float> mean() const noexcept { return mean_; }
  [[nodiscard]] int channels() const noexcept { return static_cast<int>(mean_.size()); }

 private:
  explicit KeyCentre(std::vector<float> mean) : mean_(std::move(mean)) {}
  std::vector<float> mean_;
};

}  // namespace hisparse::fathom
