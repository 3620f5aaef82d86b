// hisparse-bench: the main command-line tool. Parses flags (CLI11) and calls libhisparse; the
// subcommands live in commands.cpp. Every failure is one line "error: ..." on stderr.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "report/compare.hpp"

namespace {

constexpr const char* kFooter =
    "Exit status: 0 success; 1 a sweep point failed (the other points completed and were "
    "written); 2 bad input (flags, scenario or model YAML, files, impossible sizes) or no usable "
    "backend; 124 a step ran past twice point_time_limit_s; 130 / 143 stopped by SIGINT / "
    "SIGTERM (completed points kept: continue with run --resume DIR).\n"
    "Scenarios: scenarios/*.yaml (hisparse-bench list scenarios); every command, flag and key: "
    "tools/hisparse-bench/README.md.";

void print_error(const std::string& message) {
  std::string line = message;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "error: %s\n", line.c_str());
}

int run_cli(int argc, char** argv) {
  using namespace hisparse;
  CLI::App app{
      "hisparse-bench: HiSparse and Fathom decode benchmarks (runs, traces, regression "
      "comparison, reports, validation, capacity planning, device ceilings)",
      "hisparse-bench"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.set_version_flag("--version", HISPARSE_VERSION);

  cli::CommonOptions common;
  for (int i = 0; i < argc; ++i)
    common.command_line += (i ? " " : "") + cli::shell_quote(i == 0 ? "hisparse-bench" : argv[i]);

  auto add_json = [&](CLI::App* sub) {
    sub->add_flag("--json", common.json, "Print machine-readable JSON on stdout (nothing else)");
  };
  auto add_quiet = [&](CLI::App* sub) {
    sub->add_flag("--quiet,-q", common.quiet, "Print errors only (no progress, no tables)");
  };
  auto add_backend = [&](CLI::App* sub) {
    sub->add_option("--backend", common.backend,
                    "auto|cuda|cpu (default: the scenario's backend, else auto)");
  };
  auto add_set = [&](CLI::App* sub) {
    sub->add_option("--set", common.sets,
                    "Override a scenario key before validation, e.g. --set workload.seed=7 or "
                    "--set sweep.concurrency=[1,2,4] (value parsed as YAML; repeatable)")
        ->allow_extra_args(false);
  };

  std::string scenario;
  cli::RunRequest run_request;
  auto* run = app.add_subcommand("run",
                                 "Run a scenario's sweep and write results.json, "
                                 "results.csv, summary.md and report.html");
  run->add_option("SCENARIO", scenario, "Scenario YAML, or a name from 'list scenarios'")
      ->required();
  run->add_option("--out", common.out, "Output folder (default: the scenario's outputs.dir)");
  add_backend(run);
  add_set(run);
  run->add_flag("--trace", run_request.trace,
                "Trace the first measured steps of every point with CUPTI: writes trace.json "
                "(open at ui.perfetto.dev) and gpu_phase_ms per point (CUDA backend)");
  run->add_option("--trace-steps", run_request.steps,
                  "Steps traced per point (default: the scenario's trace.steps, else 4)")
      ->check(CLI::Range(1, 1000000));
  run->add_option("--repetitions", run_request.repetitions,
                  "Run every point N times, each with a fresh engine (default: the scenario's "
                  "repetitions, else 1): the repetitions the gate's rank test judges timings by")
      ->check(CLI::Range(1, 1000));
  run->add_option("--resume", run_request.resume,
                  "Continue the sweep whose results are in DIR (an interrupted run's --out): "
                  "checks the scenario, build and device match, keeps every completed point and "
                  "runs the rest");
  run->add_flag("--verify", run_request.verify,
                "Check every point as it runs: CUDA points step a CPU twin of the same "
                "configuration and must decode the same tokens, hits and misses every step and "
                "the same attention queries and outputs of every layer on sampled steps; a NaN "
                "or Inf anywhere fails the point naming the layer and phase (both backends)");
  run->add_option("--verify-every", run_request.verify_every,
                  "With --verify, compare the layer tensors every N steps from the first "
                  "(default 4; tokens, hits and misses every step); implies --verify")
      ->check(CLI::Range(1, 1000000));
  run->add_flag("--save-selections", run_request.save_selections,
                "Write every hot-buffer point's recorded selections (all steps since admission) as "
                "text traces, one per layer and stream, under OUT/selections/point-N/: the input "
                "of 'hisparse-bench policies'");
  add_json(run);
  add_quiet(run);
  run->footer(kFooter);

  std::string trace_scenario;
  auto* trace = app.add_subcommand(
      "trace",
      "Trace a scenario: 'run --trace' with the measured steps reduced to the traced ones "
      "(warm-up + N steps per point)");
  trace->add_option("SCENARIO", trace_scenario, "Scenario YAML, or a name from 'list scenarios'")
      ->required();
  trace->add_option("--out", common.out, "Output folder (default: the scenario's outputs.dir)");
  trace
      ->add_option("--trace-steps", run_request.steps,
                   "Steps traced (and measured) per point (default: trace.steps, else 4)")
      ->check(CLI::Range(1, 1000000));
  add_backend(trace);
  add_set(trace);
  add_json(trace);
  add_quiet(trace);
  trace->footer(kFooter);

  cli::CompareArgs compare_args;
  auto* compare = app.add_subcommand(
      "compare",
      "Compare two results.json point by point on one metric: the gate without a gate file "
      "(exit 0 pass, 1 a regression, 2 bad input)");
  compare->add_option("BASE", compare_args.base, "Baseline results.json")->required();
  compare->add_option("NEW", compare_args.next, "New results.json")->required();
  compare
      ->add_option("--threshold", compare_args.threshold_pct,
                   "Smallest change in percent that counts (default 5); a change must also "
                   "exceed the step-time p10..p90 spread of both runs")
      ->check(CLI::Range(0.0, 1e9));
  compare
      ->add_option("--metric", compare_args.metric,
                   "tokens_per_s (default, higher is better), step_ms.median (lower), or a "
                   "selection metric without noise allowance: selection_recall (higher), "
                   "attention_rel_error (lower), hit_rate (higher), bytes_h2d_per_step (lower), "
                   "bits_per_token (lower)")
      ->check(CLI::IsMember(compare_metric_names()));
  compare->add_flag("--allow-different-devices", compare_args.allow_different_devices,
                    "Compare results of different backends or devices anyway");
  add_json(compare);
  add_quiet(compare);
  compare->footer(
      "Exit status: 0 no regression; 1 a regression (slower or worse beyond the threshold, a "
      "point that ran in BASE and failed or is missing in NEW); 2 bad input (missing file, bad "
      "JSON, schema version "
      "mismatch, different devices, no matching point).");

  cli::GateArgs gate_args;
  auto* gate = app.add_subcommand(
      "gate",
      "CI regression gate: judge results against a committed baseline as its gate.yaml says "
      "(exit 0 pass, 1 a gated regression, 2 bad input or results that do not match)");
  gate->add_option("BASELINE", gate_args.baseline,
                   "Baseline folder with gate.yaml (e.g. reports/baselines/cpu), a folder of "
                   "baseline files (the default gate), or one baseline file")
      ->required();
  gate->add_option("RESULTS", gate_args.inputs,
                   "results.json of 'hisparse-bench run' and Google Benchmark JSON of "
                   "hisparse-microbench; several files of one baseline are pooled as repetitions")
      ->required();
  gate->add_flag("--allow-different-devices", gate_args.allow_different_devices,
                 "Judge timings of another device or backend anyway (a warning instead of exit 2)");
  gate->add_flag("--update", gate_args.update,
                 "Write RESULTS as the new baselines, after printing what changed (exit 0)");
  gate->add_flag("--all", gate_args.all, "Print every row, 'same' ones included");
  gate->add_option("--out", common.out,
                   "Also write gate.json, gate.md and report.html (baseline and new run as two "
                   "series, verdicts marked) into this folder");
  add_json(gate);
  add_quiet(gate);
  gate->footer(
      "Exit status: 0 pass (every verdict same, faster, better, ambiguous, added or "
      "not_measured); 1 a gated regression (slower, worse, changed, failed or missing); 2 bad "
      "input (unreadable files, a gate.yaml error, an input no baseline matches, a schema this "
      "build does not read, a scenario that differs from the baseline's, timings of another "
      "device).");

  std::vector<std::string> report_inputs;
  auto* report = app.add_subcommand(
      "report",
      "Regenerate results.csv, summary.md and report.html (inline SVG plots) from results.json");
  report->add_option("RESULTS", report_inputs, "One or more results.json (several are merged)")
      ->required();
  report->add_option("--out", common.out,
                     "Output folder (default: the folder of the one RESULTS file)");
  add_json(report);
  add_quiet(report);
  report->footer(kFooter);

  std::vector<std::string> to_validate;
  auto* validate = app.add_subcommand("validate", "Check scenario files without running them");
  validate->add_option("SCENARIO", to_validate, "Scenario YAML files or names")->required();
  add_set(validate);
  add_json(validate);
  add_quiet(validate);
  validate->footer(kFooter);

  std::string what = "all";
  auto* list = app.add_subcommand("list", "List model presets, scenarios and modes");
  list->add_option("WHAT", what, "models|scenarios|modes|all (default all)")
      ->check(CLI::IsMember({"models", "scenarios", "modes", "all"}));
  add_json(list);
  list->footer(kFooter);

  cli::PlanOptions plan_opts;
  auto* plan = app.add_subcommand(
      "plan", "Capacity planner: GPU and host bytes per request and admitted concurrency per mode");
  plan->add_option("--model", plan_opts.model, "Model preset or path to a model YAML")->required();
  plan->add_option("--context", plan_opts.context, "Tokens per request (default 131072)");
  plan->add_option("--gpu-mem-gib", plan_opts.gpu_mem_gib,
                   "GPU memory in GiB (2^30 B) (default 141)");
  plan->add_option("--top-k", plan_opts.top_k, "Selected rows per step (0: model default)");
  plan->add_option("--hot-buffer", plan_opts.hot_buffer, "HiSparse slots (0: 2 * top_k)");
  plan->add_option("--budget-bits", plan_opts.budget_bits, "Fathom bit budget (default 48)");
  plan->add_option("--host-mem-gib", plan_opts.host_mem_gib,
                   "Pinned host memory budget in GiB (default 0: unlimited)");
  plan->add_option("--concurrency", plan_opts.concurrency,
                   "Requests for the 'longest context' column: the longest context at which this "
                   "many requests of each mode fit (default 1)");
  add_json(plan);
  plan->footer(kFooter);

  cli::QualityOptions quality_opts;
  auto* quality = app.add_subcommand(
      "quality",
      "Fathom quality study on synthetic or captured keys (CPU): recall and attention error of "
      "every method at equal cost, and the bits Fathom needs at the 32-channel scan's error");
  auto* profile =
      quality
          ->add_option("--profile", quality_opts.profile,
                       "Synthetic keys: rope_qk_norm (default) | independent | correlated")
          ->check(CLI::IsMember({"rope_qk_norm", "independent", "correlated"}));
  auto* tokens =
      quality->add_option("--tokens", quality_opts.tokens,
                          "Context tokens per KV head (default 8192; with --replay every captured "
                          "token)");
  auto* kv_heads = quality->add_option("--kv-heads", quality_opts.kv_heads,
                                       "KV heads (workload seeds) averaged (default 32)");
  auto* top_k = quality->add_option(
      "--top-k", quality_opts.top_k,
      "Selected tokens per query head (default 256, or the scenario point's top_k)");
  quality
      ->add_option("--budgets", quality_opts.budgets,
                   "Fathom plane-bit budgets, comma-separated (default 32,40,48,56,64,80,96,128)")
      ->delimiter(',');
  quality
      ->add_option("--rule", quality_opts.rule,
                   "Fathom planner rule: paper | measured | both (default both)")
      ->check(CLI::IsMember({"paper", "measured", "both"}));
  quality->add_flag("--klt", quality_opts.klt,
                    "Also every fathom and fixed-channel method in the keys' KLT basis");
  quality->add_flag("--centre-keys", quality_opts.centre_keys,
                    "Quantize every scanned method's keys minus their calibration mean");
  quality->add_flag("--float-scores", quality_opts.float_scores,
                    "Score with float weights (REFERENCE.md's formula), not the shipped scan's "
                    "8-bit weights");
  auto* seed = quality->add_option("--seed", quality_opts.seed,
                                   "Workload seed of the first KV head (default 1)");
  auto* replay =
      quality->add_option("--replay", quality_opts.replay,
                          "Captured keys and queries instead of synthetic ones: a directory of "
                          ".npy files or a .safetensors file (tools/hisparse-bench/README.md, "
                          "'Replayed workloads'); every captured layer and KV head is a study "
                          "head");
  auto* model = quality->add_option("--model", quality_opts.model,
                                    "With --replay: the GQA model preset or YAML the capture "
                                    "came from");
  auto* layers = quality
                     ->add_option("--layers", quality_opts.layers,
                                  "With --replay: captured layers to study, comma-separated "
                                  "(default all)")
                     ->delimiter(',');
  quality->add_option(
      "--calibration-steps", quality_opts.calibration_steps,
      "With --replay: the first N captured query steps calibrate the fixed channel set, the "
      "others are scored (default half); with --scenario: the N steps after the decode steps "
      "(default 32)");
  auto* study_scenario = quality->add_option(
      "--scenario", quality_opts.scenario,
      "Study a decode scenario's own workload (name or path; synthetic or replayed): every model "
      "layer x KV head of its first request is a study head, over the point's context, top_k and "
      "decode steps, so --calibrated-budgets gives the table fathom.head_budgets loads");
  quality->add_option("--point", quality_opts.point, "With --scenario: the sweep point (default 0)")
      ->needs(study_scenario)
      ->check(CLI::NonNegativeNumber);
  quality->add_option("--threads", quality_opts.threads,
                      "KV heads studied at once (default 0: every hardware thread, as far as half "
                      "the free host memory holds them); the figures do not depend on it");
  auto* by_layer = quality->add_flag(
      "--by-layer", quality_opts.by_layer,
      "With --replay or --scenario: also the bits each rule needs per layer, over its KV heads "
      "alone");
  quality
      ->add_flag("--allocation-bound", quality_opts.allocation_bound,
                 "Also the bits Fathom would need if each KV head took its own budget: the best "
                 "split of the same mean bits over the heads, chosen knowing every head's error "
                 "curve (an upper bound on what a cross-head allocation could gain)")
      ->excludes(by_layer);
  quality
      ->add_option("--calibrated-budgets", quality_opts.calibrated_budgets,
                   "Also the bits with a budget per KV head chosen on this many held-out "
                   "calibration query steps (the study run on them) and scored on the test "
                   "queries: fixed per-head budgets calibrated offline")
      ->check(CLI::Range(1, 4096))
      ->excludes(by_layer);
  replay->needs(model)->excludes(profile)->excludes(kv_heads)->excludes(seed);
  model->needs(replay);
  layers->needs(replay);
  study_scenario->excludes(replay)->excludes(profile)->excludes(kv_heads)->excludes(seed);
  study_scenario->excludes(tokens);
  add_json(quality);
  quality->footer(kFooter);

  cli::CaptureOptions capture_opts;
  auto* capture = app.add_subcommand(
      "capture",
      "Write a synthetic capture for a GQA model: the quality study's keys, values and drifting "
      "queries (sinks, recency, planted relevant tokens) in the replay format, so decode runs "
      "(workload.generator: replay) see attention as realistic as the study's");
  capture->add_option("--model", capture_opts.model, "GQA model preset or YAML")->required();
  capture->add_option("--out", capture_opts.out, "Folder to write layers.N.{k,v,q}.npy into")
      ->required();
  capture
      ->add_option("--profile", capture_opts.profile,
                   "rope_qk_norm (default) | independent | correlated")
      ->check(CLI::IsMember({"rope_qk_norm", "independent", "correlated"}));
  capture->add_option("--tokens", capture_opts.tokens, "Tokens per KV head (default 8192)")
      ->check(CLI::Range(std::int64_t{1024}, std::int64_t{1} << 22));
  capture
      ->add_option("--steps", capture_opts.steps,
                   "Test query steps, written first: what decode steps replay (default 16)")
      ->check(CLI::Range(1, 1 << 16));
  capture
      ->add_option("--calibration-steps", capture_opts.calibration_steps,
                   "Held-out calibration query steps, written after the test steps (default 32)")
      ->check(CLI::Range(0, 1 << 16));
  capture->add_option("--seed", capture_opts.seed, "Seed of the first KV head (default 1)");
  add_json(capture);
  capture->footer(kFooter);

  cli::PoliciesOptions policies_opts;
  auto* policies = app.add_subcommand(
      "policies",
      "Replacement-policy study over recorded selections (CPU): miss rate of LRU, FIFO, random "
      "and Belady's optimum per hot-buffer size, and what the misses cost per decode step");
  policies
      ->add_option("traces", policies_opts.traces,
                   "Recorded selections: text traces ('seq_len: p0 p1 ...' per step, as run "
                   "--save-selections writes) or .npy top-k positions [..., steps, top_k], int32 "
                   "or int64, every leading index a stream; a folder stands for its .txt and "
                   ".npy files")
      ->required()
      ->check(CLI::ExistingPath);
  policies->add_option("--hot", policies_opts.hots, "Hot-buffer sizes in slots, comma-separated")
      ->required()
      ->delimiter(',');
  policies
      ->add_option("--policies", policies_opts.policies,
                   "Policies, comma-separated (default lru,fifo,random,belady)")
      ->delimiter(',');
  policies->add_option("--seq-len", policies_opts.seq_len,
                       "For .npy inputs: the sequence length at the first recorded step (one more "
                       "each step)");
  policies->add_option("--warmup-steps", policies_opts.warmup_steps,
                       "First steps of each stream replayed but not counted (default 0)");
  policies->add_option("--row-bytes", policies_opts.row_bytes,
                       "Bytes of one KV row for the byte and time columns (default 656, MLA fp8)");
  policies->add_option("--pcie-gbps", policies_opts.pcie_gbps,
                       "Host-to-device ceiling in GB/s for the time column (default 55.1, the "
                       "H200 here)");
  policies->add_option("--seed", policies_opts.seed, "The random policy's seed (default 1)");
  policies
      ->add_option("--threads", policies_opts.threads,
                   "Replays at once (default 0: every hardware thread); the figures do not "
                   "depend on it")
      ->check(CLI::NonNegativeNumber);
  policies->add_option("--out", common.out,
                       "Also write policies.json, policies.md and policies.html (miss rate and "
                       "transfer time vs hot size per policy) into this folder");
  add_json(policies);
  policies->footer(kFooter);

  auto* info = app.add_subcommand("info", "Print the device and measure its bandwidth ceilings");
  add_backend(info);
  add_json(info);
  add_quiet(info);
  info->footer(kFooter);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    print_error(fmt::format("{}; run 'hisparse-bench --help'", e.what()));
    return exit_code::bad_input;
  }
  if (*run) return cli::run_command(scenario, common, run_request);
  if (*trace) {
    run_request.trace = true;
    run_request.only_trace = true;
    return cli::run_command(trace_scenario, common, run_request);
  }
  if (*compare) return cli::compare_command(compare_args, common);
  if (*gate) return cli::gate_command(gate_args, common);
  if (*report) return cli::report_command(report_inputs, common);
  if (*validate) return cli::validate_command(to_validate, common);
  if (*list) return cli::list_command(what, common);
  if (*plan) return cli::plan_command(plan_opts, common);
  if (*info) return cli::info_command(common);
  if (*capture) return cli::capture_command(capture_opts, common);
  if (*policies) return cli::policies_command(policies_opts, common);
  if (*quality) {
    quality_opts.top_k_given = top_k->count() > 0;
    return cli::quality_command(quality_opts, common);
  }
  return exit_code::bad_input;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_cli(argc, argv);
  } catch (const hisparse::Error& e) {
    print_error(e.what());
  } catch (const std::exception& e) {
    print_error(fmt::format("unexpected failure: {}", e.what()));
  } catch (...) {
    print_error("unexpected failure of unknown type");
  }
  return hisparse::exit_code::bad_input;
}
