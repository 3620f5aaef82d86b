// Random plane-read calibrations for the measured planner's tests (CPU and GPU): per channel a
// variance over four decades, errors that fall with depth by random factors, a sign read that
// removes between nothing and more than the scaled first plane, and channels 0-3 with identical
// tables (exact ties between channels whose query weights tie too).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "fathom/depth_planner.hpp"

namespace hisparse::test {

inline std::vector<fathom::PlaneReadCalibration> random_read_calibrations(int count, int channels,
                                                                          std::uint64_t seed) {
  Rng rng(seed);
  std::vector<fathom::PlaneReadCalibration> out(static_cast<std::size_t>(count));
  for (auto& c : out) {
    for (int j = 0; j < channels; ++j) {
      const bool tied = j < 4 && j > 0;  // channels 1-3 copy channel 0
      if (tied) {
        for (int t = 0; t <= 4; ++t) {
          c.distortion.push_back(c.distortion[static_cast<std::size_t>(t)]);
          c.gain.push_back(c.gain[static_cast<std::size_t>(t)]);
        }
        c.sign_distortion.push_back(c.sign_distortion[0]);
        c.sign_gain.push_back(c.sign_gain[0]);
        continue;
      }
      float e = std::pow(10.0f, -4.0f * static_cast<float>(rng.uniform()));
      const float var = e;
      c.distortion.push_back(e);
      c.gain.push_back(1.0f);
      for (int t = 1; t <= 4; ++t) {
        e *= 0.1f + 0.8f * static_cast<float>(rng.uniform());
        c.distortion.push_back(e);
        c.gain.push_back(0.5f + static_cast<float>(rng.uniform()));
      }
      c.sign_distortion.push_back(var * (0.4f + 0.6f * static_cast<float>(rng.uniform())));
      c.sign_gain.push_back(0.1f + static_cast<float>(rng.uniform()));
    }
  }
  return out;
}

}  // namespace hisparse::test
