// Gathers rows of mapped pinned host memory into device memory, by either of the two ways an SM
// can read host memory without the copy engines (which cannot be driven by GPU-computed row
// lists without a host round trip):
//  - sm_loads: every thread issues 16-byte loads (several in flight) and stores them; the way the
//    swap-in copy and the Fathom plane staging read host memory.
//  - bulk_async: one lane per row issues a cp.async.bulk (the Hopper TMA's 1-D bulk copy) of the
//    whole row into shared memory, waits on an mbarrier and writes the row out with a bulk store;
//    a few rows per lane in flight.
// Both produce the same bytes; hisparse-microbench host_gather/... measures which one reaches
// more of the PCIe ceiling on the same rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

enum class HostReadMethod : std::uint8_t { sm_loads, bulk_async };

[[nodiscard]] const char* host_read_method_name(HostReadMethod method) noexcept;

struct HostGatherArgs {
  const std::uint8_t* src =
      nullptr;                 ///< device address of mapped pinned memory (host address on the CPU)
  std::size_t src_stride = 0;  ///< bytes between source rows
  const std::int32_t* src_rows = nullptr;  ///< [rows] source row of each output row; null: row i
  std::uint8_t* dst = nullptr;             ///< device memory (host memory for the twin)
  std::size_t dst_stride = 0;              ///< bytes between destination rows
  std::size_t row_bytes = 0;  ///< bytes per row: a multiple of 16, like both strides and bases
  std::int64_t rows = 0;
};

/// Throws Error naming what is wrong (alignment, sizes) when `args` cannot be gathered.
void check_host_gather(const HostGatherArgs& args);

#if HISPARSE_WITH_CUDA
/// Blocks the launcher uses per SM for `method` when asked for 0.
[[nodiscard]] int host_gather_default_blocks_per_sm(HostReadMethod method) noexcept;
/// Gathers args.rows rows with `blocks` blocks (0: the method's default for this GPU). Each block
/// takes one contiguous range of the rows, so its reads stay in one stretch of the source.
void launch_host_gather(const HostGatherArgs& args, HostReadMethod method, int blocks,
                        cudaStream_t stream);
#endif
/// CPU twin: dst row i = src row src_rows[i] (or i), row_bytes bytes.
void host_gather_ref(const HostGatherArgs& args);

}  // namespace hisparse::kernels
