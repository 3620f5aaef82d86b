// hisparse-bench report end to end, and report.html from run: the page is self-contained, holds
// the SVG figures, and every caption names backend, device and the synthetic data.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;

const std::string kResults = std::string(HISPARSE_TEST_FIXTURES) + "/results/";
const std::string kTiny = std::string(HISPARSE_TEST_FIXTURES) + "/scenarios/tiny.yaml";

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(CliReport, RegeneratesTablesAndWritesHtml) {
  TempDir out;
  const auto r = run_bench("report " + kResults + "base.json --out " + out.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "wrote " + (out.path / "results.csv").string() + "\nwrote " +
                          (out.path / "summary.md").string() + "\nwrote " +
                          (out.path / "report.html").string() + "\n");
  const std::string csv = read_text(out.path / "results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_NE(csv.find("\n1,tiny-gqa,sparse-gpu,4,128,32,64,48,lru,ok,2000,"), std::string::npos)
      << csv;
  EXPECT_NE(read_text(out.path / "summary.md").find("## mode: sparse-gpu"), std::string::npos);
  EXPECT_FALSE(fs::exists(out.path / "results.json"));  // the input is never rewritten

  const std::string html = read_text(out.path / "report.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  // Throughput, speedup over sparse-gpu, phase breakdown; no hit rate or Pareto data.
  EXPECT_EQ(count(html, "<svg "), 3u);
  EXPECT_EQ(count(html, "<figcaption>"), 3u);
  EXPECT_EQ(count(html,
                  "Backend cpu (CPU reference backend: host wall-clock timings, not GPU figures), "
                  "device Test CPU, synthetic weights/workload.</figcaption>"),
            3u)
      << html;
  EXPECT_NE(html.find("<figure id=\"speedup\">"), std::string::npos);
  EXPECT_NE(html.find("Speedup over sparse-gpu"), std::string::npos);
  EXPECT_NE(html.find("<p class=\"note\" id=\"hit-rate\">"), std::string::npos);
  EXPECT_NE(html.find("<p class=\"note\" id=\"pareto\">Bits vs error: no Fathom point with "
                      "attention_rel_error in these results. (backend cpu"),
            std::string::npos);
}

TEST(CliReport, DefaultOutputIsTheInputsFolder) {
  TempDir dir;
  fs::create_directories(dir.path);
  fs::copy_file(kResults + "base.json", dir.path / "results.json");
  const auto r = run_bench("report " + (dir.path / "results.json").string() + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  EXPECT_TRUE(fs::exists(dir.path / "report.html"));
  EXPECT_TRUE(fs::exists(dir.path / "results.csv"));
  EXPECT_TRUE(fs::exists(dir.path / "summary.md"));
}

TEST(CliReport, SeveralRunsAreMergedWithTheirSources) {
  TempDir out;
  const auto r = run_bench("report " + kResults + "base.json " + kResults +
                           "other_device.json --json --out " + out.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["written"].size(), 3u);
  const std::string csv = read_text(out.path / "results.csv");
  EXPECT_EQ(csv.rfind("index,source,model,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;
  EXPECT_NE(csv.find("\n3," + kResults + "other_device.json,tiny-gqa,sparse-gpu,"),
            std::string::npos)
      << csv;
  const std::string html = read_text(out.path / "report.html");
  EXPECT_NE(html.find("backends cpu, cuda (CPU reference backend: host wall-clock timings, not "
                      "GPU figures), devices Test CPU, NVIDIA H200, synthetic weights/workload"),
            std::string::npos)
      << html;
}

TEST(CliReport, SeveralRunsNeedAnOutputFolder) {
  const auto r = run_bench("report " + kResults + "base.json " + kResults + "same.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "error: report: --out: 2 results files need one output folder; add --out DIR (the "
            "merged report is written there)\n");
}

TEST(CliReport, BadInputNamesTheFile) {
  TempDir out;
  const auto r = run_bench("report " + kResults + "schema_v2.json --out " + out.path.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output.rfind("error: " + kResults +
                               "schema_v2.json: schema_version 2 is not "
                               "supported;",
                           0),
            0u)
      << r.output;
  EXPECT_FALSE(fs::exists(out.path / "report.html"));
}

TEST(CliReport, RunWritesReportHtmlAtTheEnd) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --quiet --out " + out.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = read_text(out.path / "report.html");
  EXPECT_NE(html.find("<h1>tiny</h1>"), std::string::npos);
  EXPECT_EQ(count(html, "<svg "), 3u) << html;
  EXPECT_EQ(count(html, "synthetic weights/workload.</figcaption>"), 3u);
  // `outputs.formats` without html leaves it out.
  TempDir other;
  const auto no_html = run_bench("run " + kTiny + " --backend cpu --quiet --out " +
                                 other.path.string() + " --set outputs.formats=[json]");
  ASSERT_EQ(no_html.exit_code, 0) << no_html.output;
  EXPECT_TRUE(fs::exists(other.path / "results.json"));
  EXPECT_FALSE(fs::exists(other.path / "report.html"));
}

}  // namespace
}  // namespace hisparse::test
