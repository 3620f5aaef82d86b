// KltBasis: the calibration eigenbasis (Karhunen-Loeve transform) of one KV head's keys, for
// models without QK-norm. Their key channels are correlated, so per-channel variances are flat
// and reverse water-filling has little to work with; in the eigenbasis of the key covariance the
// channels are uncorrelated and their variances (the eigenvalues) spread over decades.
//
// Use: rotate every key (k' = V^T k) before it is quantized into the PlaneStore and every query
// (q' = V^T q) before planning and scanning; V is orthonormal, so q'.k' = q.k up to rounding, and
// the planner's variances are the eigenvalues. Exact attention still reads the original rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace hisparse::fathom {

/// Eigen-decomposition of a real symmetric matrix.
struct SymmetricEigen {
  std::vector<double> values;   ///< [n], descending
  std::vector<double> vectors;  ///< [n][n]: row i is the unit eigenvector of values[i]
  int sweeps = 0;               ///< Jacobi sweeps it took
};

/// Cyclic Jacobi eigensolver in double precision. `matrix` [n][n] row-major must be symmetric
/// (within 1e-9 of its largest entry) and finite; throws Error otherwise. Eigenvalues sorted
/// descending (ties keep index order); in each eigenvector the first entry of largest magnitude
/// (within 1e-9 relative) is positive, so the result is deterministic.
[[nodiscard]] SymmetricEigen jacobi_eigen(std::span<const double> matrix, int n,
                                          int max_sweeps = 64);

/// Centred covariance [channels][channels] of bf16 keys [tokens][channels] over tokens
/// [skip, skip + count) (fewer if the sequence is short; all tokens if fewer than 2 remain).
[[nodiscard]] std::vector<double> key_covariance(const std::uint16_t* keys, std::int64_t tokens,
                                                 int channels, int skip, std::int64_t count);

class KltBasis {
 public:
  /// The identity basis (rotation is a no-op, eigenvalues 1).
  [[nodiscard]] static KltBasis identity(int channels);
  /// Eigenbasis of a symmetric covariance [channels][channels].
  [[nodiscard]] static KltBasis from_covariance(std::span<const double> covariance, int channels);
  /// Eigenbasis of the calibration keys: tokens [skip, skip + count) of bf16 keys
  /// [tokens][channels] (the first tokens are attention sinks with atypical keys).
  [[nodiscard]] static KltBasis calibrate(const std::uint16_t* keys, std::int64_t tokens,
                                          int channels, int skip = 16, std::int64_t count = 4096);

  [[nodiscard]] int channels() const noexcept { return channels_; }
  /// Variances of the rotated channels, descending.
  [[nodiscard]] std::span<const double> eigenvalues() const noexcept { return values_; }
  /// V^T [channels][channels]: row c is the eigenvector that rotated channel c projects on.
  [[nodiscard]] std::span<const double> rows() const noexcept { return rows_; }
  /// The eigenvalues as the planner's Var(k'_j) (float, negatives from rounding clamped to 0).
  [[nodiscard]] std::vector<float> variances() const;

  /// out[r] = V^T in[r] for `count` vectors of `channels` floats (in and out must not overlap).
  void rotate(const float* in, float* out, std::int64_t count) const;
  /// Rotated bf16 keys: out[r] = bf16(V^T k[r]) for `count` rows (in and out must not overlap).
  void rotate_keys(const std::uint16_t* keys, std::uint16_t* out, std::int64_t count) const;
  /// Largest |(V^T V - I)_ij|.
  [[nodiscard]] double orthonormality_error() const;

 private:
  KltBasis(int channels, std::vector<double> values, std::vector<double> rows);
  /// Dot products of every row of V^T with `x` (double accumulation) into `out`.
  void apply(const double* x, double* out) const;

  int channels_ = 0;
  std::vector<double> values_;
  std::vector<double> rows_;
};

}  // namespace hisparse::fathom
