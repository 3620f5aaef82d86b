// hisparse-microbench's provenance (the device, versions and revision every JSON output records)
// and reports/grid_tables.py, which pivots a sweep into a table. The gate over its JSON is tested
// in cli_gate_test.cpp.
#include <fmt/format.h>
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

TEST(CliMicrobench, CodeFetchFamiliesPairEveryCaseWithItsCodeEvictedTwin) {
#ifndef HISPARSE_MICROBENCH_EXE
  GTEST_SKIP() << "SKIPPED: hisparse-microbench is not built (HISPARSE_BUILD_BENCH is off)";
#else
  // `.ci/device-check code-fetch` pivots these families by path and by icache: every case comes
  // with the SMs' instruction caches kept and evicted, and swap_in_code with both resolve kernels.
  auto list = [](const std::string& filter) {
    const auto r = run_command(std::string(HISPARSE_MICROBENCH_EXE) +
                               " --benchmark_list_tests --benchmark_filter='" + filter + "'");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string code = list("^swap_in_code/");
  EXPECT_EQ(count(code, "\n"), 24) << code;  // batch 1, 64 x 3 miss rates x 2 paths x 2
  EXPECT_EQ(count(code, "/icache:kept/"), 12) << code;
  EXPECT_EQ(count(code, "/icache:evicted/"), 12) << code;
  EXPECT_EQ(count(code, "/path:direct_compact/"), 12) << code;
  const std::string probe = list("^launch_floor_code/");
  EXPECT_EQ(count(probe, "/icache:kept/"), count(probe, "/icache:evicted/")) << probe;
  EXPECT_EQ(count(probe, "/layout:jumps/icache:evicted/"), 4) << probe;  // 2 sizes x 2 blocks
  const std::string paths =
      list("^swap_in_path/pool_gb:16/batch:(1|64)/.*/path:direct(_compact)?/");
  EXPECT_EQ(count(paths, "/path:direct/"), count(paths, "/path:direct_compact/")) << paths;
  EXPECT_EQ(count(paths, "/path:direct_compact/"), 24) << paths;  // 2 x 2 hot x 3 miss x 2 parts
  // The same verb's host-side figure: one swap-in enqueued through the launcher or as a graph.
  const std::string enqueue = list("^swap_in_enqueue/");
  EXPECT_EQ(count(enqueue, "\n"), 4) << enqueue;
  EXPECT_EQ(count(enqueue, "/part:host_launch/"), 2) << enqueue;
  EXPECT_EQ(count(enqueue, "/part:host_graph/"), 2) << enqueue;
#endif
}

TEST(CliMicrobench, ResolvePathOverrideIsRecordedAndABadNameIsRefused) {
#ifndef HISPARSE_MICROBENCH_EXE
  GTEST_SKIP() << "SKIPPED: hisparse-microbench is not built (HISPARSE_BUILD_BENCH is off)";
#else
  // HISPARSE_MICROBENCH_RESOLVE sets the resolve path of the swap-in cases without a path key,
  // so the targets can run on another path without a rebuild; the run's context says so.
  TempDir dir;
  fs::create_directories(dir.path);
  const fs::path out = dir.path / "override.json";
  const std::string run =
      fmt::format("{} --benchmark_filter='^swap_in_enqueue/pool_gb:16/batch:1/.*host_graph'",
                  HISPARSE_MICROBENCH_EXE);
  const auto ok = run_command(
      fmt::format("HISPARSE_MICROBENCH_ITERS=1 HISPARSE_MICROBENCH_RESOLVE=direct_compact {} "
                  "--benchmark_out={} --benchmark_out_format=json",
                  run, out.string()));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_json(out).at("context").at("hisparse_swap_in_resolve"),
            "direct_compact (HISPARSE_MICROBENCH_RESOLVE, for the swap-in cases without a path "
            "key)");
  const auto bad = run_command(fmt::format("HISPARSE_MICROBENCH_RESOLVE=compact {}", run));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("error: HISPARSE_MICROBENCH_RESOLVE: unknown resolve path 'compact'; "
                            "use one of direct, direct_compact, direct_general, hash, or unset it"),
            std::string::npos)
      << bad.output;
#endif
}

