// `hisparse-bench gate BASELINE RESULTS...`: the CI regression gate (lib/report/gate.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "commands.hpp"
#include "core/error.hpp"
#include "report/atomic_file.hpp"
#include "report/gate.hpp"
#include "report/html_report.hpp"

namespace hisparse::cli {
namespace {

/// gate.json, gate.md and, when a results baseline was judged, report.html: the baseline and
/// the new run as two series with the verdicts marked.
void write_gate_files(const GateOutcome& outcome, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(dir.string(), "cannot create the output folder (" + ec.message() + ")",
                "choose a writable folder with --out DIR");
  write_file_atomically(dir / "gate.json", to_json(outcome).dump(2) + "\n");
  write_file_atomically(dir / "gate.md", gate_markdown(outcome));
  if (const nlohmann::json overlay = gate_overlay(outcome); !overlay.is_null())
    write_file_atomically(dir / "report.html", html_report(overlay));
}

}  // namespace

int gate_command(const GateArgs& args, const CommonOptions& o) {
  const GateSpec gate = load_gate(args.baseline);
  std::vector<std::filesystem::path> inputs(args.inputs.begin(), args.inputs.end());
  if (args.update) {
    // Show what the refresh changes (for baselines that exist), then write it.
    GateSpec existing = gate;
    std::erase_if(existing.baselines, [](const GateBaseline& b) {
      std::error_code ec;
      return !std::filesystem::exists(b.file, ec);
    });
    GateOptions lenient;
    lenient.allow_different_devices = true;
    lenient.allow_different_scenarios = true;
    if (!existing.baselines.empty() && !o.quiet && !o.json) {
      try {
        fmt::print("{}", gate_text(run_gate(existing, inputs, lenient)));
      } catch (const Error& e) {
        // An input of a new baseline matches none of the existing ones: nothing to show.
        std::fprintf(stderr, "note: not compared before the update: %s\n", e.what());
      }
    }
    const auto written = update_gate_baselines(gate, inputs);
    if (o.json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& w : written) j.push_back(w.string());
      print_json({{"updated", j}});
    } else if (!o.quiet) {
      for (const auto& w : written) fmt::print("updated {}\n", w.string());
    }
    return exit_code::ok;
  }
  GateOptions options;
  options.allow_different_devices = args.allow_different_devices;
  const GateOutcome outcome = run_gate(gate, inputs, options);
  if (!o.out.empty()) write_gate_files(outcome, o.out);
  if (o.json) {
    print_json(to_json(outcome));
  } else if (!o.quiet) {
    fmt::print("{}", gate_text(outcome, args.all));
    if (outcome.failed()) {
      std::string command = "hisparse-bench gate " + args.baseline;
      for (const auto& i : args.inputs) command += " " + i;
      fmt::print("If the change is intended, refresh the baseline: {} --update\n", command);
    }
  }
  return outcome.failed() ? exit_code::point_failed : exit_code::ok;
}

}  // namespace hisparse::cli
