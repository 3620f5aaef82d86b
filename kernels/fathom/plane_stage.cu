// The diagnostic copy-only kernel of the host-plane staging (plane_stage.hpp): the copy role of
// plane_stage.cuh alone, so that a benchmark can time the copy apart from the scan.
#include "kernels/fathom/plane_stage.hpp"

#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/fathom/plane_stage.cuh"

namespace hisparse::kernels::fathom {
namespace {

__global__ void __launch_bounds__(kStageThreads)
    stage_copy_kernel(PlaneScanArgs a, PlaneStaging st, int chunks, int tile_blocks) {
  extern __shared__ __align__(16) unsigned char smem[];
  stage_detail::stage_copy_block<kStageThreads>(a, st, chunks, tile_blocks,
                                                static_cast<int>(blockIdx.x), smem);
}

}  // namespace

void check_staging(const PlaneScanArgs& a, const PlaneScanWorkspace& ws) {
  const PlaneStaging& st = ws.staging;
  if (st.landed == nullptr || st.scales == nullptr || st.ticket == nullptr || st.copy_blocks < 1 ||
      st.rounds < 1 || st.parts < 1 || st.copy_blocks % st.parts != 0 || st.rounds_per_copy < 1)
    throw Error("fathom scan: staging", "the host staging area is incomplete",
                "size it with plan_scan_workspace(..., {true}) and set its buffers");
  if (a.layout.kind != PlaneLayoutKind::host)
    throw Error("fathom scan: staging", "staging copies host-layout planes only",
                "leave the staging empty for HBM planes");
  if (a.max_tokens <= 0 || (a.max_tokens + kBlockTokens - 1) / kBlockTokens > st.blocks_cap)
    throw Error("fathom scan: staging",
                "max_tokens " + std::to_string(a.max_tokens) +
                    " does not match the staging area's " + std::to_string(st.blocks_cap) +
                    " blocks",
                "set max_tokens (>= every length) before plan_scan_workspace()");
}

void reset_staging(const PlaneScanArgs& a, const PlaneScanWorkspace& ws, cudaStream_t stream) {
  // The flags and the role ticket are one array (ticket last).
  HISPARSE_CUDA_CHECK(cudaMemsetAsync(
      ws.staging.landed, 0,
      static_cast<std::size_t>(ws.staging.flag_count(a.streams) + 1) * sizeof(std::int32_t),
      stream));
}

void launch_plane_stage(const PlaneScanArgs& a, const PlaneScanWorkspace& ws, cudaStream_t stream) {
  const PlaneStaging& st = ws.staging;
  if (!st.enabled() || a.streams == 0) return;
  check_staging(a, ws);
  const auto shared = static_cast<std::size_t>(stage_copy_shared_bytes(a, st));
  allow_dynamic_shared(stage_copy_kernel, shared);
  reset_staging(a, ws, stream);
  stage_copy_kernel<<<static_cast<unsigned>(st.copy_blocks), kStageThreads, shared, stream>>>(
      a, st, ws.chunks, ws.tile_blocks);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