TEST(CliMicrobench, GridTablesPivotsASweepAndNamesBadInput) {
  if (run_command("python3 --version").exit_code != 0)
    GTEST_SKIP() << "SKIPPED: python3 is not installed, so reports/grid_tables.py cannot run";
  TempDir dir;
  fs::create_directories(dir.path);
  // Four cases of one family (rows out of order, batch 10 after batch 2 numerically), one of
  // another family that must be left out, and one that failed.
  auto run = [](const std::string& name, double us, double gbps) {
    return nlohmann::json{
        {"name", name + "/iterations:10/manual_time"}, {"us_per_call", us}, {"missed_GBps", gbps}};
  };
  nlohmann::json failed = run("swap_in/pool_gb:16/batch:10/miss:1", 0, 0);
  failed["error_occurred"] = true;
  failed["error_message"] = "pool too small";
  const nlohmann::json j = {{"context",
                             {{"hisparse_device", "NVIDIA H200"},
                              {"hisparse_git_revision", "abc"},
                              {"date", "2026-12-03"},
                              {"hisparse_backend", "cuda"}}},
                            {"benchmarks",
                             {run("swap_in/pool_gb:16/batch:10/miss:0.2", 40.25, 3.5),
                              run("swap_in/pool_gb:16/batch:2/miss:1", 20, 7.25), failed,
                              run("swap_in/pool_gb:16/batch:2/miss:0.2", 10.04, 1),
                              run("swap_in/pool_gb:1/batch:2/miss:0.2", 99, 9)}}};
  const fs::path file = dir.path / "sweep.json";
  std::ofstream(file) << j.dump();
  const std::string tool = "python3 " + std::string(HISPARSE_SOURCE_DIR) +
                           "/reports/grid_tables.py " + file.string() +
                           " --family swap_in/pool_gb:16 ";

  auto r =
      run_command(tool + "--rows batch --cols miss --cell '{us_per_call:.1f} ({missed_GBps:.1f})'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "NVIDIA H200, git abc, 2026-12-03, backend cuda\n\n"
            "| batch | miss 0.2 | miss 1 |\n"
            "| --- | ---: | ---: |\n"
            "| 2 | 10.0 (1.0) | 20.0 (7.2) |\n"
            "| 10 | 40.2 (3.5) | error: pool too small |\n");

  r = run_command(tool + "--rows batch,hot --cols miss");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: " + file.string() +
                          ": case swap_in/pool_gb:16/batch:10/miss:0.2/iterations:10/manual_time "
                          "has no key hot; keys are pool_gb, batch, miss"),
            std::string::npos)
      << r.output;
  r = run_command(tool + "--rows batch --cols miss --cell '{GBps:.1f}'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("has no counter 'GBps'; it has missed_GBps, us_per_call"),
            std::string::npos)
      << r.output;
  r = run_command("python3 " + std::string(HISPARSE_SOURCE_DIR) + "/reports/grid_tables.py " +
                  file.string() + " --family fathom_scan/hbm --rows batch --cols miss");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: " + file.string() + ": no case starts with 'fathom_scan/hbm/'\n");
  const fs::path absent = dir.path / "absent.json";
  r = run_command("python3 " + std::string(HISPARSE_SOURCE_DIR) + "/reports/grid_tables.py " +
                  absent.string() + " --family swap_in --rows batch --cols miss");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(
      r.output.rfind("error: " + absent.string() + ": [Errno 2] No such file or directory", 0), 0u)
      << r.output;
}

// reports/targets.py as a command prefix.
std::string targets_tool() {
  return "python3 " + std::string(HISPARSE_SOURCE_DIR) + "/reports/targets.py ";
}

// One case of a --benchmark_out file with a single counter, as the targets tests write them.
nlohmann::json one_counter_case(const std::string& name, const char* counter, double value) {
  return nlohmann::json{{"name", name + "/iterations:30/manual_time"}, {counter, value}};
}

