#include "commands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/ceilings.hpp"
#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "fathom/quality_study.hpp"
#include "model/capacity_model.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"
#include "model/replay_study.hpp"
#include "progress.hpp"
#include "report/compare.hpp"
#include "report/results_file.hpp"
#include "scenario/backend_choice.hpp"
#include "scenario/scenario.hpp"
#include "trace/step_window_trace.hpp"
#include "trace/trace_file.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2) << std::endl;
}

std::string point_label(const SweepPoint& p) {
  return fmt::format("{} {} concurrency={} context={}", p.model, name_of(p.config.mode),
                     p.config.concurrency, p.config.context_length);
}

std::size_t ceiling_probe_bytes(Backend b) {
  // Small on the CPU (2 cores shared in CI); large enough on a GPU to reach the link's plateau.
  return b == Backend::cpu ? std::size_t{32} << 20 : std::size_t{512} << 20;
}

}  // namespace

namespace {

/// What the tools layer adds to results.json beside ResultSet's document: per-point GPU phase
/// times from the trace, and run-level notes (backend choice, tracing).
class ResultExtras {
 public:
  void set_point(std::size_t index, const std::string& key, nlohmann::json value) {
    points_[index][key] = std::move(value);
  }
  void set_metadata(const std::string& key, nlohmann::json value) {
    metadata_[key] = std::move(value);
  }
  /// `results.to_json()` with the extras merged into each point's metrics and the metadata.
  [[nodiscard]] nlohmann::json apply(nlohmann::json doc) const {
    for (const auto& [key, value] : metadata_.items()) doc["metadata"][key] = value;
    for (auto& p : doc["points"]) {
      const auto it = points_.find(p["index"].get<std::size_t>());
      if (it == points_.end() || !p["metrics"].is_object()) continue;
      for (const auto& [key, value] : it->second.items()) p["metrics"][key] = value;
    }
    return doc;
  }

