// ResultSet: JSON schema content, CSV and Markdown views, atomic rewrite after every point.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "bench/result_set.hpp"
#include "core/error.hpp"
#include "report/atomic_file.hpp"
#include "report/results_file.hpp"
#include "report/tables.hpp"
#include "support/error_message.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;
using test::read_text;
using test::TempDir;

PointRecord ok_point(std::size_t index, int concurrency, double median_ms) {
  PointRecord r;
  r.point.index = index;
  r.point.model = "tiny-dsa";
  r.point.axes = {{"mode", "sparse-gpu"}, {"concurrency", std::to_string(concurrency)}};
  r.point.config.mode = Mode::sparse_gpu;
  r.point.config.concurrency = concurrency;
  r.point.config.context_length = 2048;
  r.point.config.top_k = 64;
  r.point.config.hot_buffer = 128;
  r.metrics.requested = concurrency;
  r.metrics.running = concurrency;
  r.metrics.step_ms = summarize({median_ms, median_ms, median_ms});
  r.metrics.tpot_ms = median_ms;
  r.metrics.output_tokens_per_s = concurrency / (median_ms * 1e-3);
  r.metrics.phase_ms = {{"attention", 0.5}, {"indexer", 0.25}};
  r.metrics.hits = 30;
  r.metrics.misses = 10;
  r.metrics.hit_rate = 0.75;
  r.metrics.bytes_h2d_per_step = 1024;
  r.metrics.gpu_bytes_per_request = 4096;
  r.metrics.timing = "cpu wall clock";
  return r;
}

ResultSet make_set(std::size_t planned) {
  nlohmann::json meta{{"backend", "cpu"},
                      {"device", {{"name", "Test CPU"}}},
                      {"git_revision", "abc"},
                      {"synthetic", {{"weights", true}, {"workload", true}}}};
  return ResultSet(meta, {{"name", "unit"}}, planned);
}

