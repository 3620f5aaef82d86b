// Backend choice for the decode engine, the trace peek that runs before any NVTX range, and the
// html output format.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "model/engine_support.hpp"
#include "scenario/backend_choice.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;

TEST(ScenarioBackend, EngineRunsOnCudaInCudaBuilds) {
  EXPECT_TRUE(engine_supports(Backend::cpu));
  EXPECT_EQ(engine_supports(Backend::cuda), HISPARSE_WITH_CUDA != 0);
}

TEST(ScenarioBackend, AutoKeepsTheCudaEngineOfACudaBuild) {
  const BackendChoice c = engine_backend_for(Backend::cuda, /*requested_auto=*/true);
  if (HISPARSE_WITH_CUDA) {
    EXPECT_EQ(c.backend, Backend::cuda);
    EXPECT_EQ(c.note, "");
  } else {
    EXPECT_EQ(c.backend, Backend::cpu);
    EXPECT_EQ(c.note, "auto: CUDA decode engine not available yet; running the CPU backend");
  }
}

TEST(ScenarioBackend, ExplicitCudaIsKeptSoThatEachPointFailsClearly) {
  const BackendChoice c = engine_backend_for(Backend::cuda, /*requested_auto=*/false);
  EXPECT_EQ(c.backend, Backend::cuda);
  EXPECT_EQ(c.note, "");
}

TEST(ScenarioBackend, CpuNeedsNoNote) {
  for (bool automatic : {true, false}) {
    const BackendChoice c = engine_backend_for(Backend::cpu, automatic);
    EXPECT_EQ(c.backend, Backend::cpu);
    EXPECT_EQ(c.note, "");
  }
}

TEST(ScenarioBackend, ChooseResolvesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(choose_engine_backend("cpu", "--backend").backend, Backend::cpu);
  EXPECT_EQ(choose_engine_backend("auto", "--backend").backend, Backend::cpu);
  try {
    (void)choose_engine_backend("gpu", "--backend");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--backend: unknown backend 'gpu'; use auto, cuda or cpu");
  }
}

class TempScenario {
 public:
  explicit TempScenario(const std::string& text)
      : path_(fs::temp_directory_path() /
              ("hisparse_scenario_backend_" + std::to_string(getpid()) + ".yaml")) {
    std::ofstream(path_) << text;
  }
  ~TempScenario() { fs::remove(path_); }
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(ScenarioBackend, TracePeekReadsTheKeyAndTheOverrides) {
  const TempScenario off("name: a\nmodel: tiny-gqa\n");
  EXPECT_FALSE(scenario_requests_trace(off.path()));
  EXPECT_TRUE(scenario_requests_trace(off.path(), {"trace.enabled=true"}));
  const TempScenario on("name: a\nmodel: tiny-gqa\ntrace: {enabled: true, steps: 2}\n");
  EXPECT_TRUE(scenario_requests_trace(on.path()));
  EXPECT_FALSE(scenario_requests_trace(on.path(), {"trace.enabled=false"}));
  EXPECT_FALSE(scenario_requests_trace(on.path().string() + ".missing"));
  const TempScenario bad("name: a\ntrace: {enabled: perhaps}\n");
  EXPECT_FALSE(scenario_requests_trace(bad.path()));  // load_scenario reports it
}

TEST(ScenarioBackend, HtmlIsAnOutputFormat) {
  const Scenario s =
      parse_scenario("name: a\nmodel: tiny-gqa\noutputs: {formats: [html, json]}\n", "s.yaml");
  EXPECT_EQ(s.outputs.formats, (std::vector<std::string>{"html", "json"}));
}

}  // namespace
}  // namespace hisparse
