// Key transforms before quantization. KLT basis: the Jacobi eigensolver on hand-worked matrices,
// orthonormality, dot products preserved by the rotation, calibration covariance, and the
// selector's KLT option. KeyCentre: the calibration mean, hand-worked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "fathom/key_centre.hpp"
#include "fathom/klt.hpp"
#include "fathom/selector.hpp"
#include "fathom/synthetic_keys.hpp"

namespace hisparse::fathom {
namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(FathomKlt, HandWorked2x2) {
  // [[2, 1], [1, 2]]: eigenvalues 3 (along (1, 1)/sqrt 2) and 1 (along (1, -1)/sqrt 2; the sign
  // rule makes the first of two equal-magnitude entries positive).
  const auto eig = jacobi_eigen(std::vector<double>{2, 1, 1, 2}, 2);
  const double r = 1.0 / std::sqrt(2.0);
  ASSERT_EQ(eig.values.size(), 2u);
  EXPECT_NEAR(eig.values[0], 3.0, 1e-14);
  EXPECT_NEAR(eig.values[1], 1.0, 1e-14);
  const std::vector<double> expect = {r, r, r, -r};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(eig.vectors[i], expect[i], 1e-14) << i;
  EXPECT_EQ(eig.sweeps, 1);  // one rotation zeroes a 2x2 exactly
  // Already diagonal: no rotation, sorted descending (channel 1 first), sign made positive.
  const auto diag = jacobi_eigen(std::vector<double>{4, 0, 0, 9}, 2);
  EXPECT_EQ(diag.sweeps, 0);
  EXPECT_EQ(diag.values, (std::vector<double>{9, 4}));
  EXPECT_EQ(diag.vectors, (std::vector<double>{0, 1, 1, 0}));
}

TEST(FathomKlt, HandWorkedTridiagonal3x3) {
  // The second-difference matrix: eigenvalues 2 + sqrt 2, 2, 2 - sqrt 2 with eigenvectors
  // (1, -sqrt 2, 1)/2, (1, 0, -1)/sqrt 2, (1, sqrt 2, 1)/2.
  const auto eig = jacobi_eigen(std::vector<double>{2, -1, 0, -1, 2, -1, 0, -1, 2}, 3);
  const double s2 = std::sqrt(2.0);
  EXPECT_NEAR(eig.values[0], 2 + s2, 1e-13);
  EXPECT_NEAR(eig.values[1], 2.0, 1e-13);
  EXPECT_NEAR(eig.values[2], 2 - s2, 1e-13);
  // First largest-magnitude entry positive: -sqrt2/2 in the first vector -> flipped.
  const std::vector<double> expect = {-0.5, s2 / 2, -0.5, 1 / s2, 0, -1 / s2, 0.5, s2 / 2, 0.5};
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(eig.vectors[i], expect[i], 1e-13) << i;
}

TEST(FathomKlt, RecoversDiagonalPlusRotation) {
  // A = R D R^T with R a product of Givens rotations of known angles: the eigenvalues are D
  // sorted, the eigenvectors the columns of R (up to sign).
  const int n = 5;
  const std::vector<double> d = {0.5, 7.0, 2.0, 30.0, 0.01};
  std::vector<double> rot(n * n, 0.0);
  for (int i = 0; i < n; ++i) rot[i * n + i] = 1.0;
  const auto givens = [&](int p, int q, double angle) {  // rot = rot * G(p, q, angle)
    const double c = std::cos(angle), s = std::sin(angle);
    for (int k = 0; k < n; ++k) {
      const double a = rot[k * n + p], b = rot[k * n + q];
      rot[k * n + p] = c * a - s * b;
      rot[k * n + q] = s * a + c * b;
    }
  };
  givens(0, 1, 0.3), givens(1, 3, -1.1), givens(2, 4, 0.7), givens(0, 4, 2.0), givens(1, 2, 0.45);
  std::vector<double> a(n * n, 0.0);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      for (int k = 0; k < n; ++k) a[r * n + c] += rot[r * n + k] * d[k] * rot[c * n + k];
  const auto basis = KltBasis::from_covariance(a, n);
  const std::vector<int> order = {3, 1, 2, 0, 4};  // D descending
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(basis.eigenvalues()[i], d[order[i]], 1e-12) << i;
    double dot = 0;
    for (int k = 0; k < n; ++k) dot += basis.rows()[i * n + k] * rot[k * n + order[i]];
    EXPECT_NEAR(std::abs(dot), 1.0, 1e-12) << i;
  }
  EXPECT_LT(basis.orthonormality_error(), 1e-13);
}

