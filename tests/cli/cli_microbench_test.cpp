// hisparse-microbench's provenance (the device, versions and revision every JSON output records)
// and .ci/bench-compare, the gate that compares two sets of microbenchmark runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/result_set.hpp"
#include "core/device.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;

TEST(CliMicrobench, RecordsWhereItsFiguresComeFrom) {
#ifndef HISPARSE_MICROBENCH_EXE
  GTEST_SKIP() << "SKIPPED: hisparse-microbench is not built (HISPARSE_BUILD_BENCH is off)";
#else
  TempDir dir;
  fs::create_directories(dir.path);
  const fs::path out = dir.path / "microbench.json";
  // One quick case: on a GPU it runs (one replay), without one it records why it could not.
  const auto r =
      run_command("HISPARSE_MICROBENCH_ITERS=1 " + std::string(HISPARSE_MICROBENCH_EXE) +
                  " --benchmark_filter='^fathom_plan/batch:1/' --benchmark_out=" + out.string() +
                  " --benchmark_out_format=json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = read_json(out);
  const auto& context = json.at("context");
  EXPECT_EQ(context.at("hisparse_version"), HISPARSE_VERSION);
  EXPECT_EQ(context.at("hisparse_git_revision"), git_revision());
  std::string why;
  if (cuda_available(&why)) {
    EXPECT_EQ(context.at("hisparse_backend"), "cuda");
    EXPECT_EQ(context.at("hisparse_device"), Device::cuda().properties().name);
    EXPECT_TRUE(context.contains("hisparse_cuda_driver"));
    EXPECT_FALSE(json.at("benchmarks").at(0).value("error_occurred", false));
  } else {
    EXPECT_EQ(context.at("hisparse_backend"), "none");
    EXPECT_EQ(context.at("hisparse_device"), "none: " + why);
    const auto& run = json.at("benchmarks").at(0);
    EXPECT_TRUE(run.at("error_occurred").get<bool>());
    EXPECT_EQ(run.at("error_message"), "fathom_plan needs a GPU: " + why);
  }
  EXPECT_NE(r.output.find("hisparse_device:"), std::string::npos) << r.output;
#endif
}

// A hand-made --benchmark_out file: one case at `us` microseconds per call on `device`.
fs::path bench_file(const fs::path& dir, const std::string& name, const std::string& device,
                    double us) {
  const nlohmann::json j = {
      {"context", {{"hisparse_device", device}, {"hisparse_git_revision", std::string(40, 'a')}}},
      {"benchmarks",
       {{{"name", "swap_in/batch:1/iterations:30/manual_time"},
         {"run_type", "iteration"},
         {"real_time", us},
         {"time_unit", "us"},
         {"us_per_call", us}}}}};
  const fs::path p = dir / name;
  std::ofstream(p) << j.dump();
  return p;
}

CommandResult bench_compare(const fs::path& base, const fs::path& next, const std::string& extra) {
  return run_command("python3 " + std::string(HISPARSE_SOURCE_DIR) + "/.ci/bench-compare --base " +
                     base.string() + " --new " + next.string() + extra);
}

TEST(CliMicrobench, BenchCompareGatesOneDeviceAndRefusesTwo) {
  if (run_command("python3 --version").exit_code != 0)
    GTEST_SKIP() << "SKIPPED: python3 is not installed, so .ci/bench-compare cannot run";
  TempDir dir;
  fs::create_directories(dir.path);
  const auto base = bench_file(dir.path, "base.json", "NVIDIA H200", 100.0);
  const auto same = bench_file(dir.path, "same.json", "NVIDIA H200", 101.0);
  const auto slower = bench_file(dir.path, "slower.json", "NVIDIA H200", 120.0);
  const auto other = bench_file(dir.path, "other.json", "NVIDIA H100 80GB HBM3", 120.0);

  auto r = bench_compare(base, same, "");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| swap_in/batch:1 | 100 | 101 | +1.0% | 0.0% | same |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("base: " + base.string() + " (NVIDIA H200, git aaaaaaaaaaaa)"),
            std::string::npos)
      << r.output;

  r = bench_compare(base, slower, "");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("| +20.0% | 0.0% | slower |"), std::string::npos) << r.output;

  r = bench_compare(base, other, "");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: the files ran on different devices (" + base.string() +
                          ": NVIDIA H200; " + other.string() +
                          ": NVIDIA H100 80GB HBM3); compare runs of one device, or pass "
                          "--allow-different-devices\n");

  r = bench_compare(base, other, " --allow-different-devices");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("| +20.0% | 0.0% | slower |"), std::string::npos) << r.output;

  // A file from a build older than the provenance context names no device: compared with any.
  nlohmann::json old = read_json(same);
  old.erase("context");
  const fs::path unnamed = dir.path / "old.json";
  std::ofstream(unnamed) << old.dump();
  r = bench_compare(unnamed, other, "");
  EXPECT_EQ(r.exit_code, 1) << r.output;  // compared: 101 -> 120 us is slower
  EXPECT_NE(r.output.find("| +18.8% | 0.0% | slower |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(device not recorded, git unknown)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hisparse::test
