// HostKvPool: the full KV cache of every request in pinned, mapped host memory (zero-copy readable
// by the swap-in kernel). Each (request, layer) owns one contiguous region of `capacity` rows, so a
// request's misses stay inside a few tens of MB of host memory (REFERENCE.md section 4: host page
// translation, not PCIe, limits scattered gathers). The token -> row map of a request is the
// identity within its region: token t of request r in layer l is row
//   ((r * layers + l) * capacity + t) * row_stride.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/memory.hpp"
#include "kernels/hotcache/swap_in.hpp"

namespace hisparse {

/// Row padding: none keeps rows packed (656 B rows are 16-B aligned anyway; 584 B rows are not);
/// align16/align64 pad the stride so that every row starts on that boundary and the swap-in copies
/// whole 16-B vectors (the padding travels with the row).
enum class RowPadding { none, align16, align64 };

[[nodiscard]] std::size_t padded_row_stride(std::size_t row_bytes, RowPadding padding) noexcept;

struct HostKvPoolShape {
  int requests = 1;
  int layers = 1;
  std::int64_t capacity = 0;  ///< rows per (request, layer): the longest sequence served
  std::size_t row_bytes = 0;  ///< 656 (MLA fp8), 1152 (MLA bf16), 584 (DSv4 C4), GQA K+V ...
  RowPadding padding = RowPadding::none;
};

class HostKvPool {
 public:
  /// Pins requests * layers * capacity * row_stride bytes. Throws Error naming the size and what
  /// is free when the host cannot pin it, or naming the field when the shape is invalid.
  HostKvPool(const HostKvPoolShape& shape, Backend backend);

  [[nodiscard]] const HostKvPoolShape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t row_stride() const noexcept { return row_stride_; }
  /// Bytes copied per row by the swap-in: the stride when padded (whole vectors), else row_bytes.
  [[nodiscard]] std::size_t copy_bytes() const noexcept;
  [[nodiscard]] std::size_t region_bytes() const noexcept;  ///< one (request, layer)
  [[nodiscard]] std::size_t bytes() const noexcept { return alloc_.bytes(); }
  [[nodiscard]] Backend backend() const noexcept { return alloc_.backend(); }

  /// Host address of token `token`'s row of (request, layer).
  [[nodiscard]] std::uint8_t* row(int request, int layer, std::int64_t token) const;
  /// The layer as the swap-in kernel addresses it (device addresses on the CUDA backend).
  [[nodiscard]] kernels::HostPoolView layer_view(int layer) const;

 private:
  HostKvPoolShape shape_;
  std::size_t row_stride_ = 0;
  Allocation alloc_;
};

}  // namespace hisparse