/// bf16 keys [tokens][d] with correlated channels: a random mixing of sources whose standard
/// deviations span two decades.
std::vector<std::uint16_t> correlated_keys(std::int64_t tokens, int d, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> mix(static_cast<std::size_t>(d) * d), sigma(d);
  for (auto& m : mix) m = rng.normal() / std::sqrt(static_cast<double>(d));
  for (int j = 0; j < d; ++j) sigma[j] = std::pow(10.0, -2.0 * j / d);
  std::vector<std::uint16_t> keys(static_cast<std::size_t>(tokens) * d);
  std::vector<double> src(d);
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int j = 0; j < d; ++j) src[j] = sigma[j] * rng.normal();
    for (int r = 0; r < d; ++r) {
      double k = 0;
      for (int j = 0; j < d; ++j) k += mix[r * d + j] * src[j];
      keys[i * d + r] = float_to_bf16(static_cast<float>(k));
    }
  }
  return keys;
}

TEST(FathomKlt, CalibratedBasisIsOrthonormalAndPreservesDotProducts) {
  const int d = 128;
  const std::int64_t n = 2048;
  const auto keys = correlated_keys(n, d, 7);
  const auto basis = KltBasis::calibrate(keys.data(), n, d);
  EXPECT_LT(basis.orthonormality_error(), 1e-9);
  EXPECT_TRUE(std::is_sorted(basis.eigenvalues().rbegin(), basis.eigenvalues().rend()));
  // q'.k' = q.k within 1e-5 of |q||k| for random queries and the calibration keys.
  Rng rng(11);
  std::vector<float> q(4 * d), qr(q.size()), k(d), kr(d);
  for (auto& x : q) x = static_cast<float>(rng.normal());
  basis.rotate(q.data(), qr.data(), 4);
  double worst = 0;
  for (std::int64_t i = 0; i < n; i += 97) {
    for (int j = 0; j < d; ++j) k[j] = bf16_to_float(keys[i * d + j]);
    basis.rotate(k.data(), kr.data(), 1);
    for (int h = 0; h < 4; ++h) {
      double dot = 0, dot_r = 0, qq = 0, kk = 0;
      for (int j = 0; j < d; ++j) {
        dot += static_cast<double>(q[h * d + j]) * k[j];
        dot_r += static_cast<double>(qr[h * d + j]) * kr[j];
        qq += static_cast<double>(q[h * d + j]) * q[h * d + j];
        kk += static_cast<double>(k[j]) * k[j];
      }
      worst = std::max(worst, std::abs(dot - dot_r) / std::sqrt(qq * kk));
    }
  }
  EXPECT_LT(worst, 1e-5);
  // The rotated channels are uncorrelated with the eigenvalues as their variances (within the
  // rounding of the bf16 rotated keys).
  std::vector<std::uint16_t> rotated(keys.size());
  basis.rotate_keys(keys.data(), rotated.data(), n);
  const auto cov = key_covariance(rotated.data(), n, d, 16, 4096);
  for (int i = 0; i < d; i += 9) {
    const double lambda = basis.eigenvalues()[i];
    EXPECT_NEAR(cov[i * d + i], lambda, 0.02 * lambda) << i;
    for (int j = 0; j < d; j += 13) {
      if (j == i) continue;
      EXPECT_LT(std::abs(cov[i * d + j]), 0.02 * std::sqrt(lambda * basis.eigenvalues()[j]) + 1e-6)
          << i << " " << j;
    }
  }
  // Eigenvalues span the sources' four decades of variance.
  EXPECT_GT(basis.eigenvalues()[0] / basis.eigenvalues()[d - 1], 1e3);
}

