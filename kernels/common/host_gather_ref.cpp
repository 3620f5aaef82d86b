#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/common/host_gather.hpp"

namespace hisparse::kernels {

const char* host_read_method_name(HostReadMethod method) noexcept {
  return method == HostReadMethod::bulk_async ? "bulk_async" : "sm_loads";
}

void check_host_gather(const HostGatherArgs& a) {
  const char* where = "host gather";
  if (a.rows < 0)
    throw Error(where, "negative row count " + std::to_string(a.rows), "pass rows >= 0");
  if (a.rows == 0) return;
  if (a.src == nullptr || a.dst == nullptr)
    throw Error(where, "source or destination is null", "pass both buffers");
  if (a.row_bytes == 0 || a.row_bytes % 16 != 0)
    throw Error(where, "row of " + std::to_string(a.row_bytes) + " bytes",
                "use rows of a positive multiple of 16 bytes");
  if (a.src_stride < a.row_bytes || a.dst_stride < a.row_bytes || a.src_stride % 16 != 0 ||
      a.dst_stride % 16 != 0)
    throw Error(where,
                "strides " + std::to_string(a.src_stride) + " / " + std::to_string(a.dst_stride) +
                    " for rows of " + std::to_string(a.row_bytes) + " bytes",
                "use strides that are multiples of 16 and at least the row");
  if (reinterpret_cast<std::uintptr_t>(a.src) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(a.dst) % 16 != 0)
    throw Error(where, "source or destination not 16-byte aligned", "align both bases to 16 bytes");
}

void host_gather_ref(const HostGatherArgs& a) {
  check_host_gather(a);
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const std::int64_t from = a.src_rows ? a.src_rows[i] : i;
    std::memcpy(a.dst + static_cast<std::size_t>(i) * a.dst_stride,
                a.src + static_cast<std::size_t>(from) * a.src_stride, a.row_bytes);
  }
}

}  // namespace hisparse::kernels
