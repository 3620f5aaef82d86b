// Host-plane staging for the plane scan (PlaneStaging in plane_scan.hpp): the copy that moves
// one decode step's active plane runs and scales from mapped pinned host memory to HBM, round by
// round, while the scan consumes the rounds already landed. The copy runs inside the scan kernel
// (its first blocks to start take the copy role, plane_stage.cuh); this header sizes it and
// offers the copy alone for diagnostics.
#pragma once

#include <cstdint>

#include "core/stream.hpp"
#include "kernels/fathom/fathom_math.hpp"
#include "kernels/fathom/plane_scan.hpp"

namespace hisparse::kernels::fathom {

/// Shared memory of one stream's unit table in a copy block: unit codes (up to 4 per channel),
/// slot channels and infos, counts, and the depths.
HISPARSE_HD std::int64_t stage_table_bytes(int channels) {
  return (static_cast<std::int64_t>(kPlanes + 2) * channels + 4) * 4 + (channels + 15) / 16 * 16;
}
/// Shared memory a copy block needs: the tables of the streams it serves.
inline std::int64_t stage_copy_shared_bytes(const PlaneScanArgs& a, const PlaneStaging& st) {
  const int lanes = st.copy_blocks / st.parts;
  return static_cast<std::int64_t>((a.streams + lanes - 1) / lanes) *
         stage_table_bytes(a.layout.channels);
}

#if HISPARSE_WITH_CUDA
/// Throws Error unless ws.staging is complete and fits `a` (host layout, max_tokens set).
void check_staging(const PlaneScanArgs& a, const PlaneScanWorkspace& ws);
/// Zeroes the round flags and the role ticket (before every staged scan or copy).
void reset_staging(const PlaneScanArgs& a, const PlaneScanWorkspace& ws, cudaStream_t stream);
/// Diagnostic: the staging copy alone (ws.staging.copy_blocks blocks of kStageThreads), the
/// same bytes and flags as inside the scan. For timing the copy apart from the scan.
void launch_plane_stage(const PlaneScanArgs& args, const PlaneScanWorkspace& ws,
                        cudaStream_t stream);
#endif

}  // namespace hisparse::kernels::fathom
