// The views of a policy study (`hisparse-bench policies`): one JSON document (what --json prints
// and policies.json holds), and the terminal table, policies.md and policies.html rendered from
// it alone, so that every view shows the same figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hotcache/policy_study.hpp"

namespace hisparse {

/// What a policy study was run on and how its misses are costed.
struct PolicyStudySetup {
  std::vector<std::string> inputs;  ///< the files, as given
  std::int64_t first_seq_len = 0;   ///< an .npy's first step's length; 0: none given
  std::int64_t warmup_steps = 0;
  int row_bytes = 656;      ///< bytes of one missed row
  double pcie_gbps = 55.1;  ///< the ceiling the transfer-time column assumes
  std::uint64_t seed = 1;
  std::string command_line;
};

/// The document: provenance (backend cpu, the note on estimated times), the setup, the streams'
/// names, and one cell per (hot, policy): hits, misses, miss_rate, optimal_miss_rate (Belady at
/// the same hot size when the study ran it, else null), rows_per_step, bytes_per_step,
/// pcie_us_per_step (per decode step: every stream of the step together), the worst stream and
/// each stream's hits and misses.
[[nodiscard]] nlohmann::json policy_study_json(const PolicyStudy& study,
                                               const std::vector<NamedTrace>& streams,
                                               const PolicyStudySetup& setup);

/// The terminal view: a summary line, a fixed-width table, the note on what the figures are.
[[nodiscard]] std::string policy_study_text(const nlohmann::json& doc);
/// policies.md: the same table in Markdown under a header naming the inputs and the backend.
[[nodiscard]] std::string policy_study_markdown(const nlohmann::json& doc);
/// policies.html: a self-contained page with miss rate and PCIe time per step against the hot
/// size, one line per policy, and the table.
[[nodiscard]] std::string policy_study_html(const nlohmann::json& doc);

}  // namespace hisparse
