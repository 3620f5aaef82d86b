// Google Benchmark JSON (`hisparse-microbench --benchmark_out=F --benchmark_out_format=json`) read
// as the gate reads it: per case, the time of every repetition in microseconds, and the device
// the run names in its context (hisparse-microbench writes hisparse_device and hisparse_backend).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse {

/// Whether `doc` is a Google Benchmark output document (a "benchmarks" array).
[[nodiscard]] bool is_benchmark_document(const nlohmann::json& doc);

struct BenchmarkRuns {
  std::string label;     ///< the file(s) it came from
  std::string device;    ///< context.hisparse_device; "" when the build did not record one
  std::string backend;   ///< context.hisparse_backend; "" likewise
  std::string revision;  ///< context.hisparse_git_revision, else "unknown"
  std::string date;      ///< context.date
  /// Per case (the run name up to "/iterations", "/repeats", "/manual_time" or "/real_time"),
  /// every repetition's value of each counter, and "us_per_call" (the counter when the benchmark
  /// set it, else real_time in microseconds). Aggregates (mean, median, stddev) and failed runs
  /// are left out: the gate wants the repetitions themselves.
  std::map<std::string, std::map<std::string, std::vector<double>>> cases;
  std::vector<std::string> order;  ///< case names in first-seen order
};

/// Reads one document; `label` names it in messages. Throws Error for a document that is not a
/// Google Benchmark output.
[[nodiscard]] BenchmarkRuns read_benchmark_runs(const nlohmann::json& doc,
                                                const std::string& label);

/// Pools several runs of one build (repetitions from several files): their cases' samples are
/// concatenated. Throws Error naming both files when they ran on different devices.
void pool_benchmark_runs(BenchmarkRuns& into, const BenchmarkRuns& more);

/// The case name of a Google Benchmark run name, e.g. "swap_in/batch:1/iterations:20/manual_time"
/// -> "swap_in/batch:1".
[[nodiscard]] std::string benchmark_case_name(const std::string& run_name);

}  // namespace hisparse
