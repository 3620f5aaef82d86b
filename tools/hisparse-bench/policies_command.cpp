// `hisparse-bench policies`: the replacement-policy study over recorded selections (text traces
// from `run --save-selections`, or top-k indices dumped as .npy by a serving engine). Every view
// (terminal, --json, and with --out policies.json, policies.md, policies.html) is rendered from
// one document (report/policy_report.hpp).
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "hotcache/policy_study.hpp"
#include "report/atomic_file.hpp"
#include "report/policy_report.hpp"

namespace hisparse::cli {
namespace {

void check_options(const PoliciesOptions& p) {
  if (p.hots.empty())
    throw Error("--hot", "no hot-buffer size was given",
                "give the slots to study, e.g. --hot 2048,4096,6144");
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
  check_options(p);
  std::vector<ReplacementPolicy> policies;
  for (const auto& name : p.policies) policies.push_back(parse_policy(name, "--policies"));
  // The folder first, so that a bad --out fails before the replays.
  const std::filesystem::path out(o.out);
  if (!out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec)
      throw Error("--out", fmt::format("cannot create {} ({})", out.string(), ec.message()),
                  "give a folder that can be written");
  }

  std::vector<NamedTrace> streams;
  for (const auto& t : p.traces)
    for (auto& named : read_selection_streams(t, p.seq_len, "--seq-len"))
      streams.push_back(std::move(named));
  const PolicyStudy study = study_policies(streams, {.hots = p.hots,
                                                     .hots_source = "--hot",
                                                     .policies = policies,
                                                     .seed = p.seed,
                                                     .warmup_steps = p.warmup_steps,
                                                     .threads = p.threads});
  const nlohmann::json doc = policy_study_json(study, streams,
                                               {.inputs = p.traces,
                                                .first_seq_len = p.seq_len,
                                                .warmup_steps = p.warmup_steps,
                                                .row_bytes = p.row_bytes,
                                                .pcie_gbps = p.pcie_gbps,
                                                .seed = p.seed,
                                                .command_line = o.command_line});
  if (!out.empty()) {
    write_file_atomically(out / "policies.json", doc.dump(2) + "\n");
    write_file_atomically(out / "policies.md", policy_study_markdown(doc));
    write_file_atomically(out / "policies.html", policy_study_html(doc));
  }
  if (o.json) {
    print_json(doc);
  } else {
    fmt::print("{}", policy_study_text(doc));
    if (!out.empty())
      fmt::print("written to {}: policies.json, policies.md, policies.html\n", out.string());
  }
  return exit_code::ok;
}

}  // namespace hisparse::cli
