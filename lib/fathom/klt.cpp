#include "fathom/klt.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace {

void check_square(std::span<const double> matrix, int n, const char* where) {
  if (n < 1)
    throw Error(where, fmt::format("matrix order {}", n), "use a positive number of channels");
  if (matrix.size() != static_cast<std::size_t>(n) * static_cast<std::size_t>(n))
    throw Error(where, fmt::format("{} entries for a {}x{} matrix", matrix.size(), n, n),
                fmt::format("pass n * n = {} entries", n * n));
}

/// One Jacobi rotation zeroing a[p][q] (a and v row-major n x n; v accumulates the columns).
void rotate_pair(std::vector<double>& a, std::vector<double>& v, int n, int p, int q) {
  const auto at = [n](int r, int c) { return static_cast<std::size_t>(r) * n + c; };
  const double apq = a[at(p, q)];
  const double theta = (a[at(q, q)] - a[at(p, p)]) / (2.0 * apq);
  // Smaller root of t^2 + 2 theta t - 1 = 0, so that |rotation angle| <= pi/4.
  const double t = std::abs(theta) > 1e150 ? 0.5 / theta
                                           : std::copysign(1.0, theta) /
                                                 (std::abs(theta) + std::sqrt(theta * theta + 1));
  const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
  a[at(p, p)] -= t * apq;
  a[at(q, q)] += t * apq;
  a[at(p, q)] = a[at(q, p)] = 0.0;
  for (int k = 0; k < n; ++k) {
    if (k != p && k != q) {
      const double akp = a[at(k, p)], akq = a[at(k, q)];
      a[at(k, p)] = a[at(p, k)] = c * akp - s * akq;
      a[at(k, q)] = a[at(q, k)] = s * akp + c * akq;
    }
    const double vkp = v[at(k, p)], vkq = v[at(k, q)];
    v[at(k, p)] = c * vkp - s * vkq;
    v[at(k, q)] = s * vkp + c * vkq;
  }
}

}  // namespace

SymmetricEigen jacobi_eigen(std::span<const double> matrix, int n, int max_sweeps) {
  constexpr const char* kWhere = "KLT eigensolver";
  check_square(matrix, n, kWhere);
  double largest = 0;
  for (double x : matrix) {
    if (!std::isfinite(x))
      throw Error(kWhere, "the matrix has a non-finite entry",
                  "check the calibration keys for NaN or infinity");
    largest = std::max(largest, std::abs(x));
  }
  const auto at = [n](int r, int c) { return static_cast<std::size_t>(r) * n + c; };
  for (int r = 0; r < n; ++r)
    for (int c = r + 1; c < n; ++c)
      if (std::abs(matrix[at(r, c)] - matrix[at(c, r)]) > 1e-9 * largest)
        throw Error(kWhere, fmt::format("the matrix is not symmetric at ({}, {})", r, c),
                    "pass a covariance matrix");

  std::vector<double> a(matrix.begin(), matrix.end()), v(a.size(), 0.0);
  for (int i = 0; i < n; ++i) v[at(i, i)] = 1.0;
  SymmetricEigen out;
  for (;; ++out.sweeps) {
    double off = 0, total = 0;
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) {
        const double x2 = a[at(r, c)] * a[at(r, c)];
        total += x2;
        if (r != c) off += x2;
      }
    // Converged once the off-diagonal mass is at the rounding level of the whole matrix.
    if (off <= 1e-30 * total) break;
    if (out.sweeps == max_sweeps)
      throw Error(kWhere, fmt::format("no convergence after {} sweeps", max_sweeps),
                  "raise max_sweeps");
    for (int p = 0; p < n - 1; ++p)
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[at(p, q)];
        // Entries already negligible against both diagonal entries are set to zero directly.
        if (apq == 0.0) continue;
        if (std::abs(apq) < 1e-18 * (std::abs(a[at(p, p)]) + std::abs(a[at(q, q)]))) {
          a[at(p, q)] = a[at(q, p)] = 0.0;
          continue;
        }
        rotate_pair(a, v, n, p, q);
      }
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return a[at(x, x)] > a[at(y, y)]; });
  out.values.resize(static_cast<std::size_t>(n));
  out.vectors.resize(a.size());
  for (int i = 0; i < n; ++i) {
    const int col = order[static_cast<std::size_t>(i)];
    out.values[static_cast<std::size_t>(i)] = a[at(col, col)];
    // Sign: the first entry within rounding of the largest magnitude is made positive (the
    // tolerance keeps equal-magnitude entries such as (1, -1)/sqrt 2 from flipping on noise).
    double largest_entry = 0;
    for (int k = 0; k < n; ++k) largest_entry = std::max(largest_entry, std::abs(v[at(k, col)]));
    int big = 0;
    while (std::abs(v[at(big, col)]) < largest_entry * (1 - 1e-9)) ++big;
    const double sign = v[at(big, col)] < 0 ? -1.0 : 1.0;
    for (int k = 0; k < n; ++k) out.vectors[at(i, k)] = sign * v[at(k, col)];
  }
  return out;
}

