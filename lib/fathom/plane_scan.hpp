// PlaneScan: runs the fused scan + selection over a PlaneStore on the store's backend (the CUDA
// kernels, or the CPU twin), owning the kernels' workspace. Works for both plane layouts: on the
// host layout the kernel reads the active runs straight from mapped pinned memory.
#pragma once

#include <cstdint>
#include <span>

#include "core/memory.hpp"
#include "core/stream.hpp"
#include "fathom/plane_store.hpp"
#include "kernels/fathom/plane_scan.hpp"

namespace hisparse::fathom {

class PlaneScan {
 public:
  explicit PlaneScan(Backend backend);
  /// Fills the store's fields of `args` (words, scales, layout, lengths, max_tokens when 0).
  [[nodiscard]] static kernels::fathom::PlaneScanArgs args_for(const PlaneStore& store);
  /// Runs on `stream`; `budget` bounds the sum of depths of every stream (sizes the tile).
  /// With args.seed_range set (kernels::fathom::PlaneScanArgs) the CUDA scan is seeded and
  /// rescans the streams whose seed it could not prove; the CPU twin ignores the seeds. Either
  /// way the selection is the same.
  /// `head_budgets` (optional): stream s's budget is head_budgets[s % size]; unequal ones give
  /// streams with larger budgets more, shorter chunks (plan_scan_workspace).
  void run(const kernels::fathom::PlaneScanArgs& args, int budget, NativeStream stream = nullptr,
           std::span<const std::int32_t> head_budgets = {});
  /// Selects a kernel variant (kernels/fathom/plane_scan_config.hpp kScanVariants; 0 is the
  /// default). Every variant gives the same selection; they differ in residency and speed.
  /// Throws Error for an index that does not exist.
  void set_variant(int variant);
  [[nodiscard]] int variant() const noexcept { return variant_; }
  /// Plans chunks for `count` SMs instead of the device's (the scan sharing the GPU with other
  /// kernels; tests use it to plan several waves for short streams). Throws Error below 1.
  void set_multiprocessors(int count);
  [[nodiscard]] int multiprocessors() const noexcept { return multiprocessors_; }
  /// Host-layout planes on the GPU: stage each step's active planes into HBM with a copy kernel
  /// that runs beside the scan (kernels::fathom::PlaneStaging; the default), or let the scan read
  /// mapped host memory itself (false). Both give the same selection. `copy_blocks` and
  /// `rounds_per_copy` tune the copy (0: the defaults of plane_scan_config.hpp).
  void set_host_staging(bool on, int copy_blocks = 0, int rounds_per_copy = 0) noexcept {
    host_staging_ = {on, copy_blocks, rounds_per_copy, host_staging_.copy_clock};
  }
  [[nodiscard]] bool host_staging() const noexcept { return host_staging_.enabled; }
  /// Diagnostic: 2 unsigned 64-bit words of device memory where the staging copy records the
  /// span of its transfer (kernels::fathom::PlaneStaging::copy_clock); null turns it off.
  void set_copy_clock(unsigned long long* device_words) noexcept {
    host_staging_.copy_clock = device_words;
  }
  [[nodiscard]] const kernels::fathom::PlaneScanWorkspace& workspace() const noexcept {
    return ws_;
  }

 private:
  Backend backend_;
  int multiprocessors_ = 132;
  int variant_ = 0;
  kernels::fathom::HostStaging host_staging_{true, 0, 0};
  kernels::fathom::PlaneScanWorkspace ws_;
  Buffer<std::uint64_t> candidates_;
  Buffer<std::int32_t> counts_;
  Buffer<std::int32_t> seed_hits_;  ///< PlaneScanWorkspace::seed_hits, when a run is seeded
  /// PlaneScanWorkspace::rescan_candidates / rescan_counts, when a run is seeded
  Buffer<std::uint64_t> rescan_candidates_;
  Buffer<std::int32_t> rescan_counts_;
  Buffer<std::uint8_t> records_;  ///< PlaneScanWorkspace::records (planes not staged)
  Buffer<std::uint64_t> staged_words_;
  Buffer<std::uint16_t> staged_scales_;
  Buffer<std::int32_t> landed_;
};

}  // namespace hisparse::fathom
