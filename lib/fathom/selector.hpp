// FathomSelector: the per-step entry point an engine calls per (request, layer, KV head) group:
// plan depths from the queries, scan the planes, select sinks + recent + top (k - 36) per query
// head, unioned over the GQA group. Then exact attention over the selected rows.
// With SelectorConfig::klt the store holds keys rotated into each stream's KLT basis
// (KltBasis::rotate_keys before PlaneStore::append); select() rotates the queries into the same
// basis and plans with the eigenvalues as variances.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fathom/depth_planner.hpp"
#include "fathom/klt.hpp"
#include "fathom/plane_scan.hpp"
#include "fathom/plane_store.hpp"

namespace hisparse::fathom {

struct SelectorConfig {
  int top_k = 512;
  int sinks = 4;
  int recent = 32;
  int budget = 48;   ///< plane bits per token per KV head
  bool klt = false;  ///< plan and scan in the KLT bases given to set_klt_bases()
  /// measured: depths and gained queries planned on the backend (DepthPlanner::plan_measured)
  /// from select()'s read calibrations, the scan reading with the gained queries (PlanRule in
  /// depth_planner.hpp).
  PlanRule rule = PlanRule::paper;
  /// Seeded selection (kernels::fathom::PlaneScanArgs::seed_range): each select() seeds the scan
  /// with the previous call's (keep-th, top) scores of every head, lowered by seed_margin x their
  /// difference. The CUDA scan then skips most candidate work and rescans a stream whose seed was
  /// too high, so the selection never changes. Meant for decode steps over the same streams;
  /// a call with another stream or head count starts unseeded.
  bool seeded = false;
  float seed_margin = 0.5f;
  [[nodiscard]] int keep() const noexcept { return top_k - sinks - recent; }
  /// Rows one selection of a KV stream can hold: the sinks, the recent window and each of the
  /// `group` query heads' own top tokens, when no two heads share one.
  [[nodiscard]] int max_rows(int group) const noexcept { return sinks + recent + group * keep(); }
};

class FathomSelector {
 public:
  FathomSelector(Backend backend, SelectorConfig config);

  /// KLT bases for config().klt: stream s uses bases[s % bases.size()] (one per KV head, like the
  /// variances). The store must hold keys rotated by the same bases.
  void set_klt_bases(std::vector<KltBasis> bases);

  /// Selects for every stream of `store`. `queries` [streams][heads][head_dim] and `variances`
  /// [variance_period][head_dim] are host memory. Returns per stream the ascending positions.
  /// With config().klt, `queries` are unrotated, and `variances` / `variance_period` are unused
  /// (the bases' eigenvalues are the variances). With PlanRule::measured, `reads` are the packed
  /// read calibrations of the stored keys on this backend (stream s uses row s % period) and the
  /// variances are unused. `budgets` (host memory, optional) gives each row of that period (the
  /// variance rows, KLT bases or read tables: one per KV head) its own plane budget in place of
  /// config().budget; the scan is then sized for the largest.
  [[nodiscard]] std::vector<std::vector<std::int32_t>> select(
      const PlaneStore& store, const float* queries, int heads, const float* variances,
      int variance_period, const ReadTables* reads = nullptr,
      std::span<const std::int32_t> budgets = {});
  /// Depths of the last select() ([streams][head_dim]).
  [[nodiscard]] const std::vector<std::uint8_t>& last_depths() const noexcept {
    return depths_host_;
  }
  [[nodiscard]] const SelectorConfig& config() const noexcept { return config_; }

 private:
  Backend backend_;
  SelectorConfig config_;
  DepthPlanner planner_;
  PlaneScan scan_;
  std::vector<std::uint8_t> depths_host_;
  std::vector<KltBasis> klt_bases_;
  // Kept across select() calls (grown on demand): a steady decode step allocates nothing and
  // creates no stream.
  Stream stream_;
  Buffer<float> queries_, gained_, variances_;
  Buffer<std::uint8_t> depths_;
  Buffer<std::int32_t> selected_, counts_, budgets_;
  Buffer<float> score_range_;  ///< seeded: [streams][heads][2] of the last call
  std::size_t score_range_entries_ = 0;
  std::vector<float> rotated_, eigen_variances_;
  std::vector<std::int32_t> selected_host_, counts_host_;
};

/// Exact scores q_h . k_i of bf16 keys [n][d] for queries [heads][d]: out[h * n + i].
void exact_scores(const float* queries, int heads, const std::uint16_t* keys, std::int64_t n, int d,
                  float* out);

/// Softmax attention with scale 1/sqrt(d) of every head over the rows at `positions` (all rows
/// when empty) of bf16 keys/values [n][d]: out [heads][d].
void attention_over(const float* queries, int heads, const std::uint16_t* keys,
                    const std::uint16_t* values, std::int64_t n, int d,
                    std::span<const std::int32_t> positions, float* out);

}  // namespace hisparse::fathom
