// hisparse-bench list, plan, info, help and flag errors end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.hpp"
#include "model/npy.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

TEST(CliCommands, ListNamesModelsScenariosAndModes) {
  const auto r = run_bench("list");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("models:\n"), std::string::npos);
  EXPECT_NE(r.output.find("  tiny-dsa\n"), std::string::npos);
  EXPECT_NE(r.output.find("  glm-5.1-fp8-rank\n"), std::string::npos);
  EXPECT_NE(r.output.find("scenarios:\n"), std::string::npos);
  EXPECT_NE(r.output.find("  quick\n"), std::string::npos);
  EXPECT_NE(
      r.output.find("modes:\n  dense\n  sparse-gpu\n  hisparse\n  fathom\n  hisparse+fathom\n"),
      std::string::npos)
      << r.output;
  const auto modes = run_bench("list modes");
  EXPECT_EQ(modes.output, "dense\nsparse-gpu\nhisparse\nfathom\nhisparse+fathom\n");
}

TEST(CliCommands, ListJsonParses) {
  const auto r = run_bench("list --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["modes"].size(), 5u);
  EXPECT_NE(std::find(j["models"].begin(), j["models"].end(), "tiny-gqa"), j["models"].end());
  EXPECT_NE(std::find(j["scenarios"].begin(), j["scenarios"].end(), "quick"), j["scenarios"].end());
}

// GLM-5.1 at 128K on a 141 GiB GPU, by hand (REFERENCE.md section 1): a token costs a 1152-B
// bf16 MLA row and a 132-B index key in each of 78 layers.
TEST(CliCommands, PlanGlmMatchesHandArithmetic) {
  const auto r =
      run_bench("plan --model glm-5.1-fp8-rank --context 131072 --gpu-mem-gib 141 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  const double gpu = 141.0 * 1024 * 1024 * 1024;
  EXPECT_DOUBLE_EQ(j["gpu_mem_bytes"].get<double>(), gpu);
  const auto weights = j["weight_bytes"].get<double>();
  EXPECT_GT(weights, 90e9);
  EXPECT_LT(weights, 120e9);
  const double free_for_kv = gpu - weights - j["activation_reserve_bytes"].get<double>();
  const std::int64_t full = std::int64_t{1152 + 132} * 78 * 131072;  // 13,127,122,944
  // Index keys, hot rows, and per layer the slot table + LRU order (8 B x 4096) and the residency
  // bitmap (131072 / 8 B).
  const std::int64_t hot = std::int64_t{132} * 78 * 131072 + std::int64_t{1152} * 4097 * 78 +
                           std::int64_t{8 * 4096 + 131072 / 8} * 78;
  const std::int64_t host = std::int64_t{1152} * 78 * 131072;
  int seen = 0;
  const nlohmann::json modes = j["modes"];
  for (const auto& row : modes) {
    const std::string mode = row["mode"];
    if (mode == "sparse-gpu" || mode == "dense") {
      EXPECT_EQ(row["gpu_bytes_per_request"].get<std::int64_t>(), full) << mode;
      EXPECT_EQ(row["max_concurrency"].get<std::int64_t>(),
                static_cast<std::int64_t>(std::floor(free_for_kv / static_cast<double>(full))));
      ++seen;
    }
    if (mode == "hisparse") {
      EXPECT_EQ(row["gpu_bytes_per_request"].get<std::int64_t>(), hot);  // 1,721,491,200
      EXPECT_EQ(row["host_bytes_per_request"].get<std::int64_t>(), host);
      EXPECT_EQ(row["max_concurrency"].get<std::int64_t>(),
                static_cast<std::int64_t>(std::floor(free_for_kv / static_cast<double>(hot))));
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3) << r.output;
}

// --concurrency N: per mode, the longest context at which N requests fit. Dense by hand: each
// token costs (1152 + 132) B x 78 layers = 100,152 B per request; hisparse at the boundary.
TEST(CliCommands, PlanLongestContextForAConcurrency) {
  const std::string glm = "plan --model glm-5.1-fp8-rank --gpu-mem-gib 141 --json ";
  const auto r = run_bench(glm + "--concurrency 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["concurrency"], 64);
  const double free_for_kv = j["gpu_mem_bytes"].get<double>() - j["weight_bytes"].get<double>() -
                             j["activation_reserve_bytes"].get<double>();
  std::int64_t hisparse = 0;
  for (const auto& row : j["modes"]) {
    if (row["mode"] == "dense") {
      EXPECT_EQ(row["longest_context"].get<std::int64_t>(),
                static_cast<std::int64_t>(std::floor(free_for_kv / (64.0 * 100152.0))));  // 5554
    }
    if (row["mode"] == "hisparse") hisparse = row["longest_context"].get<std::int64_t>();
  }
  ASSERT_GT(hisparse, 5554);
  // At that context 64 hisparse requests fit, one token longer they do not.
  const auto admitted = [&](std::int64_t context) {
    const auto at = run_bench(glm + "--context " + std::to_string(context));
    EXPECT_EQ(at.exit_code, 0) << at.output;
    const auto plan = nlohmann::json::parse(at.output);  // alive for the loop (C++20 range-for)
    for (const auto& row : plan["modes"])
      if (row["mode"] == "hisparse") return row["max_concurrency"].get<std::int64_t>();
    return std::int64_t{-1};
  };
  EXPECT_GE(admitted(hisparse), 64);
  EXPECT_LT(admitted(hisparse + 1), 64);
  // Tiny models fit more than the search covers: the table says so.
  const auto tiny = run_bench("plan --model tiny-gqa");
  EXPECT_NE(tiny.output.find(">= 1073741824"), std::string::npos) << tiny.output;
  const auto bad = run_bench("plan --model tiny-gqa --concurrency 0");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.output,
            "error: --concurrency: 0 is not a number of requests; use 1 or more, e.g. "
            "--concurrency 64\n");
}

TEST(CliCommands, PlanTableShowsBytesPerMode) {
  const auto r = run_bench("plan --model glm-5.1-fp8-rank --context 131072 --gpu-mem-gib 141");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("GPU bytes/request"), std::string::npos);
  EXPECT_NE(r.output.find("13127122944 (12.23 GiB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1721491200 (1.60 GiB)"), std::string::npos) << r.output;
}

TEST(CliCommands, PlanRejectsBadInput) {
  auto r = run_bench("plan --model tiny-dsb");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: --model: unknown model 'tiny-dsb'; did you mean 'tiny-dsa'?\n");
  r = run_bench("plan --model tiny-dsa --context 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "error: --context: 0 is not a context length; give the tokens per request, e.g. "
            "--context 131072\n");
  r = run_bench("plan --model tiny-dsa --hot-buffer 40000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "error: --hot-buffer: 40000 is out of range; use 0 (2 * top_k) up to 32768 slots\n");
  r = run_bench("plan");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: --model is required; run 'hisparse-bench --help'\n");
}

TEST(CliCommands, BadFlagsAreOneLineAndExitStatus2) {
  for (const char* args : {"run --bogus x.yaml", "list --frobnicate", "list nothing", "",
                           "plan --model tiny-dsa --context many"}) {
    const auto r = run_bench(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
  }
}

TEST(CliCommands, QualityStudyJsonHasEveryMethodAndBothRules) {
  const auto r = run_bench(
      "quality --kv-heads 2 --tokens 2048 --top-k 128 --budgets 32,64,128 --seed 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["workload"]["generator"], "synthetic");
  EXPECT_EQ(j["workload"]["profile"], "rope_qk_norm");
  EXPECT_EQ(j["workload"]["seed"], 3);
  std::vector<std::string> names;
  for (const auto& row : j["rows"]) names.push_back(row["method"]);
  EXPECT_EQ(names, (std::vector<std::string>{"full-4bit", "fixed-32ch", "sparq-16", "sparq-32",
                                             "oracle", "fathom-32", "fathom-64", "fathom-128",
                                             "fathom-m-32", "fathom-m-64", "fathom-m-128"}));
  // Costs in the shared convention: the fixed set reads 32 channels x (4 planes + 0.25 scale).
  EXPECT_DOUBLE_EQ(j["rows"][1]["bits_per_token"].get<double>(), 136.0);
  // Both rules reach the fixed set's error within 128 planes here, with fewer bits than its 136.
  for (const char* rule : {"paper", "measured"}) {
    ASSERT_TRUE(j["bits_at_fixed32_error"][rule].is_number()) << rule << ": " << r.output;
    EXPECT_GT(j["bits_at_fixed32_error"][rule].get<double>(), 30.0) << rule;
    EXPECT_LT(j["bits_at_fixed32_error"][rule].get<double>(), 150.0) << rule;
  }
}

// --allocation-bound: the bits with a budget per KV head. Every head at one grid budget is one
// of the splits it considers, so it never needs more than the first Fathom row whose mean error
// reaches the 32-channel scan's.
TEST(CliCommands, QualityStudyBoundsASplitOfTheBitsOverTheHeads) {
  const std::string args =
      "quality --kv-heads 4 --tokens 2048 --top-k 128 --budgets 16,32,64,128 --seed 3";
  const auto r = run_bench(args + " --allocation-bound --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  double fixed_error = 0;
  for (const auto& row : j["rows"])
    if (row["method"] == "fixed-32ch") fixed_error = row["attention_rel_error"].get<double>();
  for (const auto& [rule, prefix] :
       {std::pair<std::string, std::string>{"paper", "fathom-"}, {"measured", "fathom-m-"}}) {
    const auto& bound = j["bits_at_fixed32_error_per_head_budgets"][rule];
    ASSERT_TRUE(bound.is_number()) << rule << ": " << r.output;
    double first_reaching = 1e9;
    for (const auto& row : j["rows"]) {
      const std::string name = row["method"];
      const bool own = name.rfind(prefix, 0) == 0 && (rule == "measured" || name[7] != 'm');
      if (own && row["attention_rel_error"].get<double>() <= fixed_error)
        first_reaching = std::min(first_reaching, row["bits_per_token"].get<double>());
    }
    EXPECT_LE(bound.get<double>(), first_reaching + 1e-9) << rule;
    EXPECT_GT(bound.get<double>(), 0.0) << rule;
  }
  const auto text = run_bench(args + " --rule measured --allocation-bound");
  EXPECT_NE(text.output.find("if each KV head took its own budget"), std::string::npos)
      << text.output;
  // Per-head budgets chosen on held-out calibration queries, scored on the test queries.
  const auto cal = run_bench(args + " --calibrated-budgets 2 --json");
  ASSERT_EQ(cal.exit_code, 0) << cal.output;
  const auto c = nlohmann::json::parse(cal.output);
  EXPECT_EQ(c["workload"]["budget_calibration_steps"], 2);
  for (const char* rule : {"paper", "measured"}) {
    EXPECT_TRUE(c["bits_at_fixed32_error_calibrated_head_budgets"].contains(rule)) << cal.output;
    // The split in whole budgets: one of the given budgets per KV head.
    const auto& split = c["calibrated_head_budgets"][rule];
    ASSERT_TRUE(split.is_array() && split.size() == 4u) << cal.output;
    for (const auto& b : split)
      EXPECT_TRUE(b == 16 || b == 32 || b == 64 || b == 128) << cal.output;
  }
  const auto too_many = run_bench(args + " --calibrated-budgets 65");
  EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
  EXPECT_EQ(too_many.output,
            "error: quality study: calibration steps: 65 calibration query steps asked for, 64 "
            "are held out; use at most 64\n");
  // Both group the heads differently: one at a time.
  const auto both =
      run_bench("quality --replay /nonexistent --model qwen3-8b --by-layer --allocation-bound");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_EQ(both.output,
            "error: --by-layer excludes --allocation-bound; run 'hisparse-bench --help'\n");
}

// With --klt each rule also gets its figure in the KLT basis, against the KLT 32-channel scan; on
// keys without QK-norm (correlated channels, flat variances) the rotation is what makes Fathom pay.
TEST(CliCommands, QualityStudyReportsTheKltBasisToo) {
  const std::string args =
      "quality --profile correlated --klt --kv-heads 2 --tokens 2048 --top-k 128 --budgets "
      "32,64,128";
  const auto r = run_bench(args + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto needed = nlohmann::json::parse(r.output)["bits_at_fixed32_error"];
  ASSERT_EQ(needed.size(), 4u) << needed.dump();
  for (const char* rule : {"paper", "measured"}) {
    ASSERT_TRUE(needed[rule].is_number()) << needed.dump();
    ASSERT_TRUE(needed[std::string(rule) + "_klt"].is_number()) << needed.dump();
    EXPECT_LT(needed[std::string(rule) + "_klt"].get<double>(), needed[rule].get<double>()) << rule;
  }
  const auto text = run_bench(args + " --rule measured");
  EXPECT_NE(text.output.find("measured rule, KLT basis: "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("bits at the 32-channel KLT scan's error"), std::string::npos)
      << text.output;
}

// --centre-keys is recorded, named in the text, and changes what the scanned methods read (the
// 32-channel scan's error), while the exact oracle's error stays the same.
TEST(CliCommands, QualityStudyCentresKeysWhenAsked) {
  const std::string base = "quality --kv-heads 2 --tokens 2048 --top-k 128 --budgets 32,64 --json";
  const auto plain = run_bench(base);
  const auto centred = run_bench(base + " --centre-keys");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(centred.exit_code, 0) << centred.output;
  const auto a = nlohmann::json::parse(plain.output), b = nlohmann::json::parse(centred.output);
  EXPECT_EQ(a["centre_keys"], false);
  EXPECT_EQ(b["centre_keys"], true);
  const auto error_of = [](const nlohmann::json& j, const std::string& method) {
    for (const auto& row : j["rows"])
      if (row["method"] == method) return row["attention_rel_error"].get<double>();
    return -1.0;
  };
  EXPECT_EQ(error_of(a, "oracle"), error_of(b, "oracle"));
  EXPECT_NE(error_of(a, "fixed-32ch"), error_of(b, "fixed-32ch"));
  const auto text = run_bench(
      "quality --kv-heads 1 --tokens 2048 --top-k 128 --budgets 32 "
      "--rule paper --centre-keys");
  EXPECT_NE(text.output.find("keys centred before quantization"), std::string::npos) << text.output;
}

TEST(CliCommands, QualityStudySaysWhenNoBudgetReachesTheError) {
  const auto r =
      run_bench("quality --kv-heads 2 --tokens 2048 --top-k 128 --budgets 8 --rule paper");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("synthetic keys (rope_qk_norm profile, seed 1)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("| fathom-8 |"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("fathom-m-8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("paper rule: no budget given reaches the 32-channel scan's error"),
            std::string::npos)
      << r.output;
}

TEST(CliCommands, QualityStudyRejectsBadInput) {
  const std::string capture = std::string(HISPARSE_TEST_FIXTURES) + "/replay/tiny-gqa";
  const std::pair<std::string, std::string> cases[] = {
      {"quality --budgets 600",
       "error: --budgets: budget 600 plane bits is outside 0..512 for head_dim 128; use a budget "
       "such as 40, 48, 64, 80 or 128\n"},
      {"quality --tokens 10",
       "error: --tokens: 10 tokens is out of range; use 1024 to 4194304 tokens, e.g. --tokens "
       "8192\n"},
      {"quality --tokens 2048 --top-k 20",
       "error: --top-k: top_k 20 does not fit 4 sinks + 32 recent tokens and half of 2048 tokens; "
       "use 37 to 1024\n"},
      {"quality --kv-heads 0",
       "error: --kv-heads: 0 is out of range; use 1 to 4096 KV heads, e.g. --kv-heads 32\n"},
      {"quality --profile flat",
       "error: --profile: flat not in {rope_qk_norm,independent,correlated}; run 'hisparse-bench "
       "--help'\n"},
      {"quality --threads -1",
       "error: --threads: -1 threads; use 0 (every hardware thread) or a positive count\n"},
      {"quality --replay " + capture,
       "error: --replay requires --model; run 'hisparse-bench --help'\n"},
      {"quality --replay /nonexistent/capture --model tiny-gqa",
       "error: --replay: /nonexistent/capture: does not exist; point it at a directory holding "
       "k.npy and q.npy, or at a .safetensors file\n"},
      {"quality --model tiny-gqa",
       "error: --model requires --replay; run 'hisparse-bench --help'\n"},
      {"quality --replay " + capture + " --model tiny-gqa --kv-heads 4",
       "error: --kv-heads excludes --replay; run 'hisparse-bench --help'\n"},
      {"quality --replay " + capture + " --model tiny-dsa",
       "error: --model: tiny-dsa is an MLA model; the Fathom quality study needs a GQA model "
       "(query heads grouped over KV heads); pass the GQA model the capture came from\n"},
      {"quality --replay " + capture + " --model tiny-gqa --layers 1",
       "error: --layers: layer 1 was not captured; use layers 0 to 0 (1 captured)\n"},
      {"quality --replay " + capture + " --model tiny-gqa --calibration-steps 8",
       "error: --calibration-steps: 8 of 8 captured query steps held out for calibration; hold "
       "out 1 to 7 steps\n"},
      {"quality --replay " + capture + " --model tiny-gqa --top-k 200",
       "error: --top-k: top_k 200 does not fit 4 sinks + 32 recent tokens and half of 256 "
       "tokens; use 37 to 128\n"}};
  for (const auto& [args, message] : cases) {
    const auto r = run_bench(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.output, message) << args;
  }
}

// The committed tiny-gqa capture (1 layer, 2 KV heads, 256 tokens, 8 query steps, no values)
// through the study: every captured KV head is a study head, half the steps calibrate.
TEST(CliCommands, QualityStudyReplaysACapture) {
  const std::string capture = std::string(HISPARSE_TEST_FIXTURES) + "/replay/tiny-gqa";
  const auto r = run_bench("quality --replay " + capture +
                           " --model tiny-gqa --top-k 64 --budgets 32,128 --rule paper --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  const auto& w = j["workload"];
  EXPECT_EQ(w["generator"], "replay");
  EXPECT_EQ(w["replay_path"], capture);
  EXPECT_EQ(w["model"], "tiny-gqa");
  EXPECT_EQ(w["layers"], nlohmann::json::array({0}));
  EXPECT_EQ(w["kv_heads"], 2);
  EXPECT_EQ(w["tokens"], 256);
  EXPECT_EQ(w["channels"], 32);
  EXPECT_EQ(w["query_heads"], 4);
  EXPECT_EQ(w["calibration_steps"], 4);
  EXPECT_EQ(w["test_steps"], 4);
  EXPECT_EQ(w["values"], "synthetic N(0, 1)");
  EXPECT_GE(w["threads"].get<int>(), 1);
  // Only what the study itself needs to say: how model layers would replay it does not apply.
  EXPECT_EQ(w["notes"],
            nlohmann::json::array({"no values (v) captured: values are synthetic N(0, 1)"}));
  EXPECT_EQ(j["rows"].size(), 7u);  // 5 comparison methods + fathom-32, fathom-128
  EXPECT_DOUBLE_EQ(j["rows"][4]["recall"].get<double>(), 1.0);  // the oracle
  const auto text = run_bench("quality --replay " + capture +
                              " --model tiny-gqa --top-k 64 --budgets 32 --rule paper "
                              "--calibration-steps 6 --tokens 200");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("captured keys (" + capture +
                             ", model tiny-gqa): layers 0 x 2 KV heads x 200 tokens, 4 query "
                             "heads x head_dim 32, 6 calibration + 2 scored query steps"),
            std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("note: no values (v) captured"), std::string::npos) << text.output;
  // Per-head budgets chosen on the capture's own calibration steps (4 here), scored on the rest.
  const std::string split = "quality --replay " + capture +
                            " --model tiny-gqa --top-k 64 --budgets 32,128 --rule paper --json "
                            "--calibrated-budgets ";
  const auto chosen = run_bench(split + "4");
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_TRUE(nlohmann::json::parse(chosen.output)["bits_at_fixed32_error_calibrated_head_budgets"]
                  .contains("paper"));
  const auto too_many = run_bench(split + "5");
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_EQ(too_many.output,
            "error: quality study: calibration steps: 5 calibration query steps asked for, 4 are "
            "held out; use at most 4\n");
}

// --scenario: the study runs on a decode scenario's own workload, one head per (layer, KV head),
// over the point's context and top_k; its calibrated split has one budget per (layer, KV head).
TEST(CliCommands, QualityStudyOfAScenariosWorkload) {
  const TempDir dir;
  dir.write("s.yaml",
            "name: s\nmodel: tiny-gqa\nmode: fathom\ncontext_length: 1024\ndecode_steps: 3\n"
            "warmup_steps: 1\nsweep: {top_k: [96, 128]}\nfathom: {centre_keys: true}\n");
  const std::string base = "quality --scenario " + (dir.path / "s.yaml").string() +
                           " --budgets 16,32,64,128 --rule paper --calibrated-budgets 4 --json";
  const auto r = run_bench(base + " --point 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["workload"]["generator"], "scenario");
  EXPECT_EQ(j["workload"]["kv_heads"], 4);  // 2 layers x 2 KV heads
  EXPECT_EQ(j["workload"]["tokens"], 1024);
  EXPECT_EQ(j["workload"]["test_steps"], 4);  // warmup + decode steps
  EXPECT_EQ(j["workload"]["calibration_steps"], 32);
  EXPECT_EQ(j["top_k"], 128);         // the point's
  EXPECT_EQ(j["centre_keys"], true);  // the scenario's
  const auto split = j["calibrated_head_budgets"]["paper"];
  EXPECT_TRUE(split.is_null() || split.size() == 4u) << split.dump();
  const auto text = run_bench("quality --scenario " + (dir.path / "s.yaml").string() +
                              " --budgets 16,64 --rule paper --top-k 64");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("a decode scenario's workload (s, point 0: tiny-gqa, context 1024): "
                             "2 layers x 2 KV heads x 1024 tokens, 4 query heads x head_dim 32, "
                             "32 calibration + 4 scored query steps, top_k 64"),
            std::string::npos)
      << text.output;
  // --by-layer: one row per model layer, over its 2 KV heads.
  const auto layers = run_bench("quality --scenario " + (dir.path / "s.yaml").string() +
                                " --budgets 16,32,64,128 --rule paper --by-layer --json");
  ASSERT_EQ(layers.exit_code, 0) << layers.output;
  const auto by_layer = nlohmann::json::parse(layers.output)["layers"];
  ASSERT_EQ(by_layer.size(), 2u) << layers.output;
  EXPECT_EQ(by_layer[1]["layer"], 1);
  const auto point = run_bench(base + " --point 2");
  EXPECT_EQ(point.exit_code, 2);
  EXPECT_EQ(point.output,
            "error: --point: point 2 of 2 points; use 0 to 1 (hisparse-bench validate lists "
            "them)\n");
  EXPECT_EQ(run_bench(base + " --replay x").exit_code, 2);
  const auto alone = run_bench("quality --calibration-steps 4");
  EXPECT_EQ(alone.output,
            "error: --calibration-steps: it applies to a capture or a scenario's workload; add "
            "--replay CAPTURE --model M or --scenario S, or leave it out\n");
}

// `capture` writes the study's generator for a model's shape; a decode scenario replays it.
TEST(CliCommands, CaptureWritesAReplayableSyntheticWorkload) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const std::string cap = (dir.path / "cap").string();
  const auto r = run_bench("capture --model tiny-gqa --out " + cap +
                           " --tokens 1024 --steps 2 --calibration-steps 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["layers"], 2);
  EXPECT_EQ(j["kv_heads"], 2);
  EXPECT_EQ(j["head_dim"], 32);
  EXPECT_EQ(j["tokens"], 1024);
  EXPECT_EQ(j["steps"], 5);
  EXPECT_TRUE(std::filesystem::exists(dir.path / "cap" / "layers.1.q.npy"));
  std::ofstream(dir.path / "s.yaml")
      << "name: s\nmodel: tiny-gqa\nmode: fathom\ncontext_length: 512\ntop_k: 64\n"
         "decode_steps: 2\nwarmup_steps: 0\nworkload: {generator: replay, replay_path: cap}\n";
  const auto run = run_bench("run " + (dir.path / "s.yaml").string() + " --backend cpu --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto metrics = nlohmann::json::parse(run.output)["points"][0]["metrics"];
  EXPECT_GT(metrics["attention_rel_error"].get<double>(), 0.0) << metrics.dump();
  EXPECT_EQ(run_bench("capture --model tiny-dsa --out " + cap).output,
            "error: capture --out: model tiny-dsa uses MLA; synthetic captures are written for GQA "
            "models (query heads grouped over KV heads)\n");
  EXPECT_EQ(run_bench("capture --model tiny-gqa --out " + cap + " --tokens 10").exit_code, 2);
}

// --by-layer: each captured layer's figures are those of a study of that layer alone.
TEST(CliCommands, QualityStudyByLayerEqualsEachLayerAlone) {
  // A 2-layer tiny-gqa capture (2 KV heads, 512 tokens, 6 query steps) of seeded normal keys with
  // channel scales spread over two decades.
  const TempDir dir;
  std::filesystem::create_directories(dir.path);
  const std::vector<std::int64_t> ks{2, 2, 512, 32}, qs{2, 6, 8, 32};
  std::vector<float> k(static_cast<std::size_t>(2 * 2 * 512 * 32)), q(2 * 6 * 8 * 32);
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = random_normal(7, i) * std::pow(10.0f, static_cast<float>(i % 32) / 16.0f - 1.0f);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = random_normal(8, i);
  write_npy(dir.path / "k.npy", NpyType::f32, ks, k);
  write_npy(dir.path / "q.npy", NpyType::f32, qs, q);
  const std::string base = "quality --replay " + dir.path.string() +
                           " --model tiny-gqa --top-k 64 --budgets 16,32,64,128 --json";
  const auto all = run_bench(base + " --by-layer");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  const auto j = nlohmann::json::parse(all.output);
  ASSERT_EQ(j["layers"].size(), 2u) << all.output;
  for (int layer : {0, 1}) {
    const auto alone = run_bench(base + " --layers " + std::to_string(layer));
    ASSERT_EQ(alone.exit_code, 0) << alone.output;
    const auto a = nlohmann::json::parse(alone.output);
    const auto& entry = j["layers"][static_cast<std::size_t>(layer)];
    EXPECT_EQ(entry["layer"], layer);
    EXPECT_EQ(entry["bits_at_fixed32_error"], a["bits_at_fixed32_error"]) << layer;
    for (const auto& row : a["rows"]) {
      if (row["method"] == "fixed-32ch") {
        EXPECT_EQ(entry["fixed32_error"], row["attention_rel_error"]);
      }
    }
  }
  EXPECT_FALSE(j["layers"][0]["bits_at_fixed32_error"] == j["layers"][1]["bits_at_fixed32_error"]);
  const auto text = run_bench("quality --replay " + dir.path.string() +
                              " --model tiny-gqa --top-k 64 --budgets 16,32,64,128 --rule paper "
                              "--by-layer");
  EXPECT_NE(text.output.find("per layer (its 2 KV heads alone)"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("| layer | 32-channel scan error | paper rule |"), std::string::npos)
      << text.output;
  EXPECT_EQ(run_bench("quality --by-layer").output,
            "error: --by-layer: it applies to a capture or a scenario's workload; add --replay "
            "CAPTURE --model M or --scenario S, or leave it out\n");
}

TEST(CliCommands, HelpDocumentsExitStatus) {
  const auto r = run_bench("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("Exit status: 0 success; 1 a sweep point failed"), std::string::npos);
  for (const char* sub : {"run", "validate", "list", "plan", "info", "quality"})
    EXPECT_NE(r.output.find(std::string("  ") + sub), std::string::npos) << sub;
  const auto run_help = run_bench("run --help");
  EXPECT_EQ(run_help.exit_code, 0);
  EXPECT_NE(run_help.output.find("--set"), std::string::npos);
  EXPECT_NE(run_help.output.find("Exit status:"), std::string::npos);
}

TEST(CliCommands, InfoOnCpuReportsDeviceAndCeilingAsJson) {
  const auto r = run_bench("info --backend cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["device"]["backend"], "cpu");
  EXPECT_GT(j["device"]["total_memory"].get<double>(), 0);
  EXPECT_GT(j["ceilings"]["host_copy_gbps"].get<double>(), 0);
  const auto bad = run_bench("info --backend tpu");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.output, "error: --backend: unknown backend 'tpu'; use auto, cuda or cpu\n");
}

}  // namespace
}  // namespace hisparse::test