 private:
  std::map<std::size_t, nlohmann::json> points_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

std::vector<std::string> without(std::vector<std::string> formats, const std::string& name) {
  std::erase(formats, name);
  return formats;
}

std::string cpu_trace_note() {
  return cuda_compiled()
             ? "--trace: GPU timelines need the CUDA backend and this run uses the CPU backend, "
               "so no trace.json is written; NVTX ranges (domain hisparse) are still emitted for "
               "Nsight Systems (nsys profile -t nvtx ...)"
             : "--trace: GPU timelines need the CUDA backend and this build has none, so no "
               "trace.json is written (and no NVTX ranges are emitted)";
}

}  // namespace

int run_command(const std::string& scenario_arg, const CommonOptions& o, const TraceRequest& t) {
  const auto path = find_scenario(scenario_arg, "run: SCENARIO");
  std::vector<std::string> sets = o.sets;
  if (t.trace) sets.emplace_back("trace.enabled=true");
  if (t.steps > 0) sets.push_back(fmt::format("trace.steps={}", t.steps));
  // NVTX reads NVTX_INJECTION64_PATH at its first call, and loading a scenario already opens a
  // range: decide on tracing from the flags and a peek at the file first.
  if (t.trace || scenario_requests_trace(path, sets)) (void)trace::prepare_nvtx_injection();
  Scenario s = load_scenario(path, sets);
  if (t.only_trace) s.decode_steps = s.trace.steps;
  const bool chatty = !o.quiet && !o.json;
  const bool notes = !o.quiet;

  const std::string requested = o.backend.empty() ? s.backend : o.backend;
  const BackendChoice choice = choose_engine_backend(
      requested, o.backend.empty() ? path.string() + ": backend" : "--backend");
  const Backend backend = choice.backend;
  if (!choice.note.empty() && notes) std::fprintf(stderr, "%s\n", choice.note.c_str());
  const Device device = Device::for_backend(backend);
  const DeviceProperties props = device.properties();
  const std::filesystem::path out = o.out.empty() ? s.outputs.dir : std::filesystem::path(o.out);

  RunInfo info;
  info.command_line = o.command_line;
  info.device = props;
  info.ceilings = measure_ceilings(device, ceiling_probe_bytes(backend), 3);
  info.budget = memory_budget_of(props);
  info.synthetic_workload = s.workload.generator == "synthetic";
  for (const auto& [name, model] : s.models)
    if (!model.weights.empty()) info.synthetic_weights = false;

  ResultExtras extras;
  extras.set_metadata("backend_requested", requested);
  if (!choice.note.empty()) extras.set_metadata("backend_note", choice.note);

  // Tracing: a CUPTI timeline of the first measured steps of every point (CUDA backend only).
  std::unique_ptr<trace::TraceFile> trace_file;
  nlohmann::json trace_meta{{"enabled", s.trace.enabled},
                            {"steps", s.trace.steps},
                            {"file", nullptr},
                            {"messages", nlohmann::json::array()}};
  auto trace_note = [&](const std::string& message) {
    for (const auto& m : trace_meta["messages"])
      if (m == message) return;
    trace_meta["messages"].push_back(message);
    if (notes) std::fprintf(stderr, "%s\n", message.c_str());
  };
  if (s.trace.enabled) {
    if (backend == Backend::cuda)
      trace_file = std::make_unique<trace::TraceFile>(out / "trace.json");
    else
      trace_note(cpu_trace_note());
  }

  const std::vector<SweepPoint> points = s.expand();
  ResultSet results(run_metadata(info), s.to_json(), points.size());
  auto document = [&] {
    nlohmann::json meta = trace_meta;
    meta["file"] = trace_file && trace_file->sessions() > 0 ? nlohmann::json("trace.json")
                                                            : nlohmann::json(nullptr);
    meta["sessions"] = trace_file ? trace_file->sessions() : 0;
    extras.set_metadata("trace", meta);
    return extras.apply(results.to_json());
  };
  const auto per_point_formats = without(s.outputs.formats, "html");
  // An empty set first: the folder is writable before any point runs.
  (void)write_results_files(document(), out, per_point_formats);
  const Runner runner(backend, info.budget);
  ProgressBar bar(points.size(), chatty);
  if (chatty)
    std::fprintf(stderr, "%s: %zu points on %s (%s), results in %s\n", s.name.c_str(),
                 points.size(), props.name.c_str(), std::string(name_of(backend)).c_str(),
                 out.c_str());

  for (const auto& point : points) {
    PointRecord record;
    record.point = point;
    record.point.config.backend = backend;
    const std::string label = point_label(point);
    std::optional<trace::StepWindowTrace> window;
    if (trace_file) window.emplace(*trace_file, label, s.warmup_steps, s.trace.steps);
    try {
      if (window) window->start();
      record.metrics = runner.run(s.models.at(point.model), point.config, s.warmup_steps,
                                  s.decode_steps, [&](int step, int steps) {
                                    bar.step(point.index, label, step, steps);
                                    if (window) window->step_done(step);
                                  });
      if (window) window->finish();
    } catch (const std::exception& e) {
      record.ok = false;
      record.error = e.what();
      if (window) {
        try {
          window->finish();  // keep the timeline of a failed point: it may show why
        } catch (const std::exception& trace_error) {
          trace_note(fmt::format("trace of point {}: {}", point.index, trace_error.what()));
        }
      }
    }
    if (window) {
      if (!window->message().empty()) trace_note("trace: " + window->message());
      if (record.ok && !window->steps().empty()) {
        extras.set_point(point.index, "gpu_phase_ms", trace::mean_phase_ms(window->steps()));
        extras.set_point(point.index, "gpu_phase_steps", window->steps().size());
      }
    }
    results.add(record);
    (void)write_results_files(document(), out, per_point_formats);
    bar.finished(
        point.index, label,
        record.ok ? fmt::format("{:.1f} tok/s, step {:.3f} ms (median)",
                                record.metrics.output_tokens_per_s, record.metrics.step_ms.median)
                  : "FAILED: " + record.error);
  }

  const nlohmann::json j = document();
  (void)write_results_files(j, out, s.outputs.formats);
  if (o.json) {
    print_json(j);
  } else if (!o.quiet) {
    fmt::print("{:>5}  {:<16} {:<16} {:>11} {:>9} {:>8} {:>12} {:>12}\n", "point", "model", "mode",
               "concurrency", "context", "status", "tok/s", "step ms");
    const nlohmann::json all_points = j["points"];
    for (const auto& p : all_points) {
      const nlohmann::json c = p["config"];
      const bool ok = p["status"] == "ok";
      fmt::print(
          "{:>5}  {:<16} {:<16} {:>11} {:>9} {:>8} {:>12} {:>12}\n", p["index"].get<int>(),
          c["model"].get<std::string>(), c["mode"].get<std::string>(), c["concurrency"].get<int>(),
          c["context_length"].get<std::int64_t>(), p["status"].get<std::string>(),
          ok ? fmt::format("{:.1f}", p["metrics"]["output_tokens_per_s"].get<double>()) : "-",
          ok ? fmt::format("{:.3f}", p["metrics"]["step_ms"]["median"].get<double>()) : "-");
    }
    fmt::print("{} timings ({}); results written to {}\n",
               backend == Backend::cpu ? "CPU wall-clock" : "GPU", props.name, out.string());
    if (trace_file && trace_file->sessions() > 0)
      fmt::print("trace: {} sweep point{} in {} (open it at https://ui.perfetto.dev)\n",
                 trace_file->sessions(), trace_file->sessions() == 1 ? "" : "s",
                 trace_file->path().string());
  }
  return results.any_failed() ? exit_code::point_failed : exit_code::ok;
}

int compare_command(const CompareArgs& args, const CommonOptions& o) {
  CompareOptions options;
  options.metric = parse_compare_metric(args.metric, "--metric");
  options.threshold_pct = args.threshold_pct;
  options.allow_different_devices = args.allow_different_devices;
  const nlohmann::json base = load_results(args.base);
  const nlohmann::json next = load_results(args.next);
  const Comparison c = compare_results(base, next, options, args.base, args.next);
  if (o.json)
    print_json(to_json(c));
  else if (!o.quiet)
    fmt::print("{}", comparison_text(c));
  return c.regressed() ? exit_code::point_failed : exit_code::ok;
}

int report_command(const std::vector<std::string>& inputs, const CommonOptions& o) {
  if (inputs.size() > 1 && o.out.empty())
    throw Error("report: --out",
                fmt::format("{} results files need one output folder", inputs.size()),
                "add --out DIR (the merged report is written there)");
  std::vector<nlohmann::json> docs;
  std::vector<std::string> labels;
  for (const auto& input : inputs) {
    docs.push_back(load_results(input));
    const std::filesystem::path p(input);
    labels.push_back(
        p.filename() == "results.json" && p.has_parent_path() ? p.parent_path().string() : input);
  }
  const std::filesystem::path out = o.out.empty()
                                        ? std::filesystem::path(inputs.front()).parent_path()
                                        : std::filesystem::path(o.out);
  const auto written = write_results_files(merge_results(docs, labels), out.empty() ? "." : out,
                                           {"csv", "md", "html"});
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& w : written) j.push_back(w.string());
    print_json({{"written", j}});
  } else if (!o.quiet) {
    for (const auto& w : written) fmt::print("wrote {}\n", w.string());
  }
  return exit_code::ok;
}

