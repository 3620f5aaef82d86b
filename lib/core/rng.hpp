// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so the
// same seed gives the same data on the CPU and in CUDA kernels, in any order and any thread count.
// Normals use the Irwin-Hall sum of four 24-bit uniforms: integer arithmetic plus one rounding,
// hence bit-identical on both backends (tails end at +-3.46 sigma, enough for synthetic data).
#pragma once

#include <cstdint>

#include "core/config.hpp"

namespace hisparse {

HISPARSE_HD std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// 64 random bits for element `index` of stream `seed`.
HISPARSE_HD std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) {
  return splitmix64(splitmix64(seed) ^ (index * 0xd1342543de82ef95ull));
}
/// Uniform in [0, 1) with 24 bits.
HISPARSE_HD float random_uniform(std::uint64_t seed, std::uint64_t index) {
  return static_cast<float>(random_bits(seed, index) >> 40) * 5.9604644775390625e-8f;
}
/// Approximately standard normal (mean 0, variance 1), identical on every backend.
HISPARSE_HD float random_normal(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t a = random_bits(seed, 2 * index);
  const std::uint64_t b = random_bits(seed, 2 * index + 1);
  const std::int64_t sum = static_cast<std::int64_t>((a & 0xffffffull) + ((a >> 32) & 0xffffffull) +
                                                     (b & 0xffffffull) + ((b >> 32) & 0xffffffull));
  // (sum - 2 * 2^24) / (2^24 * sqrt(1/3)), the divisor folded into one exact-rounded multiply.
  return static_cast<float>(sum - 33554432ll) * 1.0323827e-7f;
}

/// Sequential convenience wrapper over the counter-based functions.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : seed_(seed) {}
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t next_bits() { return random_bits(seed_, counter_++); }
  float uniform() { return random_uniform(seed_, counter_++); }
  float normal() { return random_normal(seed_, counter_++); }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next_bits() % n; }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

}  // namespace hisparse
