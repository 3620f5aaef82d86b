// Error metrics shared by the engine's quality measurement and the Fathom quality study.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace hisparse {

/// ||approx - exact|| / ||exact|| over whole vectors of equal size (||approx - exact|| when exact
/// is zero), in double.
[[nodiscard]] inline double relative_l2(const std::vector<float>& approx,
                                        const std::vector<float>& exact) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < exact.size() && i < approx.size(); ++i) {
    const double d = static_cast<double>(approx[i]) - exact[i];
    num += d * d;
    den += static_cast<double>(exact[i]) * exact[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Mean over `vectors` of ||approx_i - exact_i|| / ||exact_i|| (vectors of `dim` floats); a zero
/// exact vector counts 0 when approx is zero too, else 1.
[[nodiscard]] inline double mean_relative_l2_error(const float* approx, const float* exact,
                                                   int vectors, int dim) {
  if (vectors < 1) return 0.0;
  double sum = 0;
  for (int i = 0; i < vectors; ++i) {
    double num = 0, den = 0;
    for (int c = 0; c < dim; ++c) {
      const double e = exact[static_cast<std::ptrdiff_t>(i) * dim + c];
      const double d = approx[static_cast<std::ptrdiff_t>(i) * dim + c] - e;
      num += d * d;
      den += e * e;
    }
    sum += den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
  }
  return sum / vectors;
}

}  // namespace hisparse