int validate_command(const std::vector<std::string>& scenarios, const CommonOptions& o) {
  nlohmann::json report = nlohmann::json::array();
  int status = exit_code::ok;
  for (const auto& arg : scenarios) {
    nlohmann::json entry{{"scenario", arg}};
    try {
      const auto path = find_scenario(arg, arg);
      const Scenario s = load_scenario(path, o.sets);
      entry["ok"] = true;
      entry["name"] = s.name;
      entry["points"] = s.point_count();
      entry["axes"] = s.swept;
      if (!o.json && !o.quiet)
        fmt::print("ok: {}: {} sweep point{}{}\n", path.string(), s.point_count(),
                   s.point_count() == 1 ? "" : "s",
                   s.swept.empty() ? "" : fmt::format(" over {}", fmt::join(s.swept, " x ")));
    } catch (const Error& e) {
      status = exit_code::bad_input;
      entry["ok"] = false;
      entry["error"] = e.what();
      if (!o.json) std::fprintf(stderr, "error: %s\n", e.what());
    }
    report.push_back(entry);
  }
  if (o.json) print_json(report);
  return status;
}

int list_command(const std::string& what, const CommonOptions& o) {
  nlohmann::json j;
  if (what == "models" || what == "all") j["models"] = list_model_presets();
  if (what == "scenarios" || what == "all") j["scenarios"] = list_scenarios();
  if (what == "modes" || what == "all") j["modes"] = mode_names();
  if (o.json) {
    print_json(j);
    return exit_code::ok;
  }
  for (const char* section : {"models", "scenarios", "modes"}) {
    if (!j.contains(section)) continue;
    if (what == "all") fmt::print("{}:\n", section);
    for (const auto& name : j[section])
      fmt::print("{}{}\n", what == "all" ? "  " : "", name.get<std::string>());
  }
  return exit_code::ok;
}

