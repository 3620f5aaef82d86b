// `run --trace` and `trace` end to end. On the CPU backend there is no GPU timeline: the run
// says so, writes its results and exits 0. With a GPU and the CUDA decode engine, trace.json and
// gpu_phase_ms appear (checked where a CUDA engine exists).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/device.hpp"
#include "model/engine_support.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(HISPARSE_TEST_FIXTURES) + "/scenarios/tiny.yaml";

std::string cpu_note() {
  return cuda_compiled()
             ? "--trace: GPU timelines need the CUDA backend and this run uses the CPU backend, "
               "so no trace.json is written; NVTX ranges (domain hisparse) are still emitted for "
               "Nsight Systems (nsys profile -t nvtx ...)\n"
             : "--trace: GPU timelines need the CUDA backend and this build has none, so no "
               "trace.json is written (and no NVTX ranges are emitted)\n";
}

TEST(CliTrace, CpuBackendSaysTimelinesNeedCudaAndKeepsTheResults) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --trace --json --out " +
                           out.path.string() + " --set sweep.mode=[dense]");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r.output.rfind(cpu_note(), 0), 0u) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(cpu_note().size()));
  EXPECT_FALSE(fs::exists(out.path / "trace.json"));
  EXPECT_EQ(j, read_json(out.path / "results.json"));
  EXPECT_EQ(j["scenario"]["trace"]["enabled"], true);
  EXPECT_EQ(j["metadata"]["trace"]["enabled"], true);
  EXPECT_EQ(j["metadata"]["trace"]["steps"], 4);
  EXPECT_EQ(j["metadata"]["trace"]["file"], nullptr);
  EXPECT_EQ(j["metadata"]["trace"]["messages"][0], cpu_note().substr(0, cpu_note().size() - 1));
  EXPECT_EQ(j["points"][0]["status"], "ok");
  EXPECT_FALSE(j["points"][0]["metrics"].contains("gpu_phase_ms"));
}

TEST(CliTrace, QuietSilencesTheNote) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --trace --quiet --out " +
                           out.path.string() + " --set sweep.mode=[dense]");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(CliTrace, ScenarioKeyEnablesTracingLikeTheFlag) {
  TempDir out;
  const auto r =
      run_bench("run " + kTiny + " --backend cpu --json --out " + out.path.string() +
                " --set sweep.mode=[dense] --set trace.enabled=true --set trace.steps=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(out.path / "results.json");
  EXPECT_EQ(j["metadata"]["trace"]["enabled"], true);
  EXPECT_EQ(j["metadata"]["trace"]["steps"], 3);
}

TEST(CliTrace, TraceCommandMeasuresOnlyTheTracedSteps) {
  TempDir out;
  const auto r = run_bench("trace " + kTiny + " --backend cpu --trace-steps 3 --quiet --out " +
                           out.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(out.path / "results.json");
  EXPECT_EQ(j["scenario"]["decode_steps"], 3);
  EXPECT_EQ(j["scenario"]["trace"]["steps"], 3);
  ASSERT_EQ(j["points"].size(), 2u);
  for (const auto& p : j["points"]) EXPECT_EQ(p["metrics"]["step_ms"]["count"], 3) << p.dump();
}

TEST(CliTrace, TraceStepsMustBePositive) {
  const auto r = run_bench("run " + kTiny + " --trace --trace-steps 0");
  EXPECT_EQ(r.exit_code, 2);
  // CLI11 words its range message differently across versions ("1 to 1000000", "[1 - 1000000]").
  EXPECT_EQ(r.output.rfind("error: --trace-steps: Value 0 not in range ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("1000000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run 'hisparse-bench --help'"), std::string::npos) << r.output;
}

TEST(CliTrace, AutoBackendRunsTheCpuEngineAndSaysWhyOnAGpu) {
  if (cuda_available() && engine_supports(Backend::cuda)) GTEST_SKIP() << "CUDA engine exists";
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend auto --out " + out.path.string() +
                           " --set sweep.mode=[dense] --set decode_steps=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(out.path / "results.json");
  EXPECT_EQ(j["metadata"]["backend"], "cpu");
  EXPECT_EQ(j["metadata"]["backend_requested"], "auto");
  const std::string note = "auto: CUDA decode engine not available yet; running the CPU backend\n";
  if (cuda_available()) {
    EXPECT_EQ(r.output.rfind(note, 0), 0u) << r.output;
    EXPECT_EQ(j["metadata"]["backend_note"], note.substr(0, note.size() - 1));
  } else {
    EXPECT_EQ(r.output.find(note), std::string::npos) << r.output;
    EXPECT_FALSE(j["metadata"].contains("backend_note"));
  }
}

TEST(CliTrace, ExplicitCudaBackendStillFailsEachPointClearly) {
  if (!cuda_available()) GTEST_SKIP() << "needs a GPU (without one --backend cuda is bad input)";
  if (engine_supports(Backend::cuda)) GTEST_SKIP() << "the CUDA decode engine exists";
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cuda --quiet --out " + out.path.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto j = read_json(out.path / "results.json");
  for (const auto& p : j["points"]) {
    EXPECT_EQ(p["status"], "failed");
    EXPECT_NE(p["error"].get<std::string>().find("CUDA decode engine not yet implemented"),
              std::string::npos)
        << p.dump();
  }
}

}  // namespace
}  // namespace hisparse::test
