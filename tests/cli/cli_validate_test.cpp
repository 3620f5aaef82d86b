// hisparse-bench validate end to end: every broken fixture gives exactly one line naming
// file:line:column, the key, the problem and the fix, and exit status 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "support/run_command.hpp"

namespace hisparse::test {
namespace {

const std::string kBad = std::string(HISPARSE_TEST_FIXTURES) + "/bad/";

struct BadCase {
  const char* file;
  const char* message;  ///< after "error: <path>:"
};

class CliValidateBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(CliValidateBad, OneExactLineAndExitStatus2) {
  const BadCase& c = GetParam();
  const auto r = run_bench("validate " + kBad + c.file);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kBad + c.file + ":" + c.message + "\n");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CliValidateBad,
    ::testing::Values(
        BadCase{"unknown_key.yaml", "4:1: toop_k: unknown key; did you mean 'top_k'?"},
        BadCase{
            "wrong_type.yaml",
            "3:14: concurrency: expected an integer, got 'four'; write a whole number such as 1"},
        BadCase{"empty_sweep.yaml",
                "5:16: sweep.concurrency: empty sweep (no values); list at least one value, or "
                "remove the axis"},
        BadCase{"top_k_over_context.yaml",
                "5:8: top_k: top_k 4096 is larger than context_length 2048; use top_k <= 2048 or a "
                "longer context"},
        BadCase{"hot_below_top_k.yaml",
                "6:13: hot_buffer: hot_buffer 32 is smaller than top_k 64; use hot_buffer >= 64 (0 "
                "means 2 * top_k)"},
        BadCase{"hot_too_large.yaml",
                "5:22: sweep.hot_buffer: 40000 is out of range; use a value from 0 to 32768"},
        BadCase{"concurrency_zero.yaml",
                "4:20: sweep.concurrency: 0 is out of range; use 1 or more"},
        BadCase{
            "budget_bits.yaml",
            "6:14: budget_bits: budget_bits 1000 is above 4 * head_dim = 128 of 'tiny-gqa'; use "
            "a budget from 0 to 128"},
        BadCase{"fathom_on_mla.yaml",
                "4:22: sweep.mode: mode 'fathom' needs a GQA model, but 'tiny-dsa' uses MLA; use "
                "dense, sparse-gpu or hisparse with this model, or a GQA model"},
        BadCase{"unknown_model.yaml",
                "2:8: model: unknown model 'tiny-dsx'; did you mean 'tiny-dsa'?"},
        BadCase{
            "syntax_error.yaml",
            "5:5: YAML syntax error: end of sequence flow not found; fix the YAML syntax at that "
            "position"},
        BadCase{"unknown_mode.yaml",
                "4:17: sweep.mode: unknown value 'sparse_gpu'; did you mean 'sparse-gpu'?"}),
    [](const auto& param_info) {
      std::string name = param_info.param.file;
      name = name.substr(0, name.find('.'));
      return name;
    });

TEST(CliValidate, GoodScenariosPassWithPointCounts) {
  const auto r =
      run_bench("validate quick " + std::string(HISPARSE_TEST_FIXTURES) + "/scenarios/tiny.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("quick.yaml: 14 sweep points over model x mode x concurrency (2 skipped)\n"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tiny.yaml: 2 sweep points over mode\n"), std::string::npos) << r.output;
}

TEST(CliValidate, EveryShippedScenarioIsValid) {
  const auto r =
      run_bench("validate --quiet " + std::string(HISPARSE_SOURCE_DIR) + "/scenarios/*.yaml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(CliValidate, OneBadFileAmongGoodOnesFailsTheCommand) {
  const auto r = run_bench("validate --quiet quick " + kBad + "unknown_key.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kBad +
                          "unknown_key.yaml:4:1: toop_k: unknown key; did you mean 'top_k'?\n");
}

TEST(CliValidate, SetOverridesAreValidatedToo) {
  const auto r = run_bench("validate quick --set sweep.concurrency=[0]");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(
      r.output,
      "error: --set sweep.concurrency=[0]: sweep.concurrency: 0 is out of range; use 1 or more\n");
  const auto ok = run_bench("validate quick --set sweep.concurrency=[1,2,4] --set workload.seed=7");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find(": 21 sweep points"), std::string::npos) << ok.output;
}

TEST(CliValidate, JsonReportParses) {
  const auto r = run_bench("validate --json quick " + kBad + "wrong_type.yaml");
  EXPECT_EQ(r.exit_code, 2);
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["ok"], true);
  EXPECT_EQ(j[0]["points"], 14);
  EXPECT_EQ(j[0]["skipped"], 2);
  EXPECT_EQ(j[1]["ok"], false);
  EXPECT_EQ(j[1]["error"].get<std::string>().find(kBad + "wrong_type.yaml:3:14: concurrency:"), 0u);
}

TEST(CliValidate, MissingScenarioFile) {
  const auto r = run_bench("validate /nonexistent/x.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "error: /nonexistent/x.yaml: no scenario file '/nonexistent/x.yaml'; give a path to a "
            "scenario YAML or a name from 'hisparse-bench list scenarios'\n");
}

}  // namespace
}  // namespace hisparse::test