int plan_command(const PlanOptions& p, const CommonOptions& o) {
  if (p.context < 1)
    throw Error("--context", fmt::format("{} is not a context length", p.context),
                "give the tokens per request, e.g. --context 131072");
  if (!(p.gpu_mem_gib > 0))
    throw Error("--gpu-mem-gib", fmt::format("{} is not a memory size", p.gpu_mem_gib),
                "give the GPU memory in GiB, e.g. --gpu-mem-gib 141");
  if (p.host_mem_gib < 0)
    throw Error("--host-mem-gib", fmt::format("{} is negative", p.host_mem_gib),
                "give the pinned host memory in GiB, or 0 for unlimited");
  if (p.top_k < 0) throw Error("--top-k", "must not be negative", "use 0 for the model default");
  if (p.hot_buffer < 0 || p.hot_buffer > 32768)
    throw Error("--hot-buffer", fmt::format("{} is out of range", p.hot_buffer),
                "use 0 (2 * top_k) up to 32768 slots");
  if (p.budget_bits < 0)
    throw Error("--budget-bits", "must not be negative", "use e.g. --budget-bits 48");
  const ModelSpec model = load_model_named(p.model, "--model");
  CapacityQuery q;
  q.context_length = p.context;
  q.top_k = p.top_k;
  q.hot_buffer = p.hot_buffer;
  q.budget_bits = p.budget_bits;
  q.gpu_mem_bytes = p.gpu_mem_gib * kGiB;
  q.host_mem_bytes = p.host_mem_gib * kGiB;
  const CapacityModel capacity(model);
  const auto rows = capacity.plan(q);
  const std::size_t weights = capacity.weight_bytes();

  nlohmann::json j{{"model", model.name},
                   {"context_length", q.context_length},
                   {"gpu_mem_bytes", q.gpu_mem_bytes},
                   {"host_mem_bytes", q.host_mem_bytes},
                   {"weight_bytes", weights},
                   {"activation_reserve_bytes", q.activation_reserve_bytes},
                   {"modes", nlohmann::json::array()}};
  for (const auto& r : rows)
    j["modes"].push_back({{"mode", std::string(name_of(r.footprint.mode))},
                          {"gpu_bytes_per_request", r.footprint.gpu_bytes},
                          {"host_bytes_per_request", r.footprint.host_bytes},
                          {"max_concurrency", r.max_concurrency},
                          {"limited_by", r.limited_by},
                          {"gpu_breakdown", r.footprint.gpu_breakdown},
                          {"host_breakdown", r.footprint.host_breakdown}});
  if (o.json) {
    print_json(j);
    return exit_code::ok;
  }
  fmt::print(
      "model {}, context {} tokens, GPU memory {} ({:.0f} B), weights {} ({} B), "
      "activation reserve {:.0f} B, host memory {}\n",
      model.name, q.context_length, format_bytes(static_cast<std::size_t>(q.gpu_mem_bytes)),
      q.gpu_mem_bytes, format_bytes(weights), weights, q.activation_reserve_bytes,
      q.host_mem_bytes > 0 ? format_bytes(static_cast<std::size_t>(q.host_mem_bytes))
                           : std::string("unlimited"));
  fmt::print("{:<16} {:>24} {:>24} {:>16} {:>10}\n", "mode", "GPU bytes/request",
             "host bytes/request", "max concurrency", "limited by");
  for (const auto& r : rows)
    fmt::print("{:<16} {:>24} {:>24} {:>16} {:>10}\n", name_of(r.footprint.mode),
               fmt::format("{} ({})", r.footprint.gpu_bytes, format_bytes(r.footprint.gpu_bytes)),
               fmt::format("{} ({})", r.footprint.host_bytes, format_bytes(r.footprint.host_bytes)),
               r.max_concurrency, r.limited_by);
  return exit_code::ok;
}