TEST(CliMicrobench, TargetsTableSaysWhichBoundsAreMet) {
  if (run_command("python3 --version").exit_code != 0)
    GTEST_SKIP() << "SKIPPED: python3 is not installed, so reports/targets.py cannot run";
  TempDir dir;
  fs::create_directories(dir.path);
  // Met (host scan at batch 32, the transfer at batch 1), not met (the batch-1 step), a failed
  // case and a counter a file lacks (both listed as not run), the fused planner as a difference
  // of two scans, and a floor printed as context.
  nlohmann::json failed =
      one_counter_case("swap_in/pool_gb:16/batch:1/hot:4096/row:656/miss:0.001", "us_per_call", 1);
  failed["error_occurred"] = true;
  const nlohmann::json j = {
      {"context",
       {{"hisparse_device", "NVIDIA H200"}, {"hisparse_git_revision", "0123456789abcdef-dirty"}}},
      {"benchmarks",
       {one_counter_case("fathom_scan/host/budget:48/context:1048576/batch:32", "ceiling_fraction",
                         0.9136),
        {{"name", "fathom_scan/host/budget:48/context:1048576/batch:1/iterations:30/manual_time"},
         {"ceiling_fraction", 0.8393},
         {"copy_ceiling_fraction", 0.9042}},
        failed,
        one_counter_case("fathom_scan_plan/fused/hbm/budget:48/context:131072/batch:8",
                         "us_per_call", 330.5),
        one_counter_case("fathom_scan_plan/given/hbm/budget:48/context:131072/batch:8",
                         "us_per_call", 327.25),
        one_counter_case("launch_floor/nodes:2/pdl:1/blocks:1/writes:2048", "us_per_call", 4.39)}}};
  const fs::path file = dir.path / "targets.json";
  std::ofstream(file) << j.dump();
  const std::string tool = targets_tool();
  auto r = run_command(tool + file.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row :
       {"NVIDIA H200, git 0123456789ab-dirty",
        "| #4 host scan B48 1M batch 32 (whole step, fraction of PCIe) | 0.9136 ceiling_fraction | "
        ">= 0.9 | yes |",
        "| #4 host scan B48 1M batch 1 (whole step, fraction of PCIe) | 0.8393 ceiling_fraction | "
        ">= 0.9 | no |",
        "| #4 host transfer B48 1M batch 1 (copy span, fraction of PCIe) | 0.9042 "
        "copy_ceiling_fraction | >= 0.9 | yes |",
        "| #4 host transfer B48 1M batch 32 (copy span, fraction of PCIe) | not run | >= 0.9 | - |",
        "| #3 batch 1, 0.1% miss | not run | <= 8 | - |",
        "| #4 planner fused into the scan (fused - given, 128K batch 8) | 3.25 us | <= 5 us | yes "
        "|",
        "- two-kernel graph floor, 1 block (under the batch-1 latency targets): 4.39 us_per_call"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
  const fs::path absent = dir.path / "absent.json";
  r = run_command(tool + absent.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(
      r.output.rfind("error: " + absent.string() + ": [Errno 2] No such file or directory", 0), 0u)
      << r.output;
}

TEST(CliMicrobench, TargetsAcrossRunsGivesTheLastFigureTheRangeAndHowOftenMet) {
  if (run_command("python3 --version").exit_code != 0)
    GTEST_SKIP() << "SKIPPED: python3 is not installed, so reports/targets.py cannot run";
  TempDir dir;
  fs::create_directories(dir.path);
  const std::string batch1 = "swap_in/pool_gb:16/batch:1/hot:4096/row:656/miss:1";
  const std::string fused = "fathom_scan_plan/fused/hbm/budget:48/context:131072/batch:8";
  const std::string given = "fathom_scan_plan/given/hbm/budget:48/context:131072/batch:8";
  const std::string floor = "launch_floor/nodes:2/pdl:1/blocks:1/writes:2048";
  // Two leases: batch 1 / 100% met on the first (38 <= 40), not on the second (44.5); the
  // 1152-B case only on the first; the fused planner (a difference of two scans) on both.
  const nlohmann::json first = {
      {"context",
       {{"hisparse_device", "NVIDIA H200"}, {"hisparse_git_revision", "aaaaaaaaaaaaaaaa"}}},
      {"benchmarks",
       {one_counter_case(batch1, "us_per_call", 38.0),
        one_counter_case("swap_in/pool_gb:16/batch:64/hot:4096/row:1152/miss:1", "missed_GBps",
                         50.7),
        one_counter_case(fused, "us_per_call", 253.0),
        one_counter_case(given, "us_per_call", 249.0),
        one_counter_case(floor, "us_per_call", 4.69)}}};
  const nlohmann::json second = {
      {"context",
       {{"hisparse_device", "NVIDIA H200"}, {"hisparse_git_revision", "bbbbbbbbbbbbbbbb"}}},
      {"benchmarks",
       {one_counter_case(batch1, "us_per_call", 44.5),
        one_counter_case(fused, "us_per_call", 256.0),
        one_counter_case(given, "us_per_call", 250.0),
        one_counter_case(floor, "us_per_call", 4.53)}}};
  const fs::path a = dir.path / "first.json", b = dir.path / "second.json";
  std::ofstream(a) << first.dump();
  std::ofstream(b) << second.dump();
  const auto r = run_command(targets_tool() + "--across " + a.string() + " " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* row :
       {"git aaaaaaaaaaaa", "git bbbbbbbbbbbb",
        "| target | last run | range over 2 runs | met in | bound |",
        "| #3 batch 1, 100% miss | 44.5 us_per_call | 38-44.5 us_per_call | 1 of 2 | <= 40 |",
        "| #3 1152-B rows, batch 64, 100% miss | not run | 50.7 missed_GBps | 1 of 1 | >= 50 |",
        "| #3 batch 1, 0.1% miss | not run | - | - | <= 8 |",
        "| #4 planner fused into the scan (fused - given, 128K batch 8) | 6 us | 4-6 us | 1 of 2 | "
        "<= 5 us |",
        "- two-kernel graph floor, 1 block (under the batch-1 latency targets): 4.53-4.69 "
        "us_per_call (2 runs)"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
}

}  // namespace
}  // namespace hisparse::test
