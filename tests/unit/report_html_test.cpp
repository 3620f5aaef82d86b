// The SVG writer and report.html: tick arithmetic, escaping, which figures appear for which
// fields, Pareto frontier, and the provenance every caption carries.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/html_report.hpp"
#include "report/results_file.hpp"
#include "report/svg.hpp"

namespace hisparse {
namespace {

using nlohmann::json;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

json point(int index, const std::string& mode, int concurrency, double tps, json extra = {}) {
  json p{{"index", index},
         {"axes", {{"mode", mode}}},
         {"config",
          {{"model", "m"},
           {"mode", mode},
           {"concurrency", concurrency},
           {"context_length", 1024},
           {"top_k", 64},
           {"hot_buffer", 128},
           {"budget_bits", 48},
           {"policy", "lru"}}},
         {"status", "ok"},
         {"error", nullptr},
         {"metrics",
          {{"output_tokens_per_s", tps},
           {"step_ms", {{"median", 1000.0 * concurrency / tps}, {"p10", 1.0}, {"p90", 1.0}}},
           {"running_requests", concurrency},
           {"queued_requests", 0},
           {"hit_rate", nullptr},
           {"phase_ms", {{"attention", 0.5}, {"swap_in", 0.25}}}}}};
  for (const auto& [k, v] : extra.items()) {
    if (k == "config")
      for (const auto& [ck, cv] : v.items()) p["config"][ck] = cv;
    else
      p["metrics"][k] = v;
  }
  return p;
}

json results(std::vector<json> points, const std::string& backend = "cuda") {
  return {{"schema_version", 1},
          {"metadata",
           {{"backend", backend},
            {"device", {{"name", "NVIDIA H200"}}},
            {"synthetic", {{"weights", true}, {"workload", true}}}}},
          {"scenario", {{"name", "demo <&>"}}},
          {"points", points},
          {"summary", {{"planned", points.size()}, {"recorded", points.size()}, {"failed", 0}}}};
}

void expect_ticks(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

TEST(ReportSvg, NiceTicksAreRoundAndCoverTheRange) {
  expect_ticks(svg::nice_ticks(0, 1000), {0, 200, 400, 600, 800, 1000});
  expect_ticks(svg::nice_ticks(0, 7.3), {0, 1, 2, 3, 4, 5, 6, 7, 8});  // step 7.3/5 -> 1
  expect_ticks(svg::nice_ticks(0, 12), {0, 2, 4, 6, 8, 10, 12});       // 2.4 -> 2
  expect_ticks(svg::nice_ticks(0.93, 1.21), {0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25});
  expect_ticks(svg::nice_ticks(5, 5), {5, 5.2, 5.4, 5.6, 5.8, 6});
  expect_ticks(svg::nice_ticks(-30, 70), {-40, -20, 0, 20, 40, 60, 80});  // 20 -> 20
}

TEST(ReportSvg, LabelsAndEscaping) {
  EXPECT_EQ(svg::tick_label(1024), "1024");
  EXPECT_EQ(svg::tick_label(0.125), "0.125");
  EXPECT_EQ(svg::tick_label(2.0 / 3.0), "0.667");
  EXPECT_EQ(svg::escaped("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(svg::hex_colour(0xffef5350), "#ef5350");
}

TEST(ReportSvg, CanvasWritesElements) {
  svg::Canvas c(100, 50);
  c.line(0, 0, 10, 10, "#000", 1, "4,2");
  c.rect(1, 2, 3, 4, "#f00", "tip <1>");
  c.text(5, 6, "x & y", 12, "middle", -90);
  EXPECT_EQ(c.str(),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100\" height=\"50\" "
            "viewBox=\"0 0 100 50\" font-family=\"sans-serif\" role=\"img\">\n"
            "<rect width=\"100\" height=\"50\" fill=\"#ffffff\"/>\n"
            "<line x1=\"0.00\" y1=\"0.00\" x2=\"10.00\" y2=\"10.00\" stroke=\"#000\" "
            "stroke-width=\"1.00\" stroke-dasharray=\"4,2\"/>\n"
            "<rect x=\"1.00\" y=\"2.00\" width=\"3.00\" height=\"4.00\" fill=\"#f00\">"
            "<title>tip &lt;1&gt;</title></rect>\n"
            "<text x=\"5.00\" y=\"6.00\" font-size=\"12.00\" text-anchor=\"middle\" fill=\"#222\" "
            "transform=\"rotate(-90.00 5.00 6.00)\">x &amp; y</text>\n</svg>");
}

TEST(ReportSvg, EmptyChartSaysNoData) {
  svg::XYChart chart;
  chart.title = "t";
  EXPECT_NE(svg::render(chart).find(">no data</text>"), std::string::npos);
}

TEST(ReportHtml, BaselineIsSparseGpuElseDense) {
  EXPECT_EQ(baseline_mode(results({point(0, "dense", 1, 10), point(1, "sparse-gpu", 1, 20)})),
            "sparse-gpu");
  EXPECT_EQ(baseline_mode(results({point(0, "dense", 1, 10), point(1, "hisparse", 1, 20)})),
            "dense");
  EXPECT_EQ(baseline_mode(results({point(0, "hisparse", 1, 20)})), "");
}

TEST(ReportHtml, CaptionNamesBackendDeviceAndData) {
  EXPECT_EQ(provenance_caption(results({})),
            "backend cuda, device NVIDIA H200, synthetic weights/workload");
  json r = results({}, "cpu");
  r["metadata"]["synthetic"]["weights"] = false;
  EXPECT_EQ(provenance_caption(r),
            "backend cpu (CPU reference backend: host wall-clock timings, not GPU figures), "
            "device NVIDIA H200, loaded weights, synthetic workload");
}

TEST(ReportHtml, AllFiveFiguresWhenTheFieldsExist) {
  std::vector<json> pts;
  for (int c : {1, 4, 16}) {
    pts.push_back(point(static_cast<int>(pts.size()), "sparse-gpu", c, 100.0 * c));
    pts.push_back(point(static_cast<int>(pts.size()), "hisparse", c, 150.0 * c,
                        {{"hit_rate", 0.8}, {"config", {{"hot_buffer", 64 * c}}}}));
  }
  for (int bits : {32, 48, 64})
    pts.push_back(
        point(static_cast<int>(pts.size()), "fathom", 1, 90,
              {{"attention_rel_error", 0.1 * 32 / bits}, {"config", {{"budget_bits", bits}}}}));
  pts.push_back(point(static_cast<int>(pts.size()), "fathom", 1, 90,
                      {{"attention_rel_error", 0.2}, {"config", {{"budget_bits", 80}}}}));
  const std::string html = html_report(results(pts));
  EXPECT_EQ(count(html, "<svg "), 5u);
  for (const char* id : {"throughput", "speedup", "phases", "hit-rate", "pareto"})
    EXPECT_NE(html.find(std::string("<figure id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_EQ(count(html,
                  ". Backend cuda, device NVIDIA H200, synthetic weights/workload."
                  "</figcaption>"),
            5u);
  EXPECT_NE(html.find("<title>hisparse-bench: demo &lt;&amp;&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find(">Pareto frontier</text>"), std::string::npos);
  EXPECT_NE(html.find(">Speedup over sparse-gpu</text>"), std::string::npos);
  // The NVTX colour of swap_in (0xffef5350) fills its stack.
  EXPECT_NE(html.find("fill=\"#ef5350\"><title>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(ReportHtml, APolicyAxisPlotsEachPolicysReplayBesideTheOptimum) {
  // The swap-in runs LRU for every point, so its measured hit rate (0.8) is the same for both
  // policies; the figure plots each policy's replay and Belady's optimum instead.
  std::vector<json> pts;
  for (int hot : {64, 128})
    for (const char* policy : {"lru", "fifo"}) {
      const double miss = std::string(policy) == "lru" ? 0.125 : 0.25;
      pts.push_back(point(static_cast<int>(pts.size()), "hisparse", 2, 100.0,
                          {{"hit_rate", 0.8},
                           {"policy_miss_rate", miss * 64 / hot},
                           {"optimal_miss_rate", 0.0625 * 64 / hot},
                           {"config", {{"hot_buffer", hot}, {"policy", policy}}}}));
    }
  const std::string html = html_report(results(pts));
  EXPECT_NE(html.find(">Hit rate of each replacement policy vs hot-buffer size</text>"),
            std::string::npos)
      << html;
  for (const char* series : {">policy=lru</text>", ">policy=fifo</text>", ">Belady optimum</text>"})
    EXPECT_EQ(count(html, series), 1u) << series;
  // fifo at hot 64 misses 25%: its point sits at 75%; the optimum's at 93.75% and 96.875%.
  const std::string axes = ": hot buffer (slots per request and layer) = ";
  EXPECT_NE(html.find("<title>policy=fifo" + axes + "64, hit rate (%) = 75</title>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<title>Belady optimum" + axes + "128, hit rate (%) = 96.88</title>"),
            std::string::npos)
      << html;
}

TEST(ReportHtml, AbsentFieldsBecomeNotes) {
  json p = point(0, "dense", 1, 10);
  p["metrics"].erase("phase_ms");
  const std::string html = html_report(results({p}));
  EXPECT_EQ(count(html, "<svg "), 1u);  // throughput only
  for (const char* id : {"speedup", "phases", "hit-rate", "pareto"})
    EXPECT_NE(html.find(std::string("<p class=\"note\" id=\"") + id + "\">"), std::string::npos)
        << id;
}

TEST(ReportHtml, TracedPhasesArePreferred) {
  const std::string html = html_report(
      results({point(0, "dense", 1, 10, {{"gpu_phase_ms", {{"gemm", 0.4}, {"total", 0.4}}}})}));
  EXPECT_NE(html.find(">GPU time per step by phase (CUPTI trace)</text>"), std::string::npos);
  EXPECT_EQ(html.find(">total</text>"), std::string::npos);  // "total" is no stack
}

TEST(ReportHtml, FailedPointsAreListedNotPlotted) {
  json failed = point(1, "hisparse", 1, 10);
  failed["status"] = "failed";
  failed["metrics"] = nullptr;
  failed["error"] = "out of <memory>";
  const std::string html = html_report(results({point(0, "dense", 1, 10), failed}));
  EXPECT_NE(html.find("<span class=\"failed\">failed: out of &lt;memory&gt;</span>"),
            std::string::npos);
  EXPECT_NE(html.find("<p class=\"note\" id=\"speedup\">"), std::string::npos);
}

TEST(ReportMerge, SourcesAndRenumberedPoints) {
  const json a = results({point(0, "dense", 1, 10)});
  const json b = results({point(0, "dense", 1, 12), point(1, "dense", 2, 20)}, "cpu");
  const json m = merge_results({a, b}, {"a", "b"});
  ASSERT_EQ(m["points"].size(), 3u);
  EXPECT_EQ(m["points"][2]["index"], 2);
  EXPECT_EQ(m["points"][2]["source"], 1);
  EXPECT_EQ(m["sources"][1]["label"], "b");
  EXPECT_EQ(m["sources"][1]["backend"], "cpu");
  EXPECT_EQ(m["summary"]["recorded"], 3);
  EXPECT_EQ(merge_results({a}, {"a"}), a);
}

}  // namespace
}  // namespace hisparse
