#include "fathom/key_centre.hpp"

#include "core/dtypes.hpp"
#include "fathom/synthetic_keys.hpp"

namespace hisparse::fathom {

KeyCentre KeyCentre::none(int channels) {
  return KeyCentre(std::vector<float>(static_cast<std::size_t>(channels), 0.0f));
}

KeyCentre KeyCentre::calibrate(const std::uint16_t* keys, std::int64_t tokens, int channels,
                               int skip, int count) {
  return KeyCentre(calibration_moments(keys, tokens, channels, skip, count).mean);
}

void KeyCentre::apply(const std::uint16_t* keys, std::uint16_t* out, std::int64_t tokens) const {
  const auto d = mean_.size();
  for (std::int64_t i = 0; i < tokens; ++i)
    for (std::size_t j = 0; j < d; ++j) {
      const auto at = static_cast<std::size_t>(i) * d + j;
      out[at] = float_to_bf16(bf16_to_float(keys[at]) - mean_[j]);
    }
}

}  // namespace hisparse::fathom
