#include "fathom/plane_scan.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

PlaneScan::PlaneScan(Backend backend) : backend_(backend) {
  if (backend_ == Backend::cuda) multiprocessors_ = Device::cuda().properties().multiprocessors;
}

kf::PlaneScanArgs PlaneScan::args_for(const PlaneStore& store) {
  kf::PlaneScanArgs a;
  a.words = store.words();
  a.scales = store.scales();
  a.layout = store.layout();
  a.lengths = store.lengths();
  a.streams = store.streams();
  a.max_tokens = store.max_length();
  return a;
}

void PlaneScan::set_variant(int variant) {
  kf::check_scan_variant(variant, "fathom scan: variant");
  variant_ = variant;
}

void PlaneScan::set_multiprocessors(int count) {
  if (count < 1)
    throw Error("fathom scan: multiprocessors", fmt::format("{} SMs", count),
                "plan for at least one SM");
  multiprocessors_ = count;
}

void PlaneScan::run(const kf::PlaneScanArgs& args, int budget, NativeStream stream,
                    std::span<const std::int32_t> head_budgets) {
  HISPARSE_RANGE("fathom_scan_select", Phase::scan);
  // Planned on both backends: it also rejects shapes the kernel cannot take.
  kf::HostStaging staging = host_staging_;
  staging.enabled = staging.enabled && backend_ == Backend::cuda;
  [[maybe_unused]] kf::PlaneScanWorkspace ws =
      kf::plan_scan_workspace(args, budget, multiprocessors_, variant_, staging, head_budgets);
  if (backend_ == Backend::cpu) {
    kf::plane_scan_select_ref(args);
    return;
  }
#if HISPARSE_WITH_CUDA
  // Device buffers grow on demand and are kept across calls (no allocation in a steady decode).
  const auto grow = [&](auto& buffer, std::int64_t n, const char* label) {
    return buffer.reserve_device(static_cast<std::size_t>(n), backend_, label);
  };
  ws.candidates = grow(candidates_, ws.candidate_words(args), "fathom scan candidates");
  ws.candidate_counts = grow(counts_, ws.count_entries(args), "fathom scan counts");
  if (ws.record_bytes > 0)
    ws.records = grow(records_, ws.record_bytes_total(args), "fathom scan records");
  if (kf::PlaneStaging& st = ws.staging; st.copy_blocks > 0) {
    // One step's active planes in HBM; the flags end with the copy blocks' role ticket.
    st.words = grow(staged_words_, st.word_count(args.streams), "fathom staged planes");
    st.scales = grow(staged_scales_, st.scale_count(args.streams), "fathom staged scales");
    st.landed = grow(landed_, st.flag_count(args.streams) + 1, "fathom staging flags");
    st.ticket = st.landed + st.flag_count(args.streams);
  }
  if (args.seed_range != nullptr && !ws.staging.enabled()) {
    // Zero once when allocated; every launch's finalize zeroes the entries it used.
    const auto entries = static_cast<std::size_t>(args.streams) * args.heads;
    const bool fresh = seed_hits_.size() < entries;
    ws.seed_hits = grow(seed_hits_, static_cast<std::int64_t>(entries), "fathom seed hits");
    if (fresh) zero_bytes(ws.seed_hits, seed_hits_.size() * sizeof(std::int32_t), backend_);
    ws.rescan_candidates =
        grow(rescan_candidates_, ws.candidate_words(args), "fathom scan rescan lists");
    ws.rescan_counts = grow(rescan_counts_, ws.count_entries(args), "fathom scan rescan counts");
  }
  ws_ = ws;
  kf::launch_plane_scan_select(args, ws, stream);
#else
  (void)stream;
#endif
}

}  // namespace hisparse::fathom