std::vector<double> key_covariance(const std::uint16_t* keys, std::int64_t tokens, int channels,
                                   int skip, std::int64_t count) {
  if (channels < 1)
    throw Error("KLT calibration", fmt::format("head_dim {}", channels), "use head_dim >= 1");
  const auto d = static_cast<std::size_t>(channels);
  std::int64_t first = std::min<std::int64_t>(std::max(skip, 0), tokens);
  std::int64_t last = std::min<std::int64_t>(tokens, first + std::max<std::int64_t>(count, 0));
  if (last - first < 2) first = 0, last = tokens;  // too short to skip: use what there is
  std::vector<double> cov(d * d, 0.0), mean(d, 0.0), row(d);
  if (last - first < 1) return cov;
  // Two passes (mean, then centred products) so that a large key bias costs no precision.
  for (std::int64_t i = first; i < last; ++i)
    for (std::size_t j = 0; j < d; ++j) mean[j] += bf16_to_float(keys[i * channels + j]);
  const double n = static_cast<double>(last - first);
  for (auto& m : mean) m /= n;
  for (std::int64_t i = first; i < last; ++i) {
    for (std::size_t j = 0; j < d; ++j) row[j] = bf16_to_float(keys[i * channels + j]) - mean[j];
    for (std::size_t r = 0; r < d; ++r)
      for (std::size_t c = r; c < d; ++c) cov[r * d + c] += row[r] * row[c];
  }
  for (std::size_t r = 0; r < d; ++r)
    for (std::size_t c = r; c < d; ++c) cov[c * d + r] = cov[r * d + c] /= n;
  return cov;
}

KltBasis::KltBasis(int channels, std::vector<double> values, std::vector<double> rows)
    : channels_(channels), values_(std::move(values)), rows_(std::move(rows)) {}

KltBasis KltBasis::identity(int channels) {
  if (channels < 1)
    throw Error("KLT basis", fmt::format("head_dim {}", channels), "use head_dim >= 1");
  const auto d = static_cast<std::size_t>(channels);
  std::vector<double> rows(d * d, 0.0);
  for (std::size_t i = 0; i < d; ++i) rows[i * d + i] = 1.0;
  return KltBasis(channels, std::vector<double>(d, 1.0), std::move(rows));
}

KltBasis KltBasis::from_covariance(std::span<const double> covariance, int channels) {
  auto eig = jacobi_eigen(covariance, channels);
  return KltBasis(channels, std::move(eig.values), std::move(eig.vectors));
}

KltBasis KltBasis::calibrate(const std::uint16_t* keys, std::int64_t tokens, int channels, int skip,
                             std::int64_t count) {
  HISPARSE_FUNC_RANGE();
  if (tokens < 2)
    throw Error("KLT calibration", fmt::format("{} calibration tokens", tokens),
                "calibrate on at least 2 tokens (a few thousand give a stable basis)");
  return from_covariance(key_covariance(keys, tokens, channels, skip, count), channels);
}

std::vector<float> KltBasis::variances() const {
  std::vector<float> out(values_.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(std::max(0.0, values_[i]));
  return out;
}

void KltBasis::apply(const double* x, double* out) const {
  const auto d = static_cast<std::size_t>(channels_);
  for (std::size_t c = 0; c < d; ++c) {
    const double* v = rows_.data() + c * d;
    // Four independent sums keep the loop from waiting on one addition chain.
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    std::size_t j = 0;
    for (; j + 4 <= d; j += 4) {
      s0 += v[j] * x[j];
      s1 += v[j + 1] * x[j + 1];
      s2 += v[j + 2] * x[j + 2];
      s3 += v[j + 3] * x[j + 3];
    }
    for (; j < d; ++j) s0 += v[j] * x[j];
    out[c] = (s0 + s1) + (s2 + s3);
  }
}

void KltBasis::rotate(const float* in, float* out, std::int64_t count) const {
  const auto d = static_cast<std::size_t>(channels_);
  std::vector<double> x(d), y(d);
  for (std::int64_t r = 0; r < count; ++r) {
    const float* src = in + static_cast<std::size_t>(r) * d;
    for (std::size_t j = 0; j < d; ++j) x[j] = src[j];
    apply(x.data(), y.data());
    float* dst = out + static_cast<std::size_t>(r) * d;
    for (std::size_t j = 0; j < d; ++j) dst[j] = static_cast<float>(y[j]);
  }
}

void KltBasis::rotate_keys(const std::uint16_t* keys, std::uint16_t* out,
                           std::int64_t count) const {
  HISPARSE_FUNC_RANGE();
  const auto d = static_cast<std::size_t>(channels_);
  std::vector<double> x(d), y(d);
  for (std::int64_t r = 0; r < count; ++r) {
    const std::uint16_t* src = keys + static_cast<std::size_t>(r) * d;
    for (std::size_t j = 0; j < d; ++j) x[j] = bf16_to_float(src[j]);
    apply(x.data(), y.data());
    std::uint16_t* dst = out + static_cast<std::size_t>(r) * d;
    for (std::size_t j = 0; j < d; ++j) dst[j] = float_to_bf16(static_cast<float>(y[j]));
  }
}

double KltBasis::orthonormality_error() const {
  const auto d = static_cast<std::size_t>(channels_);
  double worst = 0;
  // (V^T V)_ij = sum_c V_ic V_jc = sum_c rows[c][i] rows[c][j].
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < d; ++j) {
      double s = 0;
      for (std::size_t c = 0; c < d; ++c) s += rows_[c * d + i] * rows_[c * d + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

}  // namespace hisparse::fathom