TEST(FathomKlt, CovarianceSkipsTheFirstTokensAndIsCentred) {
  // Tokens 0, 1 are sinks (100, 100); then (3, 1), (1, 1), (2, 3), (2, -1): mean (2, 1),
  // centred (1, 0), (-1, 0), (0, 2), (0, -2) -> covariance diag(0.5, 2).
  const std::vector<float> raw = {100, 100, 100, 100, 3, 1, 1, 1, 2, 3, 2, -1};
  std::vector<std::uint16_t> keys(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) keys[i] = float_to_bf16(raw[i]);
  EXPECT_EQ(key_covariance(keys.data(), 6, 2, 2, 4096), (std::vector<double>{0.5, 0, 0, 2}));
  const auto basis = KltBasis::calibrate(keys.data(), 6, 2, 2, 4096);
  EXPECT_EQ(std::vector<double>(basis.eigenvalues().begin(), basis.eigenvalues().end()),
            (std::vector<double>{2, 0.5}));
  EXPECT_EQ(basis.variances(), (std::vector<float>{2, 0.5}));
  // A diagonal covariance gives a permutation: rotated channel 0 is input channel 1.
  std::vector<float> k = {5, 7}, kr(2);
  basis.rotate(k.data(), kr.data(), 1);
  EXPECT_EQ(kr, (std::vector<float>{7, 5}));
}

TEST(FathomKlt, IdentityBasisLeavesVectorsAlone) {
  const auto basis = KltBasis::identity(3);
  std::vector<float> x = {1.5f, -2.0f, 0.25f}, y(3);
  basis.rotate(x.data(), y.data(), 1);
  EXPECT_EQ(x, y);
  EXPECT_EQ(basis.variances(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(basis.orthonormality_error(), 0.0);
}

TEST(FathomKlt, BadMatricesAreNamed) {
  EXPECT_EQ(error_of([] {
              (void)jacobi_eigen(std::vector<double>{1, 2, 3, 1}, 2);
            }),
            "KLT eigensolver: the matrix is not symmetric at (0, 1); pass a covariance matrix");
  EXPECT_EQ(error_of([] {
              (void)jacobi_eigen(std::vector<double>{1, 2, 3}, 2);
            }),
            "KLT eigensolver: 3 entries for a 2x2 matrix; pass n * n = 4 entries");
  EXPECT_EQ(error_of([] {
              (void)jacobi_eigen(std::vector<double>{1, 0, 0, NAN}, 2);
            }),
            "KLT eigensolver: the matrix has a non-finite entry; check the calibration keys for "
            "NaN or infinity");
  const std::vector<std::uint16_t> one(4, 0);
  EXPECT_EQ(error_of([&] { (void)KltBasis::calibrate(one.data(), 1, 4); }),
            "KLT calibration: 1 calibration tokens; calibrate on at least 2 tokens (a few "
            "thousand give a stable basis)");
}

TEST(FathomKlt, SelectorOptionNeedsBasesOfTheRightSize) {
  const int d = 8;
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, d, 128);
  std::vector<std::uint16_t> keys(128 * d, float_to_bf16(1.0f));
  store.append(0, 1, keys.data(), d, 0, 128);
  std::vector<float> q(d, 1.0f);
  SelectorConfig cfg{64, 4, 32, 16};
  EXPECT_EQ(error_of([&] { FathomSelector(Backend::cpu, cfg).set_klt_bases({}); }),
            "fathom selector: klt: KLT bases were given but the selector's klt option is off; set "
            "SelectorConfig::klt = true");
  cfg.klt = true;
  FathomSelector selector(Backend::cpu, cfg);
  EXPECT_EQ(error_of([&] { (void)selector.select(store, q.data(), 1, nullptr, 1); }),
            "fathom selector: klt: KLT is on but no basis was given; call set_klt_bases() with "
            "bases calibrated on this layer's keys");
  selector.set_klt_bases({KltBasis::identity(4)});
  EXPECT_EQ(error_of([&] { (void)selector.select(store, q.data(), 1, nullptr, 1); }),
            "fathom selector: klt: a KLT basis has 4 channels, the store 8; calibrate the bases on "
            "keys of this head_dim");
}

TEST(FathomKlt, SelectorWithIdentityBasesMatchesUnitVariances) {
  // Identity bases: the same queries and variances 1, so the same depths and selection as the
  // plain selector given unit variances; two streams with different bases per stream period.
  const int d = 16, heads = 2;
  const std::int64_t n = 512;
  Rng rng(3);
  std::vector<std::uint16_t> keys(2 * n * d);
  for (auto& k : keys) k = float_to_bf16(static_cast<float>(rng.normal()));
  std::vector<float> q(2 * heads * d);
  for (auto& x : q) x = static_cast<float>(rng.normal());
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 2, d, n);
  store.append(0, 2, keys.data(), d, n * d, n);
  const std::vector<float> ones(d, 1.0f);
  FathomSelector plain(Backend::cpu, SelectorConfig{100, 4, 32, 24});
  const auto expect = plain.select(store, q.data(), heads, ones.data(), 1);
  SelectorConfig cfg{100, 4, 32, 24};
  cfg.klt = true;
  FathomSelector klt(Backend::cpu, cfg);
  klt.set_klt_bases({KltBasis::identity(d), KltBasis::identity(d)});
  EXPECT_EQ(klt.select(store, q.data(), heads, nullptr, 0), expect);
  EXPECT_EQ(klt.last_depths(), plain.last_depths());
}