int info_command(const CommonOptions& o) {
  const Backend backend = resolve_backend(o.backend.empty() ? "auto" : o.backend, "--backend");
  const Device device = Device::for_backend(backend);
  const DeviceProperties props = device.properties();
  const Ceilings c = measure_ceilings(device, ceiling_probe_bytes(backend) * 2, 5);
  if (o.json) {
    print_json({{"device", to_json(props)}, {"ceilings", c}});
    return exit_code::ok;
  }
  if (o.quiet) return exit_code::ok;
  fmt::print("device: {} ({} backend)\n", props.name, name_of(backend));
  fmt::print("memory: {} total, {} free\n", format_bytes(props.total_memory),
             format_bytes(props.free_memory));
  if (backend == Backend::cuda) {
    fmt::print("compute capability {}.{}, {} SMs, L2 {}, driver {}, runtime {}\n",
               props.compute_major, props.compute_minor, props.multiprocessors,
               format_bytes(props.l2_bytes), props.driver_version, props.runtime_version);
    fmt::print("measured ({} copies): H2D {:.1f} GB/s, D2H {:.1f} GB/s, HBM copy {:.1f} GB/s\n",
               format_bytes(c.bytes), c.h2d_gbps, c.d2h_gbps, c.hbm_copy_gbps);
    fmt::print(
        "SM reads of pinned host memory (zero-copy, 4 KiB rows): {:.1f} GB/s = {:.0f}% of "
        "H2D; the swap-in and the plane staging read host memory this way\n",
        c.sm_read_gbps, c.h2d_gbps > 0 ? 100.0 * c.sm_read_gbps / c.h2d_gbps : 0.0);
  } else {
    fmt::print("{} hardware threads\n", props.multiprocessors);
    fmt::print("measured ({} copies): host memcpy {:.1f} GB/s (read + write)\n",
               format_bytes(c.bytes), c.host_copy_gbps);
  }
  return exit_code::ok;
}

