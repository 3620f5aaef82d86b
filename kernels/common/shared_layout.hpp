// Byte offsets of the regions of one block's dynamic shared memory, laid out one after another on
// 16-byte boundaries (so that 16-byte loads and cp.async may use any region).
#pragma once

#include <cstdint>

namespace hisparse::kernels {

[[nodiscard]] constexpr std::int64_t align16(std::int64_t x) {
  return (x + 15) / 16 * 16;
}

class SharedLayout {
 public:
  /// Offset of the next region, `bytes` long.
  std::int64_t take(std::int64_t bytes) {
    const std::int64_t at = end_;
    end_ = align16(end_ + bytes);
    return at;
  }
  /// Bytes taken so far (a multiple of 16).
  [[nodiscard]] std::int64_t size() const noexcept { return end_; }

 private:
  std::int64_t end_ = 0;
};

}  // namespace hisparse::kernels