TEST(ReportResults, JsonHasSchemaMetadataAndOneRecordPerPoint) {
  ResultSet set = make_set(2);
  set.add(ok_point(0, 4, 2.0));
  const auto j = set.to_json();
  EXPECT_EQ(j["schema_version"], kResultsSchemaVersion);
  EXPECT_EQ(j["metadata"]["backend"], "cpu");
  EXPECT_EQ(j["scenario"]["name"], "unit");
  ASSERT_EQ(j["points"].size(), 1u);
  const nlohmann::json p = j["points"][0];
  EXPECT_EQ(p["status"], "ok");
  EXPECT_TRUE(p["error"].is_null());
  EXPECT_EQ(p["axes"]["concurrency"], "4");
  EXPECT_EQ(p["config"]["mode"], "sparse-gpu");
  EXPECT_EQ(p["config"]["hot_buffer"], 128);
  EXPECT_DOUBLE_EQ(p["metrics"]["output_tokens_per_s"].get<double>(), 2000.0);  // 4 / 2 ms
  EXPECT_DOUBLE_EQ(p["metrics"]["step_ms"]["median"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(p["metrics"]["hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(p["metrics"]["phase_ms"]["attention"].get<double>(), 0.5);
  EXPECT_EQ(p["metrics"]["running_requests"], 4);
  EXPECT_EQ(p["metrics"]["queued_requests"], 0);
  EXPECT_EQ(j["summary"]["complete"], false);
  EXPECT_EQ(j["summary"]["recorded"], 1);
}

TEST(ReportResults, FailedPointIsRecordedWithItsError) {
  ResultSet set = make_set(2);
  set.add(ok_point(0, 1, 1.0));
  PointRecord bad = ok_point(1, 8, 1.0);
  bad.ok = false;
  bad.error = "out of memory, \"8 requests\"";
  set.add(bad);
  EXPECT_TRUE(set.any_failed());
  const auto j = set.to_json();
  EXPECT_EQ(j["points"][1]["status"], "failed");
  EXPECT_EQ(j["points"][1]["error"], "out of memory, \"8 requests\"");
  EXPECT_TRUE(j["points"][1]["metrics"].is_null());
  EXPECT_EQ(j["summary"]["failed"], 1);
  EXPECT_EQ(j["summary"]["ok"], 1);
  EXPECT_EQ(j["summary"]["complete"], true);
  // The CSV quotes the message; the Markdown names it.
  const std::string csv = results_csv(j);
  EXPECT_NE(csv.find(",failed,"), std::string::npos);
  EXPECT_NE(csv.find("\"out of memory, \"\"8 requests\"\"\""), std::string::npos) << csv;
  EXPECT_NE(results_markdown(j).find("failed: out of memory"), std::string::npos);
}

TEST(ReportResults, CsvHasHeaderAndOneRowPerPoint) {
  ResultSet set = make_set(2);
  set.add(ok_point(0, 1, 4.0));
  set.add(ok_point(1, 2, 4.0));
  const std::string csv = results_csv(set.to_json());
  std::istringstream lines(csv);
  std::string header, row0, row1, extra;
  std::getline(lines, header);
  std::getline(lines, row0);
  std::getline(lines, row1);
  EXPECT_FALSE(std::getline(lines, extra));
  EXPECT_EQ(header.rfind("index,model,mode,concurrency,context_length,top_k,hot_buffer,budget_bits,"
                         "policy,status,output_tokens_per_s,step_ms_median,",
                         0),
            0u)
      << header;
  EXPECT_NE(header.find(",phase_ms_attention,phase_ms_indexer,error"), std::string::npos) << header;
  EXPECT_EQ(row1.rfind("1,tiny-dsa,sparse-gpu,2,2048,64,128,48,lru,ok,500,4,", 0), 0u) << row1;
}

TEST(ReportResults, MarkdownStatesBackendDeviceAndSyntheticData) {
  ResultSet set = make_set(1);
  set.add(ok_point(0, 4, 2.0));
  const std::string md = results_markdown(set.to_json());
  EXPECT_NE(md.find("# unit"), std::string::npos);
  EXPECT_NE(md.find("backend: **cpu** (CPU reference backend: host wall-clock timings, not GPU "
                    "figures)"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("device: Test CPU"), std::string::npos);
  EXPECT_NE(md.find("synthetic weights/workload"), std::string::npos);
  EXPECT_NE(md.find("## mode: sparse-gpu"), std::string::npos);
  EXPECT_NE(md.find("CPU step ms (median)"), std::string::npos);
  EXPECT_EQ(md.find("GPU step ms"), std::string::npos);
  EXPECT_NE(md.find("| tiny-dsa | 4 | 2048 | 64 | 128 | ok | 2000.0 | 2.000 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("75.0%"), std::string::npos);
}

// Found by tests/fuzz (results_json): an ok point without metrics (a partial or hand-edited
// file) made `report` fail with nlohmann's "type must be number, but is null".
TEST(ReportResults, MarkdownOfAPointWithoutMetrics) {
  const auto doc = nlohmann::json::parse(
      R"({"schema_version": 1, "points": [{"status": "ok", "config": {"mode": "dense"}}]})");
  const std::string md = results_markdown(doc);
  EXPECT_NE(md.find("|  |  |  |  |  | ok | nan | nan | nan | nan |  /  | - | nan B |  |"),
            std::string::npos)
      << md;
}

// Found by tests/fuzz (results_json): nlohmann's out_of_range escaped as an unexpected failure.
TEST(ReportResults, LoadingANumberBeyondDoubleIsInvalidJson) {
  const TempDir dir;
  const auto file = dir.write("results.json", R"({"schema_version": 1e999, "points": []})");
  EXPECT_EQ(test::error_message([&] { (void)load_results(file); }),
            file.string() +
                ": not valid JSON (number overflow parsing '1e999'); give the path of a "
                "results.json written by 'hisparse-bench run'");
}

TEST(ReportResults, MarkdownListsWhatEachSelectionReadAndHowGoodItWas) {
  ResultSet set = make_set(3);
  set.add(ok_point(0, 4, 2.0));  // no selection measured: no selection table for its mode
  PointRecord exact = ok_point(1, 4, 2.0);
  exact.point.config.mode = Mode::hisparse;
  exact.metrics.bytes_scanned_per_step = 2048;
  exact.metrics.selection_recall = 0.5;
  exact.metrics.attention_rel_error = 0.25;
  set.add(exact);
  PointRecord fathom = ok_point(2, 2, 2.0);
  fathom.point.model = "tiny-gqa";
  fathom.point.config.mode = Mode::fathom;
  fathom.point.config.budget_bits = 40;
  fathom.metrics.bytes_scanned_per_step = 3.0 * 1024 * 1024;
  fathom.metrics.bits_per_token = 45.0625;
  fathom.metrics.bytes_per_token = 45.0625 / 8;
  fathom.metrics.active_channels = 20.25;
  fathom.metrics.selection_recall = 0.85974;
  fathom.metrics.attention_rel_error = 0.000119;
  set.add(fathom);
  const std::string md = results_markdown(set.to_json());
  const auto hisparse = md.find("## mode: hisparse");
  ASSERT_NE(hisparse, std::string::npos) << md;
  EXPECT_EQ(md.substr(0, hisparse).find("Selection ("), std::string::npos) << md;
  EXPECT_NE(md.find("| tiny-dsa | 4 | 2048 | 64 | - | - | - | 2.00 KiB | 0.5000 | 0.25 |"),
            std::string::npos)
      << md;
  EXPECT_NE(
      md.find("| tiny-gqa | 2 | 2048 | 64 | 40 | 45.1 | 20.2 | 3.00 MiB | 0.8597 | 0.000119 |"),
      std::string::npos)
      << md;
  const auto j = set.to_json();
  EXPECT_TRUE(j["points"][1]["metrics"]["bits_per_token"].is_null());
  EXPECT_DOUBLE_EQ(j["points"][2]["metrics"]["bytes_per_token"].get<double>(), 45.0625 / 8);
  const std::string csv = results_csv(j);
  EXPECT_NE(csv.find(",bytes_scanned_per_step,bits_per_token,bytes_per_token,active_channels,"),
            std::string::npos)
      << csv;
}

TEST(ReportResults, MarkdownListsEachReplacementPolicyBesideTheOptimum) {
  ResultSet set = make_set(2);
  set.add(ok_point(0, 4, 2.0));  // sparse-gpu: no hot buffer, no policy table for its mode
  PointRecord fifo = ok_point(1, 2, 2.0);
  fifo.point.config.mode = Mode::hisparse;
  fifo.point.config.policy = "fifo";
  fifo.metrics.policy = "fifo";
  fifo.metrics.policy_miss_rate = 0.115072;
  fifo.metrics.optimal_miss_rate = 0.0914714;
  fifo.metrics.policy_steps = 32;
  set.add(fifo);
  const std::string md = results_markdown(set.to_json());
  const auto hisparse = md.find("## mode: hisparse");
  ASSERT_NE(hisparse, std::string::npos) << md;
  EXPECT_EQ(md.substr(0, hisparse).find("Replacement policies"), std::string::npos) << md;
  EXPECT_NE(md.find("| model | concurrency | context | top_k | hot | policy | miss rate | Belady "
                    "optimum | steps |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| tiny-dsa | 2 | 2048 | 64 | 128 | fifo | 11.51% | 9.15% | 32 |"),
            std::string::npos)
      << md;
}

TEST(ReportResults, WriteKeepsEarlierPointsAfterEveryAdd) {
  TempDir tmp;
  ResultSet set = make_set(3);
  set.add(ok_point(0, 1, 1.0));
  auto written = set.write(tmp.path, {"json", "csv", "md"});
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(read_text(tmp.path / "results.json"))["points"].size(), 1u);
  PointRecord bad = ok_point(1, 2, 1.0);
  bad.ok = false;
  bad.error = "boom";
  set.add(bad);
  (void)set.write(tmp.path, {"json", "csv", "md"});
  const auto j = nlohmann::json::parse(read_text(tmp.path / "results.json"));
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["status"], "ok");
  EXPECT_EQ(j["points"][1]["status"], "failed");
  EXPECT_EQ(j["summary"]["complete"], false);
  // Three lines: the header and two rows; no temporary files left behind.
  const std::string csv = read_text(tmp.path / "results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path)) ++files;
  EXPECT_EQ(files, 3);
}

TEST(ReportResults, WriteOnlyTheChosenFormats) {
  TempDir tmp;
  ResultSet set = make_set(1);
  (void)set.write(tmp.path / "nested" / "dir", {"md"});
  EXPECT_TRUE(fs::exists(tmp.path / "nested" / "dir" / "summary.md"));
  EXPECT_FALSE(fs::exists(tmp.path / "nested" / "dir" / "results.json"));
}

TEST(ReportResults, AtomicWriteReplacesContentAndNamesThePathOnFailure) {
  TempDir tmp;
  fs::create_directories(tmp.path);
  write_file_atomically(tmp.path / "f.txt", "first");
  write_file_atomically(tmp.path / "f.txt", "second");
  EXPECT_EQ(read_text(tmp.path / "f.txt"), "second");
  const fs::path missing = tmp.path / "no" / "such" / "f.txt";
  try {
    write_file_atomically(missing, "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              missing.string() +
                  ": cannot create a temporary file beside it (No such file or "
                  "directory); check that the output folder exists and is writable "
                  "(--out DIR)");
  }
}

TEST(ReportResults, CsvFieldQuoting) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
}

TEST(ReportResults, RunMetadataNamesToolRevisionAndHost) {
  RunInfo info;
  info.command_line = "hisparse-bench run quick";
  info.device.name = "Test CPU";
  info.budget.source = "host RAM";
  info.start_time = "2026-01-01T00:00:00Z";
  const auto m = run_metadata(info);
  EXPECT_EQ(m["tool"], "hisparse-bench");
  EXPECT_EQ(m["version"], HISPARSE_VERSION);
  EXPECT_EQ(m["command_line"], "hisparse-bench run quick");
  EXPECT_EQ(m["start_time"], "2026-01-01T00:00:00Z");
  EXPECT_EQ(m["backend"], "cpu");
  EXPECT_EQ(m["device"]["name"], "Test CPU");
  EXPECT_EQ(m["synthetic"]["weights"], true);
  // The source tree's HEAD, marked "-dirty" exactly when its tracked files differ from it.
  const std::string rev = m["git_revision"];
  const std::string dir = HISPARSE_SOURCE_DIR;
  const auto head = test::run_command("git -C '" + dir + "' rev-parse HEAD");
  if (head.exit_code == 0) {
    const bool dirty =
        test::run_command("git -C '" + dir + "' diff --quiet HEAD --").exit_code == 1;
    EXPECT_EQ(rev, head.output.substr(0, 40) + (dirty ? "-dirty" : "")) << head.output;
  } else {
    EXPECT_TRUE(rev == "unknown" || rev.size() == 40) << rev;
  }
  EXPECT_FALSE(m["host"].get<std::string>().empty());
  EXPECT_EQ(utc_now_iso8601().size(), 20u);
}

}  // namespace
}  // namespace hisparse
