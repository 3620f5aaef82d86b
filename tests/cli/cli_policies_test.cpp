// hisparse-bench run --save-selections and hisparse-bench policies end to end: the saved traces
// replayed by `policies` give exactly the miss rates the run reported, .npy dumps of top-k
// positions are read as streams, and bad flags get one message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/npy.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

// The saved selections of every hot-buffer point of a run, replayed under the run's own policy
// and hot size, give the run's policy_miss_rate and optimal_miss_rate exactly: the files hold
// every step since admission, as the run's analysis did.
TEST(CliPolicies, SavedSelectionsReproduceTheRunsPolicyAnalysis) {
  const TempDir out;
  const auto r =
      run_bench(fmt::format("run quick --backend cpu --quiet --save-selections --out {} --set "
                            "'sweep.mode=[hisparse]' --set 'sweep.concurrency=[2]' --set 'skip=[]'",
                            out.path.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto results = read_json(out.path / "results.json");
  int checked = 0;
  for (const auto& point : results["points"]) {
    const auto& m = point["metrics"];
    ASSERT_TRUE(m.contains("selections")) << point.dump();
    const auto folder = out.path / m["selections"].get<std::string>();
    std::string files;
    int count = 0;
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      files += fmt::format(" {}", e.path().string());
      ++count;
    }
    // Per layer, one stream per request (MLA) or per request and KV head (GQA).
    EXPECT_GE(count, 2 * 2) << folder;
    const int hot = point["config"]["hot_buffer"].get<int>();
    const auto p =
        run_bench(fmt::format("policies{} --hot {} --policies lru,belady --json", files, hot));
    ASSERT_EQ(p.exit_code, 0) << p.output;
    const auto j = nlohmann::json::parse(p.output);
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_EQ(j["streams"].size(), static_cast<std::size_t>(count));
    EXPECT_EQ(j["counted_steps"], m["policy_steps"]);
    ASSERT_EQ(j["cells"].size(), 2u);
    EXPECT_EQ(j["cells"][0]["policy"], "lru");
    EXPECT_EQ(j["cells"][0]["miss_rate"].get<double>(), m["policy_miss_rate"].get<double>());
    EXPECT_EQ(j["cells"][0]["optimal_miss_rate"].get<double>(),
              m["optimal_miss_rate"].get<double>());
    EXPECT_EQ(j["cells"][1]["miss_rate"].get<double>(), m["optimal_miss_rate"].get<double>());
    ++checked;
  }
  EXPECT_EQ(checked, 2);  // tiny-dsa and tiny-gqa
}

TEST(CliPolicies, NpyDumpTableAndPerStepCost) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  // One stream, hot 2, first length 10: steps {5, 9}, {5, 10}, {6, 1} give 2 misses in 3 steps
  // (the newest token, 9 then 10 then 11, is always a hit).
  write_npy_integers(file, NpyType::i32, {3, 2}, {5, 9, 5, 10, 6, 1});
  const auto r = run_bench(
      fmt::format("policies {} --hot 2 --seq-len 10 --policies lru --row-bytes 1000 --pcie-gbps 50",
                  file.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 2 misses / 3 steps = 0.667 rows, 666.7 B = 0.001 MB, at 50 GB/s 0.01 us per step.
  EXPECT_NE(r.output.find(
                fmt::format("      2  lru          33.33%            -          0.7      0.001   "
                            "       0.01  {} (33.33%)",
                            file.string())),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("an estimate rather than a measurement; rows of 1000 B, PCIe 50 GB/s"),
            std::string::npos)
      << r.output;
}

TEST(CliPolicies, OutWritesTheJsonMarkdownAndHtmlViews) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  write_npy_integers(file, NpyType::i32, {3, 2}, {5, 9, 5, 10, 6, 1});
  const auto out = dir.path / "views";
  const auto r = run_bench(
      fmt::format("policies {} --hot 2,4 --seq-len 10 --out {}", file.string(), out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("written to {}: policies.json, policies.md, policies.html",
                                      out.string())),
            std::string::npos)
      << r.output;
  const auto doc = read_json(out / "policies.json");
  ASSERT_EQ(doc["cells"].size(), 8u);  // 2 hot sizes x 4 policies
  EXPECT_EQ(doc["cells"][0]["misses"], 2);
  EXPECT_EQ(doc["first_seq_len"], 10);
  EXPECT_NE(read_text(out / "policies.md").find("| 2 | lru | 33.33% |"), std::string::npos);
  EXPECT_NE(read_text(out / "policies.html").find("<svg"), std::string::npos);

  // A folder that cannot be made is refused before any replay.
  const auto blocked = run_bench(
      fmt::format("policies {} --hot 2 --seq-len 10 --out {}/x", file.string(), file.string()));
  EXPECT_EQ(blocked.exit_code, 2);
  EXPECT_EQ(
      blocked.output.rfind(fmt::format("error: --out: cannot create {}/x (", file.string()), 0), 0u)
      << blocked.output;
}

// A folder stands for its .txt and .npy files in name order; other files are ignored.
TEST(CliPolicies, AFolderIsItsTraceFiles) {
  const TempDir dir;
  const auto text = dir.write("a.txt", "10: 5 9\n10: 5 9\n");
  (void)dir.write("notes.md", "not a trace");
  write_npy_integers(dir.path / "b.npy", NpyType::i32, {2, 1, 2}, {6, 1, 7, 0});
  const auto r = run_bench(
      fmt::format("policies {} --hot 2 --seq-len 10 --policies lru --json", dir.path.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["streams"],
            nlohmann::json::array({text.string(), (dir.path / "b.npy").string() + "[0]",
                                   (dir.path / "b.npy").string() + "[1]"}));
  // a.txt: 5 misses once; each b.npy stream: 6 or 7 misses, 1 or 0 hits.
  EXPECT_EQ(j["cells"][0]["misses"], 3);
  EXPECT_EQ(j["cells"][0]["hits"], 3 + 2);

  const TempDir empty;
  (void)empty.write("notes.md", "");
  const auto none = run_bench(fmt::format("policies {} --hot 2", empty.path.string()));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.output,
            fmt::format("error: {}: the folder holds no .txt or .npy selection files; point at a "
                        "folder that run --save-selections wrote, or at the files\n",
                        empty.path.string()));
}

TEST(CliPolicies, BadFlagsNameTheFlagAndTheFix) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const auto file = dir.path / "sel.npy";
  write_npy_integers(file, NpyType::i32, {1, 2}, {0, 1});
  // The whole output of a refused command line (exit status 2).
  const auto refused = [&](const std::string& flags) {
    const auto r = run_bench(fmt::format("policies {} {}", file.string(), flags));
    EXPECT_EQ(r.exit_code, 2) << flags;
    return r.output;
  };
  EXPECT_EQ(refused("--hot 4"),
            fmt::format("error: {}: an .npy of positions does not say how long the sequences "
                        "were; give --seq-len the sequence length at the first recorded step (it "
                        "grows by one per step)\n",
                        file.string()));
  // Position 1 at step 0 needs a length of 2.
  EXPECT_EQ(refused("--hot 4 --seq-len 1"),
            fmt::format("error: {} step 0 entry 1: position 1 is beyond the step's sequence "
                        "length 1 (the first recorded step's length 1 plus 0); give --seq-len the "
                        "sequence length the first recorded step really had (at least 2)\n",
                        file.string()));
  EXPECT_EQ(refused("--hot 4 --seq-len 4 --policies lfu"),
            "error: --policies: unknown replacement policy 'lfu'; use lru, fifo, random or "
            "belady\n");
  EXPECT_EQ(refused("--hot 1 --seq-len 4"),
            fmt::format("error: --hot: 1 slots cannot serve step 0 of {}, which needs 2 at once "
                        "(its distinct positions other than the newest token); give hot-buffer "
                        "sizes of at least 2\n",
                        file.string()));
  const std::string no_hot = refused("--seq-len 4");
  EXPECT_NE(no_hot.find("--hot is required"), std::string::npos) << no_hot;
  EXPECT_EQ(refused("--hot 4 --seq-len 4 --row-bytes 0"),
            "error: --row-bytes: 0 is not a row size; give the bytes of one KV row, e.g. 656 (MLA "
            "fp8)\n");
}

}  // namespace
}  // namespace hisparse::test