int quality_command(const QualityOptions& q, const CommonOptions& o) {
  using fathom::MethodSpec, fathom::PlanRule, fathom::ScanMethod;
  fathom::QualityConfig cfg;
  cfg.top_k = q.top_k;
  cfg.klt = q.klt;
  cfg.centre_keys = q.centre_keys;
  cfg.float_scores = q.float_scores;
  if (q.threads < 0)
    throw Error("--threads", fmt::format("{} threads", q.threads),
                "use 0 (every hardware thread) or a positive count");
  cfg.threads = q.threads;
  // The study heads: synthetic KV heads, or every (captured layer, KV head) of a replay.
  std::optional<ReplayStudySource> replay;
  std::int64_t tokens = q.tokens == 0 ? 8192 : q.tokens;
  int channels = cfg.workload.channels, query_heads = cfg.workload.heads;
  if (!q.replay.empty()) {
    replay.emplace(q.replay, load_model_named(q.model, "--model"), q.tokens, q.calibration_steps,
                   q.layers);
    cfg.kv_heads = replay->heads();
    cfg.source = [&replay](int head) { return replay->head(head); };
    tokens = replay->tokens();
    channels = replay->head_dim();
    query_heads = replay->group();
  } else {
    if (tokens < 1024 || tokens > (std::int64_t{1} << 22))
      throw Error("--tokens", fmt::format("{} tokens is out of range", tokens),
                  "use 1024 to 4194304 tokens, e.g. --tokens 8192");
    if (q.kv_heads < 1 || q.kv_heads > 4096)
      throw Error("--kv-heads", fmt::format("{} is out of range", q.kv_heads),
                  "use 1 to 4096 KV heads, e.g. --kv-heads 32");
    cfg.workload.profile = q.profile == "independent"  ? fathom::KeyProfile::independent
                           : q.profile == "correlated" ? fathom::KeyProfile::correlated
                                                       : fathom::KeyProfile::rope_qk_norm;
    cfg.workload.tokens = tokens;
    cfg.workload.steps = 1;
    cfg.workload.seed = q.seed;
    cfg.kv_heads = q.kv_heads;
  }
  if (q.top_k <= cfg.sinks + cfg.recent || q.top_k > tokens / 2)
    throw Error("--top-k",
                fmt::format("top_k {} does not fit {} sinks + {} recent tokens and "
                            "half of {} tokens",
                            q.top_k, cfg.sinks, cfg.recent, tokens),
                fmt::format("use {} to {}", cfg.sinks + cfg.recent + 1, tokens / 2));
  if (q.budgets.empty())
    throw Error("--budgets", "no budget given", "list plane-bit budgets, e.g. --budgets 32,48,64");
  for (int b : q.budgets) fathom::check_budget(b, channels, "--budgets");
  std::vector<PlanRule> rules;
  if (q.rule != "measured") rules.push_back(PlanRule::paper);
  if (q.rule != "paper") rules.push_back(PlanRule::measured);
  for (const auto& m : fathom::default_methods())
    if (m.method != ScanMethod::fathom) cfg.methods.push_back(m);
  for (PlanRule rule : rules)
    for (int b : q.budgets) {
      MethodSpec m{ScanMethod::fathom, b, 0};
      m.rule = rule;
      cfg.methods.push_back(m);
    }
  const auto stats = fathom::attention_stats(cfg);
  const auto study = fathom::quality_study_grouped(cfg, q.by_layer ? replay->kv_heads() : 0);
  const auto& rows = study.rows;
  nlohmann::json workload{{"tokens", tokens},
                          {"kv_heads", cfg.kv_heads},
                          {"channels", channels},
                          {"query_heads", query_heads}};
  if (replay) {
    workload["generator"] = "replay";
    workload["replay_path"] = q.replay;
    workload["model"] = q.model;
    workload["layers"] = replay->layers();
    workload["model_kv_heads"] = replay->kv_heads();
    workload["calibration_steps"] = replay->calibration_steps();
    workload["test_steps"] = replay->test_steps();
    workload["values"] = replay->captured_values() ? "captured" : "synthetic N(0, 1)";
    workload["notes"] = replay->notes();
  } else {
    workload["generator"] = "synthetic";
    workload["profile"] = q.profile;
    workload["seed"] = q.seed;
  }
  nlohmann::json j{{"backend", "cpu"},
                   {"workload", workload},
                   {"top_k", q.top_k},
                   {"centre_keys", q.centre_keys},
                   {"float_scores", q.float_scores},
                   {"attention",
                    {{"entropy_nats", stats.entropy},
                     {"sink_mass", stats.sink_mass},
                     {"recent_mass", stats.recent_mass},
                     {"selected_mass", stats.selected_mass}}},
                   {"rows", nlohmann::json::array()},
                   {"bits_at_fixed32_error", nlohmann::json::object()}};
  for (const auto& r : rows)
    j["rows"].push_back({{"method", r.name},
                         {"bits_per_token", r.bits_per_token},
                         {"active_channels", r.active_channels},
                         {"recall", r.recall},
                         {"attention_rel_error", r.attention_error}});
  // Bits each rule's Fathom rows need at the 32-channel scan's error, in the plain basis and,
  // with --klt, in the KLT basis against the KLT 32-channel scan. Not reached when no budget
  // given gets down to that error (then null, and the text says so).
  struct Needed {
    std::string key;                  ///< JSON key: "paper", "measured", "paper_klt", ...
    std::string label;                ///< "paper rule", "measured rule, KLT basis"
    const fathom::QualityRow* fixed;  ///< the 32-channel scan of the same basis
    std::optional<double> bits;
  };
  const auto needs_of = [&](const std::vector<fathom::QualityRow>& of) {
    std::vector<Needed> needed;
    for (const bool klt : {false, true}) {
      if (klt && !q.klt) continue;
      const auto fixed = std::find_if(of.begin(), of.end(), [&](const auto& r) {
        return r.name == (klt ? "fixed-klt-32ch" : "fixed-32ch");
      });
      for (PlanRule rule : rules) {
        std::vector<fathom::QualityRow> own;
        for (const auto& r : of)
          if (r.method.method == ScanMethod::fathom && r.method.rule == rule && r.method.klt == klt)
            own.push_back(r);
        const bool reached = std::any_of(own.begin(), own.end(), [&](const auto& r) {
          return r.attention_error <= fixed->attention_error;
        });
        Needed n{std::string(fathom::plan_rule_name(rule)) + (klt ? "_klt" : ""),
                 fmt::format("{} rule{}", fathom::plan_rule_name(rule), klt ? ", KLT basis" : ""),
                 &*fixed, std::nullopt};
        if (reached) n.bits = fathom::fathom_bits_at_error(own, fixed->attention_error, klt);
        needed.push_back(std::move(n));
      }
    }
    return needed;
  };
  const auto bits_json = [](const std::vector<Needed>& needed) {
    nlohmann::json out = nlohmann::json::object();
    for (const Needed& n : needed)
      out[n.key] = n.bits ? nlohmann::json(*n.bits) : nlohmann::json(nullptr);
    return out;
  };
  const std::vector<Needed> needed = needs_of(rows);
  j["bits_at_fixed32_error"] = bits_json(needed);
  // --by-layer: the same figures over each captured layer's KV heads alone.
  std::vector<std::vector<Needed>> layer_needs;
  for (std::size_t g = 0; g < study.groups.size(); ++g) {
    layer_needs.push_back(needs_of(study.groups[g]));
    const Needed& first = layer_needs.back().front();
    j["layers"].push_back({{"layer", replay->layers()[g]},
                           {"fixed32_error", first.fixed->attention_error},
                           {"bits_at_fixed32_error", bits_json(layer_needs.back())}});
  }
  if (o.json) {
    print_json(j);
    return exit_code::ok;
  }
  const std::string options = fmt::format("top_k {}{}{}", q.top_k,
                                          q.centre_keys ? ", keys centred before quantization" : "",
                                          q.float_scores ? ", float-weight scores" : "");
  if (replay) {
    fmt::print(
        "Fathom quality study, CPU, captured keys ({}, model {}): layers {} x {} KV heads x {} "
        "tokens, {} query heads x head_dim {}, {} calibration + {} scored query steps, {}\n",
        q.replay, q.model, fmt::join(replay->layers(), ","), replay->kv_heads(), tokens,
        query_heads, channels, replay->calibration_steps(), replay->test_steps(), options);
    for (const auto& note : replay->notes()) fmt::print("note: {}\n", note);
  } else {
    fmt::print(
        "Fathom quality study, CPU, synthetic keys ({} profile, seed {}): {} KV heads x {} tokens, "
        "{} query heads x head_dim {}, {}\n",
        q.profile, q.seed, q.kv_heads, tokens, query_heads, channels, options);
  }
  fmt::print(
      "dense attention: entropy {:.2f} nats, sinks {:.3f}, last 32 {:.3f}, exact top-k "
      "selection {:.3f} of the mass\n\n",
      stats.entropy, stats.sink_mass, stats.recent_mass, stats.selected_mass);
  fmt::print("{}\n", fathom::format_quality_table(rows));
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
  if (!layer_needs.empty()) {
    fmt::print("\nper layer (its {} KV heads alone): bits at its 32-channel scan's error\n\n",
               replay->kv_heads());
    std::string header = "| layer | 32-channel scan error |", rule_line = "| ---: | ---: |";
    for (const Needed& n : layer_needs.front()) {
      header += fmt::format(" {} |", n.label);
      rule_line += " ---: |";
    }
    fmt::print("{}\n{}\n", header, rule_line);
    for (std::size_t g = 0; g < layer_needs.size(); ++g) {
      std::string line = fmt::format("| {} | {:.5f} |", replay->layers()[g],
                                     layer_needs[g].front().fixed->attention_error);
      for (const Needed& n : layer_needs[g])
        line += n.bits
                    ? fmt::format(" {:.1f} ({:.3f}x) |", *n.bits, *n.bits / n.fixed->bits_per_token)
                    : std::string(" not reached |");
      fmt::print("{}\n", line);
    }
  }
  return exit_code::ok;
}

}  // namespace hisparse::cli
