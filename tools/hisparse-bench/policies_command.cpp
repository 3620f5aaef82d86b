// `hisparse-bench policies`: the replacement-policy study over recorded selections (text traces
// from `run --save-selections`, or top-k indices dumped as .npy by a serving engine), as a table
// per hot-buffer size and policy: miss rate, the gap to Belady's optimum, the worst stream, and
// what the misses cost per decode step in rows, bytes and transfer time at a PCIe ceiling.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "hotcache/policy_study.hpp"

namespace hisparse::cli {
namespace {

// What a cell's misses cost per decode step (every stream of the step together).
struct StepCost {
  double rows = 0, bytes = 0, pcie_us = 0;
};
StepCost step_cost(const PolicyStudyCell& cell, const PolicyStudy& study,
                   const PoliciesOptions& p) {
  StepCost c;
  if (study.counted_steps <= 0) return c;
  c.rows = static_cast<double>(cell.total.misses) / static_cast<double>(study.counted_steps);
  c.bytes = c.rows * p.row_bytes;
  c.pcie_us = c.bytes / (p.pcie_gbps * 1e3);  // GB/s = 1e3 B/us
  return c;
}

void check_options(const PoliciesOptions& p, bool any_npy) {
  if (p.hots.empty())
    throw Error("--hot", "no hot-buffer size was given",
                "give the slots to study, e.g. --hot 2048,4096,6144");
  if (any_npy && p.seq_len < 1)
    throw Error("--seq-len", "an .npy of top-k positions does not say how long the sequences were",
                "give the sequence length at the first recorded step, e.g. --seq-len 32768 (it "
                "grows by one per step)");
  if (p.warmup_steps < 0)
    throw Error("--warmup-steps", fmt::format("{} is negative", p.warmup_steps),
                "give 0 or more steps");
  if (p.row_bytes < 1)
    throw Error("--row-bytes", fmt::format("{} is not a row size", p.row_bytes),
                "give the bytes of one KV row, e.g. 656 (MLA fp8)");
  if (!(p.pcie_gbps > 0))
    throw Error("--pcie-gbps", fmt::format("{} is not a bandwidth", p.pcie_gbps),
                "give the host-to-device copy ceiling in GB/s, e.g. 55.1");
}

}  // namespace

int policies_command(const PoliciesOptions& p, const CommonOptions& o) {
  bool any_npy = false;
  for (const auto& t : p.traces)
    any_npy = any_npy || std::filesystem::path(t).extension() == ".npy";
  check_options(p, any_npy);
  std::vector<ReplacementPolicy> policies;
  for (const auto& name : p.policies) policies.push_back(parse_policy(name, "--policies"));

  std::vector<NamedTrace> streams;
  for (const auto& t : p.traces)
    for (auto& named : read_selection_streams(t, p.seq_len)) streams.push_back(std::move(named));
  const PolicyStudy study = study_policies(streams, {.hots = p.hots,
                                                     .hots_source = "--hot",
                                                     .policies = policies,
                                                     .seed = p.seed,
                                                     .warmup_steps = p.warmup_steps,
                                                     .threads = p.threads});
  std::int64_t widest = 0;
  for (const auto& named : streams)
    for (const auto& step : named.trace.steps)
      widest = std::max(widest, static_cast<std::int64_t>(step.selected.size()));

  const auto optimum_of = [&](const PolicyStudyCell& cell) -> const PolicyStudyCell* {
    return study.find(cell.hot, ReplacementPolicy::belady);
  };
  constexpr const char* kNote =
      "CPU replay of recorded selections (backend cpu); rows, bytes and transfer time per decode "
      "step sum every stream of the step, the time is the bytes at the given PCIe ceiling, an "
      "estimate rather than a measurement";

  if (o.json) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& named : streams) names.push_back(named.name);
    nlohmann::json cells = nlohmann::json::array();
    for (const auto& cell : study.cells) {
      const StepCost cost = step_cost(cell, study, p);
      const PolicyStudyCell* optimum = optimum_of(cell);
      nlohmann::json per_stream = nlohmann::json::array();
      for (const auto& s : cell.per_stream)
        per_stream.push_back({{"hits", s.hits}, {"misses", s.misses}});
      const std::size_t worst = cell.worst_stream();
      cells.push_back({{"hot", cell.hot},
                       {"policy", std::string(name_of(cell.policy))},
                       {"hits", cell.total.hits},
                       {"misses", cell.total.misses},
                       {"miss_rate", cell.total.miss_rate()},
                       {"optimal_miss_rate", optimum ? nlohmann::json(optimum->total.miss_rate())
                                                     : nlohmann::json(nullptr)},
                       {"rows_per_step", cost.rows},
                       {"bytes_per_step", cost.bytes},
                       {"pcie_us_per_step", cost.pcie_us},
                       {"worst_stream", streams[worst].name},
                       {"worst_miss_rate", cell.per_stream[worst].miss_rate()},
                       {"per_stream", per_stream}});
    }
    print_json({{"backend", "cpu"},
                {"note", kNote},
                {"inputs", p.traces},
                {"streams", names},
                {"first_seq_len", p.seq_len > 0 ? nlohmann::json(p.seq_len) : nlohmann::json()},
                {"warmup_steps", p.warmup_steps},
                {"counted_steps", study.counted_steps},
                {"stream_steps", study.stream_steps},
                {"widest_selection", widest},
                {"row_bytes", p.row_bytes},
                {"pcie_gbps", p.pcie_gbps},
                {"seed", p.seed},
                {"cells", cells}});
    return exit_code::ok;
  }

  fmt::print(
      "Replacement policies over recorded selections: {} stream(s), {} decode step(s) "
      "counted after {} warm-up, selections of up to {} positions\n",
      study.streams, study.counted_steps, p.warmup_steps, widest);
  fmt::print("{:>7}  {:<8} {:>10} {:>12} {:>12} {:>10} {:>13}  {}\n", "hot", "policy", "miss rate",
             "over belady", "rows/step", "MB/step", "PCIe us/step", "worst stream (miss rate)");
  for (const auto& cell : study.cells) {
    const StepCost cost = step_cost(cell, study, p);
    const PolicyStudyCell* optimum = optimum_of(cell);
    const std::size_t worst = cell.worst_stream();
    const std::string over =
        cell.policy == ReplacementPolicy::belady ? "optimum"
        : optimum
            ? fmt::format("{:+.2f} pt", 100 * (cell.total.miss_rate() - optimum->total.miss_rate()))
            : std::string("-");
    fmt::print("{:>7}  {:<8} {:>9.2f}% {:>12} {:>12.1f} {:>10.3f} {:>13.2f}  {} ({:.2f}%)\n",
               cell.hot, name_of(cell.policy), 100 * cell.total.miss_rate(), over, cost.rows,
               cost.bytes / 1e6, cost.pcie_us, streams[worst].name,
               100 * cell.per_stream[worst].miss_rate());
  }
  fmt::print("{}; rows of {} B, PCIe {} GB/s\n", kNote, p.row_bytes, p.pcie_gbps);
  return exit_code::ok;
}

}  // namespace hisparse::cli
