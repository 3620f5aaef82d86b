// `hisparse-bench quality`: the Fathom quality study on synthetic keys or a replayed capture, as a
// table, the bits each rule needs at the 32-channel scan's error, and (--by-layer) those per layer
// or those with a budget per KV head (--allocation-bound: the bound; --calibrated-budgets: budgets
// chosen on held-out calibration queries).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "fathom/quality_study.hpp"
#include "model/replay_study.hpp"
#include "model/synthetic_capture.hpp"
#include "scenario/scenario.hpp"

namespace hisparse::cli {
namespace {

using fathom::MethodSpec, fathom::PlanRule, fathom::QualityRow, fathom::ScanMethod;

/// What the study runs on, from the flags: the config, the capture of a replay, and the shape.
struct QualitySetup {
  fathom::QualityConfig config;
  std::unique_ptr<ReplayStudySource> replay;      ///< null: synthetic keys
  std::unique_ptr<WorkloadStudySource> scenario;  ///< --scenario: its workload
  std::string scenario_label;                     ///< "name, point N: model, context C"
  /// A capture's or a scenario's layers, in study-head order (each holds `layer_kv_heads` heads).
  std::vector<int> layers;
  int layer_kv_heads = 0;
  std::int64_t tokens = 0;
  int channels = 0, query_heads = 0;
  std::vector<PlanRule> rules;
};

QualitySetup quality_setup(const QualityOptions& q) {
  QualitySetup s;
  fathom::QualityConfig& cfg = s.config;
  cfg.top_k = q.top_k;
  cfg.klt = q.klt;
  cfg.centre_keys = q.centre_keys;
  cfg.float_scores = q.float_scores;
  if (q.threads < 0)
    throw Error("--threads", fmt::format("{} threads", q.threads),
                "use 0 (every hardware thread) or a positive count");
  for (const auto& [flag, given] : {std::pair{"--calibration-steps", q.calibration_steps != -1},
                                    std::pair{"--by-layer", q.by_layer}})
    if (given && q.replay.empty() && q.scenario.empty())
      throw Error(flag, "it applies to a capture or a scenario's workload",
                  "add --replay CAPTURE --model M or --scenario S, or leave it out");
  if (!q.scenario.empty()) {
    // Every (model layer, KV head) of the scenario's first request is a study head.
    const Scenario scenario = load_scenario(find_scenario(q.scenario, "--scenario"));
    const auto points = scenario.expand();
    if (q.point >= static_cast<int>(points.size()))
      throw Error(
          "--point", fmt::format("point {} of {} points", q.point, points.size()),
          fmt::format("use 0 to {} (hisparse-bench validate lists them)", points.size() - 1));
    const SweepPoint& p = points[static_cast<std::size_t>(q.point)];
    const int calibration = q.calibration_steps < 0 ? 32 : q.calibration_steps;
    if (calibration < 1)
      throw Error("--calibration-steps", fmt::format("{} steps", calibration),
                  "hold out at least 1 step");
    s.scenario = std::make_unique<WorkloadStudySource>(
        scenario.models.at(p.model), p.config.workload, p.config.context_length,
        scenario.warmup_steps + scenario.decode_steps, calibration, "--scenario");
    cfg.kv_heads = s.scenario->heads();
    cfg.source = [source = s.scenario.get()](int head) { return source->head(head); };
    cfg.klt = cfg.klt || scenario.fathom.klt;
    cfg.centre_keys = cfg.centre_keys || scenario.fathom.centre_keys;
    if (!q.top_k_given) cfg.top_k = p.config.top_k;
    s.tokens = s.scenario->tokens();
    s.channels = s.scenario->head_dim();
    s.query_heads = s.scenario->group();
    for (int l = 0; l < s.scenario->layers(); ++l) s.layers.push_back(l);
    s.layer_kv_heads = s.scenario->kv_heads();
    s.scenario_label = fmt::format("{}, point {}: {}, context {}", scenario.name, q.point, p.model,
                                   p.config.context_length);
  } else if (!q.replay.empty()) {
    // Every (captured layer, KV head) is a study head.
    s.replay = std::make_unique<ReplayStudySource>(q.replay, load_model_named(q.model, "--model"),
                                                   q.tokens, q.calibration_steps, q.layers);
    cfg.kv_heads = s.replay->heads();
    cfg.source = [replay = s.replay.get()](int head) { return replay->head(head); };
    s.tokens = s.replay->tokens();
    s.channels = s.replay->head_dim();
    s.query_heads = s.replay->group();
    s.layers = s.replay->layers();
    s.layer_kv_heads = s.replay->kv_heads();
  } else {
    s.tokens = q.tokens == 0 ? 8192 : q.tokens;
    if (s.tokens < 1024 || s.tokens > (std::int64_t{1} << 22))
      throw Error("--tokens", fmt::format("{} tokens is out of range", s.tokens),
                  "use 1024 to 4194304 tokens, e.g. --tokens 8192");
    if (q.kv_heads < 1 || q.kv_heads > 4096)
      throw Error("--kv-heads", fmt::format("{} is out of range", q.kv_heads),
                  "use 1 to 4096 KV heads, e.g. --kv-heads 32");
    cfg.workload.profile = q.profile == "independent"  ? fathom::KeyProfile::independent
                           : q.profile == "correlated" ? fathom::KeyProfile::correlated
                                                       : fathom::KeyProfile::rope_qk_norm;
    cfg.workload.tokens = s.tokens;
    cfg.workload.steps = 1;
    cfg.workload.seed = q.seed;
    cfg.kv_heads = q.kv_heads;
    s.channels = cfg.workload.channels;
    s.query_heads = cfg.workload.heads;
  }
  if (cfg.top_k <= cfg.sinks + cfg.recent || cfg.top_k > s.tokens / 2)
    throw Error(s.scenario && !q.top_k_given ? "--scenario: top_k" : "--top-k",
                fmt::format("top_k {} does not fit {} sinks + {} recent tokens and "
                            "half of {} tokens",
                            cfg.top_k, cfg.sinks, cfg.recent, s.tokens),
                fmt::format("use {} to {}", cfg.sinks + cfg.recent + 1, s.tokens / 2));
  if (q.budgets.empty())
    throw Error("--budgets", "no budget given", "list plane-bit budgets, e.g. --budgets 32,48,64");
  for (int b : q.budgets) fathom::check_budget(b, s.channels, "--budgets");
  // Every hardware thread by default, as far as half the free host memory holds the heads.
  cfg.threads = fathom::study_threads(q.threads, std::thread::hardware_concurrency(),
                                      Device::cpu().properties().free_memory, s.tokens, s.channels);
  if (q.rule != "measured") s.rules.push_back(PlanRule::paper);
  if (q.rule != "paper") s.rules.push_back(PlanRule::measured);
  for (const auto& m : fathom::default_methods())
    if (m.method != ScanMethod::fathom) cfg.methods.push_back(m);
  for (PlanRule rule : s.rules)
    for (int b : q.budgets) {
      MethodSpec m{ScanMethod::fathom, b, 0};
      m.rule = rule;
      cfg.methods.push_back(m);
    }
  return s;
}

/// The bits one rule's Fathom rows need at the 32-channel scan's error, in one basis. Not reached
/// when no budget given gets down to that error (then null, and the text says so).
struct Needed {
  std::string key;    ///< JSON key: "paper", "measured", "paper_klt", ...
  std::string label;  ///< "paper rule", "measured rule, KLT basis"
  PlanRule rule;
  const QualityRow* fixed;  ///< the 32-channel scan of the same basis
  std::optional<double> bits;
  std::vector<int> budgets;  ///< --calibrated-budgets: the whole-budget split per KV head
  /// --calibrated-budgets: the split on the same path at each --budgets value as a mean budget.
  std::map<int, std::vector<int>> by_budget;
};

/// Per rule, in the plain basis and, with `klt`, in the KLT basis against the KLT 32-channel scan.
std::vector<Needed> bits_needed(const std::vector<QualityRow>& rows,
                                const std::vector<PlanRule>& rules, bool klt_too) {
  std::vector<Needed> needed;
  for (const bool klt : {false, true}) {
    if (klt && !klt_too) continue;
    const auto fixed = std::find_if(rows.begin(), rows.end(), [&](const QualityRow& r) {
      return r.name == (klt ? "fixed-klt-32ch" : "fixed-32ch");
    });
    for (PlanRule rule : rules) {
      std::vector<QualityRow> own;
      for (const auto& r : rows)
        if (r.method.method == ScanMethod::fathom && r.method.rule == rule && r.method.klt == klt)
          own.push_back(r);
      const bool reached = std::any_of(own.begin(), own.end(), [&](const QualityRow& r) {
        return r.attention_error <= fixed->attention_error;
      });
      Needed n{std::string(fathom::plan_rule_name(rule)) + (klt ? "_klt" : ""),
               fmt::format("{} rule{}", fathom::plan_rule_name(rule), klt ? ", KLT basis" : ""),
               rule,
               &*fixed,
               std::nullopt,
               {},
               {}};
      if (reached) n.bits = fathom::fathom_bits_at_error(own, fixed->attention_error, klt);
      needed.push_back(std::move(n));
    }
  }
  return needed;
}

nlohmann::json bits_json(const std::vector<Needed>& needed) {
  nlohmann::json out = nlohmann::json::object();
  for (const Needed& n : needed)
    out[n.key] = n.bits ? nlohmann::json(*n.bits) : nlohmann::json(nullptr);
  return out;
}

nlohmann::json workload_json(const QualityOptions& q, const QualitySetup& s) {
  nlohmann::json w{{"threads", s.config.threads},
                   {"tokens", s.tokens},
                   {"kv_heads", s.config.kv_heads},
                   {"channels", s.channels},
                   {"query_heads", s.query_heads}};
  if (const WorkloadStudySource* w_source = s.scenario.get()) {
    w["generator"] = "scenario";
    w["scenario"] = q.scenario;
    w["point"] = q.point;
    w["layers"] = w_source->layers();
    w["model_kv_heads"] = w_source->kv_heads();
    w["calibration_steps"] = w_source->calibration_steps();
    w["test_steps"] = w_source->test_steps();
    w["notes"] = w_source->notes();
  } else if (const ReplayStudySource* r = s.replay.get()) {
    w["generator"] = "replay";
    w["replay_path"] = q.replay;
    w["model"] = q.model;
    w["layers"] = r->layers();
    w["model_kv_heads"] = r->kv_heads();
    w["calibration_steps"] = r->calibration_steps();
    w["test_steps"] = r->test_steps();
    w["values"] = r->captured_values() ? "captured" : "synthetic N(0, 1)";
    w["notes"] = r->notes();
  } else {
    w["generator"] = "synthetic";
    w["profile"] = q.profile;
    w["seed"] = q.seed;
  }
  return w;
}

void print_header(const QualityOptions& q, const QualitySetup& s,
                  const fathom::AttentionStats& stats) {
  const std::string options =
      fmt::format("top_k {}{}{}", s.config.top_k,
                  s.config.centre_keys ? ", keys centred before quantization" : "",
                  q.float_scores ? ", float-weight scores" : "");
  if (const WorkloadStudySource* w = s.scenario.get()) {
    fmt::print(
        "Fathom quality study, CPU, a decode scenario's workload ({}): {} layers x {} KV heads x "
        "{} tokens, {} query heads x head_dim {}, {} calibration + {} scored query steps, {}\n",
        s.scenario_label, w->layers(), w->kv_heads(), s.tokens, s.query_heads, s.channels,
        w->calibration_steps(), w->test_steps(), options);
    for (const auto& note : w->notes()) fmt::print("note: {}\n", note);
  } else if (const ReplayStudySource* r = s.replay.get()) {
    fmt::print(
        "Fathom quality study, CPU, captured keys ({}, model {}): layers {} x {} KV heads x {} "
        "tokens, {} query heads x head_dim {}, {} calibration + {} scored query steps, {}\n",
        q.replay, q.model, fmt::join(r->layers(), ","), r->kv_heads(), s.tokens, s.query_heads,
        s.channels, r->calibration_steps(), r->test_steps(), options);
    for (const auto& note : r->notes()) fmt::print("note: {}\n", note);
  } else {
    fmt::print(
        "Fathom quality study, CPU, synthetic keys ({} profile, seed {}): {} KV heads x {} tokens, "
        "{} query heads x head_dim {}, {}\n",
        q.profile, q.seed, q.kv_heads, s.tokens, s.query_heads, s.channels, options);
  }
  fmt::print(
      "dense attention: entropy {:.2f} nats, sinks {:.3f}, last 32 {:.3f}, exact top-k "
      "selection {:.3f} of the mass\n\n",
      stats.entropy, stats.sink_mass, stats.recent_mass, stats.selected_mass);
}

void print_needed(const std::vector<Needed>& needed) {
  for (const Needed& n : needed) {
    const char* scan = n.fixed->method.klt ? "32-channel KLT scan" : "32-channel scan";
    if (n.bits)
      fmt::print("{}: {:.1f} bits at the {}'s error ({:.5f}), {:.3f}x of its {}\n", n.label,
                 *n.bits, scan, n.fixed->attention_error, *n.bits / n.fixed->bits_per_token,
                 n.fixed->bits_per_token);
    else
      fmt::print(
          "{}: no budget given reaches the {}'s error ({:.5f}); add larger budgets to --budgets\n",
          n.label, scan, n.fixed->attention_error);
  }
}

/// --by-layer: one row per layer of the capture or scenario, the figures over its KV heads alone.
void print_layers(const QualitySetup& s, const std::vector<std::vector<Needed>>& layer_needs) {
  fmt::print("\nper layer (its {} KV heads alone): bits at its 32-channel scan's error\n\n",
             s.layer_kv_heads);
  std::string header = "| layer | 32-channel scan error |", rule_line = "| ---: | ---: |";
  for (const Needed& n : layer_needs.front()) {
    header += fmt::format(" {} |", n.label);
    rule_line += " ---: |";
  }
  fmt::print("{}\n{}\n", header, rule_line);
  for (std::size_t g = 0; g < layer_needs.size(); ++g) {
    std::string line =
        fmt::format("| {} | {:.5f} |", s.layers[g], layer_needs[g].front().fixed->attention_error);
    for (const Needed& n : layer_needs[g])
      line += n.bits
                  ? fmt::format(" {:.1f} ({:.3f}x) |", *n.bits, *n.bits / n.fixed->bits_per_token)
                  : std::string(" not reached |");
    fmt::print("{}\n", line);
  }
}

}  // namespace

int quality_command(const QualityOptions& q, const CommonOptions& o) {
  const QualitySetup s = quality_setup(q);
  const auto stats = fathom::attention_stats(s.config);
  // Groups: each captured layer's KV heads (--by-layer), or each KV head (--allocation-bound,
  // --calibrated-budgets).
  const bool per_head = q.allocation_bound || q.calibrated_budgets > 0;
  const int group_heads = q.by_layer ? s.layer_kv_heads : per_head ? 1 : 0;
  const auto study = fathom::quality_study_grouped(s.config, group_heads);
  const std::vector<Needed> needed = bits_needed(study.rows, s.rules, s.config.klt);
  std::vector<std::vector<Needed>> layer_needs;
  if (q.by_layer)
    for (const auto& layer_rows : study.groups)
      layer_needs.push_back(bits_needed(layer_rows, s.rules, s.config.klt));
  std::vector<Needed> bounds;  // --allocation-bound: the same rules and bases, heads split
  if (q.allocation_bound)
    for (Needed n : needed) {
      n.bits = fathom::per_head_allocation_bits(study.groups, n.fixed->attention_error, n.rule,
                                                n.fixed->method.klt);
      bounds.push_back(std::move(n));
    }
  std::vector<Needed> calibrated;  // --calibrated-budgets: split on calibration queries
  if (q.calibrated_budgets > 0) {
    fathom::QualityConfig on_calibration = s.config;
    on_calibration.score_calibration_steps = q.calibrated_budgets;
    const auto chosen = fathom::quality_study_grouped(on_calibration, 1);
    for (Needed n : needed) {
      const auto split = fathom::per_head_allocation(
          chosen.groups, study.groups, n.fixed->attention_error, n.rule, n.fixed->method.klt);
      n.bits = split ? std::optional<double>(split->bits) : std::nullopt;
      if (split) n.budgets = split->budgets;
      n.by_budget = fathom::per_head_splits_at_mean_budgets(chosen.groups, n.rule,
                                                            n.fixed->method.klt, q.budgets);
      calibrated.push_back(std::move(n));
    }
  }

  if (o.json) {
    nlohmann::json j{{"backend", "cpu"},
                     {"workload", workload_json(q, s)},
                     {"top_k", s.config.top_k},
                     {"centre_keys", s.config.centre_keys},
                     {"float_scores", q.float_scores},
                     {"attention",
                      {{"entropy_nats", stats.entropy},
                       {"sink_mass", stats.sink_mass},
                       {"recent_mass", stats.recent_mass},
                       {"selected_mass", stats.selected_mass}}},
                     {"rows", nlohmann::json::array()},
                     {"bits_at_fixed32_error", bits_json(needed)}};
    for (const auto& r : study.rows)
      j["rows"].push_back({{"method", r.name},
                           {"bits_per_token", r.bits_per_token},
                           {"active_channels", r.active_channels},
                           {"recall", r.recall},
                           {"attention_rel_error", r.attention_error}});
    if (q.allocation_bound) j["bits_at_fixed32_error_per_head_budgets"] = bits_json(bounds);
    if (q.calibrated_budgets > 0) {
      j["bits_at_fixed32_error_calibrated_head_budgets"] = bits_json(calibrated);
      // The split itself, in whole budgets: one per study head (layer by layer for a capture).
      for (const Needed& n : calibrated) {
        j["calibrated_head_budgets"][n.key] =
            n.budgets.empty() ? nlohmann::json(nullptr) : nlohmann::json(n.budgets);
        // The splits at each study budget as a mean, which fathom.head_budgets picks by the
        // point's budget_bits.
        nlohmann::json by = nlohmann::json::object();
        for (const auto& [mean, split] : n.by_budget) by[std::to_string(mean)] = split;
        j["calibrated_head_budgets_by_budget"][n.key] =
            n.by_budget.empty() ? nlohmann::json(nullptr) : by;
      }
      j["workload"]["budget_calibration_steps"] = q.calibrated_budgets;
    }
    for (std::size_t g = 0; g < layer_needs.size(); ++g)
      j["layers"].push_back({{"layer", s.layers[g]},
                             {"fixed32_error", layer_needs[g].front().fixed->attention_error},
                             {"bits_at_fixed32_error", bits_json(layer_needs[g])}});
    print_json(j);
    return exit_code::ok;
  }
  print_header(q, s, stats);
  fmt::print("{}\n", fathom::format_quality_table(study.rows));
  print_needed(needed);
  if (!bounds.empty()) {
    fmt::print(
        "\nif each KV head took its own budget (the best split of the same mean bits, chosen "
        "knowing every head's error curve: a bound on cross-head allocation, not a planner):\n");
    print_needed(bounds);
  }
  if (!calibrated.empty()) {
    fmt::print(
        "\nwith a budget per KV head chosen on {} held-out calibration query steps and scored on "
        "the test queries (fixed per-head budgets):\n",
        q.calibrated_budgets);
    print_needed(calibrated);
    for (const Needed& n : calibrated) {
      if (n.budgets.empty()) continue;
      std::vector<int> b = n.budgets;
      std::sort(b.begin(), b.end());
      fmt::print(
          "{}: budgets per KV head min {}, median {}, max {} (calibrated_head_budgets in "
          "the JSON)\n",
          n.label, b.front(), b[b.size() / 2], b.back());
      if (!n.by_budget.empty())
        fmt::print(
            "{}: splits on the same path at mean budgets {}..{} (calibrated_head_budgets_by_budget "
            "in the JSON)\n",
            n.label, n.by_budget.begin()->first, n.by_budget.rbegin()->first);
    }
  }
  if (!layer_needs.empty()) print_layers(s, layer_needs);
  return exit_code::ok;
}

int capture_command(const CaptureOptions& c, const CommonOptions& o) {
  fathom::SyntheticKeySpec spec;
  spec.profile = c.profile == "independent"  ? fathom::KeyProfile::independent
                 : c.profile == "correlated" ? fathom::KeyProfile::correlated
                                             : fathom::KeyProfile::rope_qk_norm;
  spec.tokens = c.tokens;
  spec.steps = c.steps;
  spec.calibration_queries = c.calibration_steps;
  spec.seed = c.seed;
  const auto written =
      write_synthetic_capture(c.out, load_model_named(c.model, "--model"), spec, "capture --out");
  if (o.json) {
    print_json({{"out", c.out},
                {"model", c.model},
                {"profile", c.profile},
                {"seed", c.seed},
                {"layers", written.layers},
                {"kv_heads", written.kv_heads},
                {"q_heads", written.q_heads},
                {"head_dim", written.head_dim},
                {"tokens", written.tokens},
                {"steps", written.steps},
                {"calibration_steps", c.calibration_steps},
                {"bytes", written.bytes}});
    return exit_code::ok;
  }
  fmt::print(
      "synthetic capture ({} profile, seed {}) for {}: {} layers x {} KV heads x {} tokens, {} "
      "query heads x head_dim {}, {} query steps ({} test, then {} held out); {:.1f} MB in {}\n",
      c.profile, c.seed, c.model, written.layers, written.kv_heads, written.tokens, written.q_heads,
      written.head_dim, written.steps, c.steps, c.calibration_steps,
      static_cast<double>(written.bytes) / 1e6, c.out);
  fmt::print(
      "replay it with 'workload: {{generator: replay, replay_path: {}}}' (warmup + decode steps "
      "<= {}), and study a scenario replaying it with 'hisparse-bench quality --scenario S "
      "--calibration-steps {}' (warmup + decode steps = {})\n",
      c.out, c.steps, c.calibration_steps, c.steps);
  return exit_code::ok;
}

}  // namespace hisparse::cli