TEST(FathomKlt, CorrelatedProfileIsTheIndependentOneMixed) {
  // Same seed: keys and queries are the independent workload times one orthogonal matrix, so
  // every score q.k is the same (up to bf16 rounding of the keys) while the channel variances,
  // spread over decades in the independent profile, come out flat.
  SyntheticKeySpec spec;
  spec.profile = KeyProfile::independent;
  spec.tokens = 1024;
  spec.steps = 1;
  const auto plain = make_synthetic_keys(spec);
  spec.profile = KeyProfile::correlated;
  const auto mixed = make_synthetic_keys(spec);
  const int d = spec.channels, heads = spec.heads;
  std::vector<float> s_plain(static_cast<std::size_t>(heads) * spec.tokens),
      s_mixed(s_plain.size());
  exact_scores(plain.query(0), heads, plain.keys.data(), spec.tokens, d, s_plain.data());
  exact_scores(mixed.query(0), heads, mixed.keys.data(), spec.tokens, d, s_mixed.data());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < s_plain.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(s_plain[i] - s_mixed[i])));
    scale = std::max(scale, static_cast<double>(std::abs(s_plain[i])));
  }
  EXPECT_LT(worst, 0.02 * scale);
  EXPECT_GT(worst, 0.0);  // the keys really differ
  const auto spread = [](const std::vector<float>& v) {
    return *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end());
  };
  EXPECT_GT(spread(plain.variance), 300.0);
  EXPECT_LT(spread(mixed.variance), 30.0);
  // The KLT basis of the mixed keys recovers the sources' spread of variances.
  const auto basis = KltBasis::calibrate(mixed.keys.data(), spec.tokens, d);
  const auto recovered = basis.variances();
  EXPECT_GT(spread(recovered), 0.5 * spread(plain.variance));
}

TEST(FathomKeyCentre, CalibrationMeanHandWorked) {
  // 2 channels, 5 tokens; skip 1, count 3: tokens 1..3 give means (2, -4), token 0 and 4 unused.
  const std::vector<float> k = {100, 100, 1, -3, 2, -4, 3, -5, 50, 50};
  std::vector<std::uint16_t> bf(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) bf[i] = float_to_bf16(k[i]);
  const KeyCentre c = KeyCentre::calibrate(bf.data(), 5, 2, 1, 3);
  ASSERT_EQ(c.channels(), 2);
  EXPECT_EQ(c.mean()[0], 2.0f);
  EXPECT_EQ(c.mean()[1], -4.0f);
  std::vector<std::uint16_t> out(bf.size());
  c.apply(bf.data(), out.data(), 5);
  const std::vector<float> want = {98, 104, -1, 1, 0, 0, 1, -1, 48, 54};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(bf16_to_float(out[i]), want[i]) << i;
  c.apply(bf.data(), bf.data(), 5);  // in place
  EXPECT_EQ(bf, out);
  // Fewer than 2 tokens after skip: every token (mean of 1 and 3 is 2).
  const std::vector<std::uint16_t> two = {float_to_bf16(1), float_to_bf16(3)};
  EXPECT_EQ(KeyCentre::calibrate(two.data(), 2, 1, 16, 100).mean()[0], 2.0f);
  const KeyCentre none = KeyCentre::none(2);
  std::vector<std::uint16_t> copy(2);
  none.apply(two.data(), copy.data(), 1);
  EXPECT_EQ(copy, std::vector<std::uint16_t>(two.begin(), two.begin() + 2));
}

}  // namespace
}  // namespace hisparse::fathom
