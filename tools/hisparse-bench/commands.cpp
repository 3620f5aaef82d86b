#include "commands.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bench/ceilings.hpp"
#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "hotcache/policies.hpp"
#include "model/capacity_model.hpp"
#include "model/decode_engine.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"
#include "progress.hpp"
#include "report/compare.hpp"
#include "report/results_file.hpp"
#include "scenario/backend_choice.hpp"
#include "scenario/scenario.hpp"
#include "trace/step_window_trace.hpp"
#include "trace/trace_file.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::cli {

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2) << std::endl;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Model, mode, batch and context, then every other swept axis: points that differ only in a
// swept top_k, hot_buffer, budget_bits or policy must not share a label.
std::string point_label(const SweepPoint& p) {
  std::string label =
      fmt::format("{} {} concurrency={} context={}", p.model, name_of(p.config.mode),
                  p.config.concurrency, p.config.context_length);
  for (const auto& [axis, value] : p.axes)
    if (axis != "model" && axis != "mode" && axis != "concurrency" && axis != "context_length")
      label += fmt::format(" {}={}", axis, value);
  return label;
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

namespace {
// The engine's selection traces as text files dir/layer<L>-stream<S>.txt (what `policies` reads);
// returns how many were written (none without a hot buffer). The folder is emptied first, so
// that it holds this run's traces only.
std::size_t save_selections(const DecodeEngine& engine, const std::filesystem::path& dir) {
  const auto traces = engine.selection_traces();
  if (traces.empty()) return 0;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(dir.string(), fmt::format("cannot create the folder ({})", ec.message()),
                "check that --out is writable, or run without --save-selections");
  const auto streams = static_cast<std::size_t>(std::max(engine.kv_streams(), 1));
  for (std::size_t i = 0; i < traces.size(); ++i)
    write_selection_trace(traces[i],
                          dir / fmt::format("layer{}-stream{}.txt", i / streams, i % streams));
  return traces.size();
}
}  // namespace

int run_command(const std::string& scenario_arg, const CommonOptions& o, const RunRequest& t) {
  const auto path = find_scenario(scenario_arg, "run: SCENARIO");
  std::vector<std::string> sets = o.sets;
  if (t.trace) sets.emplace_back("trace.enabled=true");
  if (t.steps > 0) sets.push_back(fmt::format("trace.steps={}", t.steps));
  if (t.repetitions > 0) sets.push_back(fmt::format("repetitions={}", t.repetitions));
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
      record.metrics = runner.run(
          s.models.at(point.model), point.config, s.warmup_steps, s.decode_steps,
          [&](int step, int steps) {
            bar.step(point.index, label, step, steps);
            if (window) window->step_done(step);
          },
          [&](const DecodeEngine& engine) {
            if (!t.save_selections) return;
            const auto folder = fmt::format("selections/point-{}", point.index);
            if (save_selections(engine, out / folder) > 0)
              extras.set_point(point.index, "selections", folder);
          },
          s.repetitions);
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
    // Hit rate (hot-buffer modes) and bits read per token (Fathom modes): "-" where a point has
    // none.
    const auto value = [](const nlohmann::json& p, const char* key) -> std::optional<double> {
      const auto m = p.find("metrics");
      if (p["status"] != "ok" || m == p.end() || !m->contains(key) || !(*m)[key].is_number())
        return std::nullopt;
      return (*m)[key].get<double>();
    };
    const auto metric = [&](const nlohmann::json& p, const char* key, const char* format) {
      const auto v = value(p, key);
      return v ? fmt::format(fmt::runtime(format), *v) : std::string("-");
    };
    // Hot-buffer modes: the hot buffer's slots, and the policy the recorded selections were
    // replayed under with the miss rate it gave; columns of their own when some point has them.
    const auto hot_and_policy = [&](const nlohmann::json& p) {
      const auto miss = value(p, "policy_miss_rate");
      if (!miss) return fmt::format(" {:>6} {:>16}", "-", "-");
      return fmt::format(
          " {:>6} {:>16}", p["config"]["hot_buffer"].get<int>(),
          fmt::format("{} {:.2f}%", p["metrics"]["policy"].get<std::string>(), 100 * *miss));
    };
    const bool policies = std::any_of(j["points"].begin(), j["points"].end(), [&](const auto& p) {
      return value(p, "policy_miss_rate").has_value();
    });
    fmt::print("{:>5}  {:<16} {:<16} {:>11} {:>9} {:>8} {:>12} {:>12} {:>9} {:>9}{}\n", "point",
               "model", "mode", "concurrency", "context", "status", "tok/s", "step ms", "hit rate",
               "bits/tok", policies ? fmt::format(" {:>6} {:>16}", "hot", "policy miss") : "");
    for (const auto& p : j["points"]) {
      const nlohmann::json& c = p["config"];
      const bool ok = p["status"] == "ok";
      fmt::print(
          "{:>5}  {:<16} {:<16} {:>11} {:>9} {:>8} {:>12} {:>12} {:>9} {:>9}{}\n",
          p["index"].get<int>(), c["model"].get<std::string>(), c["mode"].get<std::string>(),
          c["concurrency"].get<int>(), c["context_length"].get<std::int64_t>(),
          p["status"].get<std::string>(),
          ok ? fmt::format("{:.1f}", p["metrics"]["output_tokens_per_s"].get<double>()) : "-",
          ok ? fmt::format("{:.3f}", p["metrics"]["step_ms"]["median"].get<double>()) : "-",
          metric(p, "hit_rate", "{:.3f}"), metric(p, "bits_per_token", "{:.1f}"),
          policies ? hot_and_policy(p) : "");
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
  const GateOutcome c = compare_results(base, next, options, args.base, args.next);
  if (o.json) {
    nlohmann::json j = to_json(c);
    j["metric"] = std::string(name_of(options.metric));
    j["threshold_pct"] = options.threshold_pct;
    print_json(j);
  } else if (!o.quiet) {
    fmt::print("{}", comparison_text(c, options));
  }
  return c.failed() ? exit_code::point_failed : exit_code::ok;
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
      entry["skipped"] = s.skipped_count();
      entry["axes"] = s.swept;
      if (!o.json && !o.quiet)
        fmt::print("ok: {}: {} sweep point{}{}{}\n", path.string(), s.point_count(),
                   s.point_count() == 1 ? "" : "s",
                   s.swept.empty() ? "" : fmt::format(" over {}", fmt::join(s.swept, " x ")),
                   s.skip.empty() ? "" : fmt::format(" ({} skipped)", s.skipped_count()));
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
  if (p.concurrency < 1)
    throw Error("--concurrency", fmt::format("{} is not a number of requests", p.concurrency),
                "use 1 or more, e.g. --concurrency 64");
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
  // The longest context at which --concurrency requests fit, searched up to 2^30 tokens.
  constexpr std::int64_t kLongestSearched = std::int64_t{1} << 30;
  CapacityQuery longest_query = q;
  longest_query.context_length = kLongestSearched;
  std::vector<std::int64_t> longest;
  for (const auto& r : rows)
    longest.push_back(capacity.longest_context(r.footprint.mode, longest_query, p.concurrency));
  const auto longest_text = [&](std::int64_t tokens) {
    return tokens >= kLongestSearched ? fmt::format(">= {}", kLongestSearched)
                                      : std::to_string(tokens);
  };

  nlohmann::json j{{"model", model.name},
                   {"context_length", q.context_length},
                   {"gpu_mem_bytes", q.gpu_mem_bytes},
                   {"host_mem_bytes", q.host_mem_bytes},
                   {"weight_bytes", weights},
                   {"activation_reserve_bytes", q.activation_reserve_bytes},
                   {"concurrency", p.concurrency},
                   {"longest_context_searched", kLongestSearched},
                   {"modes", nlohmann::json::array()}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const CapacityRow& r = rows[i];
    j["modes"].push_back({{"mode", std::string(name_of(r.footprint.mode))},
                          {"gpu_bytes_per_request", r.footprint.gpu_bytes},
                          {"host_bytes_per_request", r.footprint.host_bytes},
                          {"max_concurrency", r.max_concurrency},
                          {"limited_by", r.limited_by},
                          {"longest_context", longest[i]},
                          {"gpu_breakdown", r.footprint.gpu_breakdown},
                          {"host_breakdown", r.footprint.host_breakdown}});
  }
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
  fmt::print("{:<16} {:>24} {:>24} {:>16} {:>10} {:>24}\n", "mode", "GPU bytes/request",
             "host bytes/request", "max concurrency", "limited by",
             fmt::format("longest context at {}", p.concurrency));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const CapacityRow& r = rows[i];
    fmt::print("{:<16} {:>24} {:>24} {:>16} {:>10} {:>24}\n", name_of(r.footprint.mode),
               fmt::format("{} ({})", r.footprint.gpu_bytes, format_bytes(r.footprint.gpu_bytes)),
               fmt::format("{} ({})", r.footprint.host_bytes, format_bytes(r.footprint.host_bytes)),
               r.max_concurrency, r.limited_by, longest_text(longest[i]));
  }
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

}  // namespace hisparse::cli
