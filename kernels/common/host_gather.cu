#include "kernels/common/host_gather.hpp"

#include <algorithm>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/device_cache.hpp"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/common/host_gather_config.hpp"

namespace hisparse::kernels {
namespace {
namespace cfg = host_gather_config;

// Rows [begin, end) of block `block` of `blocks`: one contiguous range each.
__device__ __forceinline__ void block_rows(std::int64_t rows, std::int64_t& begin,
                                           std::int64_t& end) {
  begin = rows * blockIdx.x / gridDim.x;
  end = rows * (blockIdx.x + 1) / gridDim.x;
}

__device__ __forceinline__ const std::uint8_t* source_row(const HostGatherArgs& a, std::int64_t i) {
  const std::int64_t from = a.src_rows ? a.src_rows[i] : i;
  return a.src + static_cast<std::size_t>(from) * a.src_stride;
}

__global__ void __launch_bounds__(cfg::kSmThreads) gather_sm_loads(HostGatherArgs a) {
  std::int64_t begin = 0, end = 0;
  block_rows(a.rows, begin, end);
  const auto per_row = static_cast<unsigned>(a.row_bytes / 16);
  const auto units = static_cast<unsigned>((end - begin) * per_row);
  for (unsigned u0 = threadIdx.x; u0 < units; u0 += cfg::kSmThreads * cfg::kSmUnroll) {
    uint4 v[cfg::kSmUnroll];
    uint4* to[cfg::kSmUnroll];
#pragma unroll
    for (int j = 0; j < cfg::kSmUnroll; ++j) {
      const unsigned u = u0 + j * cfg::kSmThreads;
      if (u < units) {
        const unsigned r = u / per_row, k = u - r * per_row;
        const std::int64_t i = begin + r;
        v[j] = reinterpret_cast<const uint4*>(source_row(a, i))[k];
        to[j] = reinterpret_cast<uint4*>(a.dst + static_cast<std::size_t>(i) * a.dst_stride) + k;
      }
    }
#pragma unroll
    for (int j = 0; j < cfg::kSmUnroll; ++j)
      if (u0 + j * cfg::kSmThreads < units) *to[j] = v[j];
  }
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// One warp per block; lane L gathers rows begin + L, + lanes, ... with cfg::kBulkStages rows in
// flight, each in its own shared-memory slot with its own mbarrier (count 1: the lane's
// expect-tx arrival; the bulk load completes the transaction bytes).
__global__ void __launch_bounds__(32) gather_bulk_async(HostGatherArgs a, int lanes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = static_cast<int>(threadIdx.x);
  if (lane >= lanes) return;
  auto* bars = reinterpret_cast<std::uint64_t*>(smem);
  unsigned char* slots = smem + cfg::bulk_barrier_bytes(lanes);
  const auto row = static_cast<unsigned>(a.row_bytes);
  // Slot s of this lane: its mbarrier and its row buffer.
  const unsigned bar0 = shared_address(bars + lane * cfg::kBulkStages);
  const unsigned buf0 =
      shared_address(slots + static_cast<std::size_t>(lane) * cfg::kBulkStages * row);
  const auto bar = [bar0](int s) { return bar0 + 8u * static_cast<unsigned>(s); };
  const auto buf = [buf0, row](int s) { return buf0 + row * static_cast<unsigned>(s); };
  for (int s = 0; s < cfg::kBulkStages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar(s)) : "memory");
  // The inits must be visible to the async proxy (the bulk copies complete on these barriers).
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");

  std::int64_t begin = 0, end = 0;
  block_rows(a.rows, begin, end);
  const std::int64_t first = begin + lane;
  const std::int64_t mine = first < end ? (end - first + lanes - 1) / lanes : 0;
  auto issue = [&](std::int64_t k, int s) {
    const std::uint8_t* src = source_row(a, first + k * lanes);
    asm volatile(
        "{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}" ::
            "r"(bar(s)),
        "r"(row)
        : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(buf(s)),
        "l"(src), "r"(row), "r"(bar(s))
        : "memory");
  };
  for (int s = 0; s < cfg::kBulkStages && s < mine; ++s) issue(s, s);
  for (std::int64_t k = 0; k < mine; ++k) {
    const int s = static_cast<int>(k % cfg::kBulkStages);
    const auto parity = static_cast<unsigned>((k / cfg::kBulkStages) & 1);
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], "
        "%1;\n @!done bra WAIT_%=;\n}" ::"r"(bar(s)),
        "r"(parity)
        : "memory");
    std::uint8_t* dst = a.dst + static_cast<std::size_t>(first + k * lanes) * a.dst_stride;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                 "r"(buf(s)), "r"(row)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (k + cfg::kBulkStages < mine) {
      // The slot is refilled only after the store has read it.
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      issue(k + cfg::kBulkStages, s);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  (void)a;
  (void)lanes;
#endif
}

}  // namespace

int host_gather_default_blocks_per_sm(HostReadMethod method) noexcept {
  return method == HostReadMethod::bulk_async ? cfg::kBulkBlocksPerSm : cfg::kSmBlocksPerSm;
}

void launch_host_gather(const HostGatherArgs& args, HostReadMethod method, int blocks,
                        cudaStream_t stream) {
  check_host_gather(args);
  if (args.rows == 0) return;
  if (blocks <= 0) blocks = multiprocessors() * host_gather_default_blocks_per_sm(method);
  if (method == HostReadMethod::sm_loads) {
    gather_sm_loads<<<static_cast<unsigned>(blocks), cfg::kSmThreads, 0, stream>>>(args);
    HISPARSE_CUDA_CHECK_LAUNCH();
    return;
  }
  const int lanes = cfg::bulk_lanes(args.row_bytes);
  if (lanes == 0)
    throw Error("host gather: bulk_async",
                "rows of " + std::to_string(args.row_bytes) + " bytes do not fit " +
                    std::to_string(cfg::kBulkStages) + " slots in shared memory",
                "use sm_loads for rows this large");
  const std::size_t shared = cfg::bulk_shared_bytes(lanes, args.row_bytes);
  allow_dynamic_shared(gather_bulk_async, shared);
  gather_bulk_async<<<static_cast<unsigned>(blocks), 32, shared, stream>>>(args, lanes);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
