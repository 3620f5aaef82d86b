// A sweep stopped by SIGINT, SIGTERM, a second SIGINT or kill -9 at random moments keeps every
// completed point in a valid results.json, and `run --resume` completes exactly the missing
// points, with deterministic metrics identical to an uninterrupted run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Six points of about a third of a second each on 2 cores.
constexpr const char* kScenario = R"(name: interrupt-me
backend: cpu
model: tiny-dsa
mode: hisparse
context_length: 1024
top_k: 64
hot_buffer: 128
decode_steps: 24
warmup_steps: 1
sweep:
  concurrency: [1, 2, 3, 4, 5, 6]
)";

json read(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);  // throws (failing the test) unless the file is one whole document
}

/// Starts the sweep, sends `signals` (e.g. "INT", "INT INT", "KILL") after `delay_s`, and
/// returns the run's exit status.
int run_and_signal(const fs::path& scenario, const fs::path& out, double delay_s,
                   const std::string& signals) {
  std::string kills;
  for (std::size_t from = 0; from < signals.size();) {
    const auto space = std::min(signals.find(' ', from), signals.size());
    kills +=
        fmt::format("kill -{} $p 2>/dev/null; sleep 0.05; ", signals.substr(from, space - from));
    from = space + 1;
  }
  const auto r = run_command(fmt::format(
      "sh -c '{} run {} --out {} --quiet & p=$!; sleep {:.3f}; {}wait $p; echo \"exit=$?\"'",
      HISPARSE_BENCH_EXE, scenario.string(), out.string(), delay_s, kills));
  const auto at = r.output.rfind("exit=");
  EXPECT_NE(at, std::string::npos) << r.output;
  return at == std::string::npos ? -1 : std::stoi(r.output.substr(at + 5));
}

/// What a fixed seed makes the same in every run of a point.
json deterministic(const json& point) {
  const json& m = point["metrics"];
  return {{"index", point["index"]},        {"axes", point["axes"]},
          {"status", point["status"]},      {"hits", m["hits"]},
          {"misses", m["misses"]},          {"bytes_h2d_per_step", m["bytes_h2d_per_step"]},
          {"next", m["next_tokens_digest"]}};
}

class CliInterrupt : public testing::Test {
 protected:
  void SetUp() override {
    scenario_ = dir_.write("interrupt-me.yaml", kScenario);
    const auto r = run_bench(fmt::format("run {} --out {} --quiet", scenario_.string(),
                                         (dir_.path / "reference").string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    reference_ = read(dir_.path / "reference/results.json");
  }

  /// Resumes the sweep in `out` and checks it against the uninterrupted run: exactly the
  /// missing points ran, and every point's deterministic metrics match.
  void resume_and_compare(const fs::path& out, std::size_t kept) {
    const auto r =
        run_bench(fmt::format("run {} --resume {} --quiet", scenario_.string(), out.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json resumed = read(out / "results.json");
    EXPECT_EQ(resumed["summary"]["complete"], true);
    EXPECT_EQ(resumed["summary"]["ok"], 6);
    EXPECT_EQ(resumed["metadata"]["resumes"].back()["points_kept"], kept);
    ASSERT_EQ(resumed["points"].size(), 6u);
    for (std::size_t i = 0; i < 6; ++i)
      EXPECT_EQ(deterministic(resumed["points"][i]), deterministic(reference_["points"][i]));
  }

  TempDir dir_;
  fs::path scenario_;
  json reference_;
};

TEST_F(CliInterrupt, SignalsAtRandomMomentsKeepCompletedPointsAndResumeCompletesTheRest) {
  std::mt19937 random(std::random_device{}());
  std::uniform_real_distribution<double> moment(0.05, 1.8);
  const char* signals[] = {"INT", "TERM", "INT INT", "KILL"};
  const int expected[] = {130, 143, 130, 137};
  for (int i = 0; i < 4; ++i) {
    const double delay = moment(random);
    SCOPED_TRACE(fmt::format("SIG{} after {:.2f} s", signals[i], delay));
    const fs::path out = dir_.path / fmt::format("run-{}", i);
    const int status = run_and_signal(scenario_, out, delay, signals[i]);
    if (status == 0) continue;  // finished before the signal: nothing to resume
    EXPECT_EQ(status, expected[i]);
    // A signal before the process installed its handlers (kill -9 at any time before the first
    // write) leaves no file: nothing was done.
    if (!fs::exists(out / "results.json")) continue;
    const json partial = read(out / "results.json");
    std::size_t kept = 0;
    for (const auto& p : partial["points"]) {
      EXPECT_TRUE(p["status"] == "ok" || p["status"] == "interrupted") << p.dump();
      kept += p["status"] == "ok";
    }
    // Every point the file holds is one the uninterrupted run made, in order.
    for (std::size_t k = 0; k < partial["points"].size(); ++k) {
      if (partial["points"][k]["status"] != "ok") continue;
      EXPECT_EQ(deterministic(partial["points"][k]), deterministic(reference_["points"][k]));
    }
    resume_and_compare(out, kept);
  }
}

TEST_F(CliInterrupt, TheStopMessageNamesTheCommandThatContinues) {
  const fs::path out = dir_.path / "stopped";
  const auto r = run_command(fmt::format(
      "sh -c '{} run {} --out {} & p=$!; sleep 0.6; kill -INT $p; wait $p; echo \"exit=$?\"'",
      HISPARSE_BENCH_EXE, scenario_.string(), out.string()));
  if (r.output.find("exit=0") != std::string::npos) GTEST_SKIP() << "SKIPPED: finished first";
  EXPECT_NE(r.output.find("interrupt-me: stopped by SIGINT "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("continue with:\n  hisparse-bench run " + scenario_.string() +
                          " --resume " + out.string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exit=130"), std::string::npos) << r.output;
}

TEST_F(CliInterrupt, ResumeRefusesResultsOfAnotherSweepOrFolder) {
  const fs::path out = dir_.path / "reference";
  auto r = run_bench(
      fmt::format("run {} --resume {} --set workload.seed=9", scenario_.string(), out.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, fmt::format("error: --resume {}: its results are of another scenario: "
                                  "workload.seed (1 -> 9) differs; resume with the scenario, "
                                  "--set and --repetitions of the interrupted run, or start a "
                                  "new run in another folder\n",
                                  out.string()));
  r = run_bench(
      fmt::format("run {} --resume {}", scenario_.string(), (dir_.path / "nothing").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds no results.json; give the output folder of the interrupted run"),
            std::string::npos)
      << r.output;
  r = run_bench(fmt::format("run {} --resume {} --out {}", scenario_.string(), out.string(),
                            (dir_.path / "other").string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // A complete sweep resumes to itself: nothing runs again.
  r = run_bench(fmt::format("run {} --resume {} --quiet", scenario_.string(), out.string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read(out / "results.json")["metadata"]["resumes"][0]["points_kept"], 6);
}

}  // namespace
}  // namespace hisparse::test
