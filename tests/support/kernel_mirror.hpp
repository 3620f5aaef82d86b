// Helpers of the kernel-vs-twin GPU tests: a fixture with a stream (skipped without a GPU), a host
// vector with its device copy, random normal inputs, and the error relative to a result's scale.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "support/gpu.hpp"

namespace hisparse::test {

#if HISPARSE_WITH_CUDA
/// A test with a CUDA stream `s()`, skipped with a message where no GPU is usable.
class GpuStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HISPARSE_REQUIRE_GPU();
    stream_.emplace(Backend::cuda);  // made after the check: without a GPU there is no stream
  }
  [[nodiscard]] cudaStream_t s() const { return stream_->native(); }

 private:
  std::optional<Stream> stream_;
};

// A host vector and its device copy.
template <class T>
class Mirror {
 public:
  explicit Mirror(std::vector<T> host)
      : host_(std::move(host)),
        device_(Buffer<T>::device(std::max<std::size_t>(host_.size(), 1), Backend::cuda, "test")) {
    copy_bytes(device_.device_data(), host_.data(), host_.size() * sizeof(T), Backend::cuda);
  }
  [[nodiscard]] T* dev() const noexcept { return device_.device_data(); }
  [[nodiscard]] T* host() noexcept { return host_.data(); }
  [[nodiscard]] std::vector<T> fetch() const {
    std::vector<T> out(host_.size());
    HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
    copy_bytes(out.data(), device_.device_data(), out.size() * sizeof(T), Backend::cuda);
    return out;
  }

 private:
  std::vector<T> host_;
  Buffer<T> device_;
};

inline std::vector<float> normal(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// max |a - b| / max(1, max |b|): a tolerance relative to the result's scale.
inline double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, mag = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b[i])));
  }
  return diff / mag;
}

#endif

}  // namespace hisparse::test
