// The policy study's views: the JSON document's figures worked by hand for a one-stream study,
// and the terminal table, policies.md and policies.html rendered from it.
#include "report/policy_report.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hisparse {
namespace {

// Hot 2, sequence length 10 at every step (token 9 is the newest, always a hit):
//   {5, 9}: 5 misses; {5, 9}: hit; {6, 1}: 6 misses, 1 hits. LRU: 2 misses, 4 hits. Both misses
//   are first uses of a token, which every policy must fetch, so Belady misses as often and LRU
//   is 0 points over the optimum.
std::vector<NamedTrace> one_stream() {
  return {{"s", {{{10, {5, 9}}, {10, {5, 9}}, {10, {6, 1}}}}}};
}

nlohmann::json document(const std::vector<ReplacementPolicy>& policies) {
  PolicyStudyOptions o;
  o.hots = {2, 4};
  o.policies = policies;
  PolicyStudySetup setup;
  setup.inputs = {"s.txt"};
  setup.row_bytes = 1000;
  setup.pcie_gbps = 50;
  setup.command_line = "hisparse-bench policies s.txt --hot 2,4";
  return policy_study_json(study_policies(one_stream(), o), one_stream(), setup);
}

TEST(ReportPolicies, DocumentFiguresWorkedByHand) {
  const auto doc = document({ReplacementPolicy::lru, ReplacementPolicy::belady});
  EXPECT_EQ(doc["backend"], "cpu");
  EXPECT_EQ(doc["streams"], nlohmann::json::array({"s"}));
  EXPECT_EQ(doc["counted_steps"], 3);
  EXPECT_EQ(doc["widest_selection"], 2);
  EXPECT_TRUE(doc["first_seq_len"].is_null());
  ASSERT_EQ(doc["cells"].size(), 4u);
  const auto& lru2 = doc["cells"][0];
  EXPECT_EQ(lru2["hot"], 2);
  EXPECT_EQ(lru2["policy"], "lru");
  EXPECT_EQ(lru2["hits"], 4);
  EXPECT_EQ(lru2["misses"], 2);
  EXPECT_DOUBLE_EQ(lru2["miss_rate"].get<double>(), 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(lru2["optimal_miss_rate"].get<double>(), 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(lru2["rows_per_step"].get<double>(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(lru2["bytes_per_step"].get<double>(), 2000.0 / 3.0);
  EXPECT_DOUBLE_EQ(lru2["pcie_us_per_step"].get<double>(), 2000.0 / 3.0 / 50e3);
  EXPECT_EQ(lru2["worst_stream"], "s");
  EXPECT_EQ(lru2["per_stream"], nlohmann::json::parse(R"([{"hits": 4, "misses": 2}])"));
  // Hot 4: 5 and 6 both fit beside 0 and 1, so the same two misses.
  EXPECT_EQ(doc["cells"][2]["misses"], 2);
  // Without Belady in the study there is no optimum to compare with.
  EXPECT_TRUE(document({ReplacementPolicy::fifo})["cells"][0]["optimal_miss_rate"].is_null());
}

TEST(ReportPolicies, TextMarkdownAndHtmlShowTheSameRows) {
  const auto doc = document({ReplacementPolicy::lru, ReplacementPolicy::belady});
  const std::string text = policy_study_text(doc);
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "Replacement policies over recorded selections: 1 stream(s), 3 decode step(s) "
            "counted after 0 warm-up, selections of up to 2 positions");
  EXPECT_NE(text.find("      2  lru          33.33%     +0.00 pt          0.7      0.001         "
                      " 0.01  s (33.33%)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      2  belady       33.33%      optimum"), std::string::npos) << text;
  EXPECT_NE(text.find("an estimate rather than a measurement; rows of 1000 B, PCIe 50 GB/s\n"),
            std::string::npos);

  const std::string md = policy_study_markdown(doc);
  EXPECT_NE(md.find("| hot | policy | miss rate | over belady | rows/step | MB/step | PCIe us/step "
                    "| worst stream (miss rate) |\n| ---: | --- |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 4 | lru | 33.33% | +0.00 pt | 0.7 | 0.001 | 0.01 | s (33.33%) |\n"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("Inputs: s.txt."), std::string::npos);
  EXPECT_NE(md.find("## Miss rate per stream\n\n| stream | lru @ 2 | belady @ 2 | lru @ 4 | "
                    "belady @ 4 |\n| --- | ---: | ---: | ---: | ---: |\n| s | 33.33% | 33.33% | "
                    "33.33% | 33.33% |\n"),
            std::string::npos)
      << md;

  const std::string html = policy_study_html(doc);
  std::size_t svgs = 0;
  for (auto at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 2u);  // miss rate and transfer time against the hot size
  EXPECT_NE(html.find("Figure 1: Miss rate vs hot-buffer size. CPU replay of recorded "
                      "selections; times are the missed bytes at the PCIe ceiling, not "
                      "measurements."),
            std::string::npos);
  EXPECT_NE(html.find("<td>4</td><td>lru</td><td>33.33%</td>"), std::string::npos);
  EXPECT_NE(html.find("<tr><th>stream</th><th>lru @ 2</th>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td>s</td><td>33.33%</td>"), std::string::npos);
  EXPECT_NE(html.find("<code>hisparse-bench policies s.txt --hot 2,4</code>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // self-contained, nothing to run
}

}  // namespace
}  // namespace hisparse
