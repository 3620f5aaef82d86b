// `hisparse-bench run` and `trace`: a scenario's sweep, point by point, with its results written
// after every point; interruption (SIGINT / SIGTERM), --resume, and the per-point time limit.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bench/ceilings.hpp"
#include "bench/interrupt.hpp"
#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "commands.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "hotcache/policies.hpp"
#include "model/decode_engine.hpp"
#include "model/mode.hpp"
#include "progress.hpp"
#include "report/json_lookup.hpp"
#include "report/results_file.hpp"
#include "scenario/backend_choice.hpp"
#include "scenario/scenario.hpp"
#include "trace/step_window_trace.hpp"
#include "trace/trace_file.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::cli {
namespace {

using json_lookup::at;

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

/// The command that continues this sweep from its output folder.
std::string resume_command(const std::string& scenario, const CommonOptions& o, const RunRequest& t,
                           const std::filesystem::path& out) {
  std::string command = "hisparse-bench run " + shell_quote(scenario);
  if (!o.backend.empty()) command += " --backend " + shell_quote(o.backend);
  for (const auto& set : o.sets) command += " --set " + shell_quote(set);
  if (t.repetitions > 0) command += fmt::format(" --repetitions {}", t.repetitions);
  if (t.save_selections) command += " --save-selections";
  if (t.verify || t.verify_every > 0)
    command += t.verify_every > 0 ? fmt::format(" --verify-every {}", t.verify_every) : " --verify";
  return command + " --resume " + shell_quote(out.string());
}

/// The completed points (ok or failed) of the results in `dir`, by index, after checking that
/// they come from this scenario and build on this device. Throws Error naming --resume.
std::map<std::size_t, nlohmann::json> completed_points(const std::filesystem::path& dir,
                                                       const nlohmann::json& scenario,
                                                       const DeviceProperties& device,
                                                       const std::vector<SweepPoint>& points,
                                                       nlohmann::json& earlier_metadata) {
  const std::string where = "--resume " + dir.string();
  const auto file = dir / "results.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw Error(where, "holds no results.json",
                "give the output folder of the interrupted run (its --out, or outputs.dir)");
  const nlohmann::json doc = load_results(file);
  const auto diff =
      scenario_differences(at(doc, "scenario"), scenario, {"outputs", "source", "description"});
  if (!diff.empty())
    throw Error(where, fmt::format("its results are of another scenario: {} differs", diff.front()),
                "resume with the scenario, --set and --repetitions of the interrupted run, or "
                "start a new run in another folder");
  const nlohmann::json& meta = at(doc, "metadata");
  const std::string revision = git_revision();
  const auto field = [&](const char* key) { return json_lookup::at(meta, key); };
  if (field("git_revision") != nlohmann::json(revision) ||
      field("version") != nlohmann::json(HISPARSE_VERSION))
    throw Error(where,
                fmt::format("its results were written by build {} ({}); this is {} ({})",
                            field("git_revision").dump(), field("version").dump(), revision,
                            HISPARSE_VERSION),
                "resume with the build that started the sweep, or start a new run in another "
                "folder");
  const std::string device_name = at(at(meta, "device"), "name").is_string()
                                      ? at(at(meta, "device"), "name").get<std::string>()
                                      : "";
  if (at(meta, "backend") != nlohmann::json(std::string(name_of(device.backend))) ||
      device_name != device.name)
    throw Error(where,
                fmt::format("its points ran on {} ({}), this run would use {} ({})", device_name,
                            at(meta, "backend").dump(), device.name, name_of(device.backend)),
                "resume on the same device and backend, so that every point's timings are "
                "comparable");
  std::map<std::size_t, nlohmann::json> done;
  for (const auto& p : at(doc, "points")) {
    const nlohmann::json& status = at(p, "status");
    if (status != "ok" && status != "failed") continue;  // interrupted: run again
    const auto index = at(p, "index").get<std::size_t>();
    nlohmann::json axes = nlohmann::json::object();
    if (index < points.size())
      for (const auto& [axis, value] : points[index].axes) axes[axis] = value;
    if (index >= points.size() || at(p, "axes") != axes)
      throw Error(where, fmt::format("point {} is not this sweep's point {}", index, index),
                  "start a new run in another folder");
    done.emplace(index, p);
  }
  earlier_metadata = meta;
  return done;
}

/// The table of every point `run` prints at the end of a sweep.
void print_points_table(const nlohmann::json& j, Backend backend, const DeviceProperties& props,
                        const std::filesystem::path& out, const trace::TraceFile* trace_file) {
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
    fmt::print("{:>5}  {:<16} {:<16} {:>11} {:>9} {:>8} {:>12} {:>12} {:>9} {:>9}{}\n",
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

}  // namespace

int run_command(const std::string& scenario_arg, const CommonOptions& o, const RunRequest& t) {
  // From the start: a signal during set-up stops the run before its first point, with the
  // (empty) results written.
  const InterruptGuard interrupts;
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
  if (!t.resume.empty() && !o.out.empty() && o.out != t.resume)
    throw Error("--resume", "names one folder and --out another",
                "give only --resume DIR: the sweep continues in its folder");
  if (!t.resume.empty() && s.trace.enabled)
    throw Error("--resume", "a trace cannot be continued (trace.json holds one run's timeline)",
                "resume without --trace, or trace the sweep again from the start");

  const std::string requested = o.backend.empty() ? s.backend : o.backend;
  const BackendChoice choice = choose_engine_backend(
      requested, o.backend.empty() ? path.string() + ": backend" : "--backend");
  const Backend backend = choice.backend;
  if (!choice.note.empty() && notes) std::fprintf(stderr, "%s\n", choice.note.c_str());
  const Device device = Device::for_backend(backend);
  const DeviceProperties props = device.properties();
  const std::filesystem::path out = !t.resume.empty() ? std::filesystem::path(t.resume)
                                    : o.out.empty()   ? s.outputs.dir
                                                      : std::filesystem::path(o.out);

  const std::vector<SweepPoint> points = s.expand();
  nlohmann::json earlier_metadata;
  const std::map<std::size_t, nlohmann::json> completed =
      t.resume.empty() ? std::map<std::size_t, nlohmann::json>{}
                       : completed_points(out, s.to_json(), props, points, earlier_metadata);

  RunInfo info;
  info.command_line = o.command_line;
  info.device = props;
  info.ceilings = measure_ceilings(device, ceiling_probe_bytes(backend), 3);
  info.budget = memory_budget_of(props);
  if (s.deployment.gpu_memory_gib > 0) {
    info.budget.bytes = s.deployment.gpu_memory_gib * 1073741824.0;
    info.budget.source =
        fmt::format("deployment.gpu_memory_gib: {:g} GiB (the device, {}, has {})",
                    s.deployment.gpu_memory_gib, props.name, format_bytes(props.total_memory));
  }
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

  ResultSet results(run_metadata(info), s.to_json(), points.size());
  if (!t.resume.empty()) {
    // The run keeps the metadata of its start (its ceilings, start time, command) and lists each
    // continuation.
    nlohmann::json resumes = at(earlier_metadata, "resumes").is_array()
                                 ? at(earlier_metadata, "resumes")
                                 : nlohmann::json::array();
    resumes.push_back({{"start_time", results.metadata()["start_time"]},
                       {"command_line", o.command_line},
                       {"points_kept", completed.size()}});
    results.metadata() = earlier_metadata;
    results.metadata()["resumes"] = resumes;
  }
  auto document = [&] {
    nlohmann::json meta = trace_meta;
    meta["file"] = trace_file && trace_file->sessions() > 0 ? nlohmann::json("trace.json")
                                                            : nlohmann::json(nullptr);
    meta["sessions"] = trace_file ? trace_file->sessions() : 0;
    extras.set_metadata("trace", meta);
    return extras.apply(results.to_json());
  };
  const auto per_point_formats = without(s.outputs.formats, "html");
  // Before any point runs: the folder is writable (a new run writes an empty set; a resumed one
  // leaves the file it continues as it is until its first point).
  if (t.resume.empty()) (void)write_results_files(document(), out, per_point_formats);
  const Runner runner(backend, info.budget);
  ProgressBar bar(points.size(), chatty);
  if (chatty)
    std::fprintf(
        stderr, "%s: %zu points on %s (%s), results in %s%s\n", s.name.c_str(), points.size(),
        props.name.c_str(), std::string(name_of(backend)).c_str(), out.c_str(),
        completed.empty()
            ? ""
            : fmt::format(" ({} kept from the interrupted run)", completed.size()).c_str());

  PointWatchdog watchdog;
  const int verify_every = t.verify_every > 0 ? t.verify_every : (t.verify ? 4 : 0);
  const PointPlan plan{s.warmup_steps, s.decode_steps, s.repetitions, s.point_time_limit_s,
                       verify_every};
  if (verify_every > 0) extras.set_metadata("verify", {{"every", verify_every}});
  std::optional<std::string> stopped_at;  // the point a signal interrupted
  for (const auto& point : points) {
    if (const auto kept = completed.find(point.index); kept != completed.end()) {
      results.add_recorded(kept->second);
      continue;
    }
    if (InterruptGuard::signal() != 0) {  // between points: stop before the next one
      stopped_at = fmt::format("before point [{}/{}]", point.index + 1, points.size());
      break;
    }
    PointRecord record;
    record.point = point;
    record.point.config.backend = backend;
    const std::string label = point_label(point);
    if (s.point_time_limit_s > 0)
      watchdog.arm(2 * s.point_time_limit_s + 60,
                   fmt::format("point {} ({}) has run for twice point_time_limit_s ({:g} s) and "
                               "60 s more: a step does not return, so the run ends here; "
                               "{}/results.json holds the points before it; continue with: {}",
                               point.index, label, s.point_time_limit_s, out.string(),
                               resume_command(scenario_arg, o, t, out)));
    std::optional<trace::StepWindowTrace> window;
    if (trace_file) window.emplace(*trace_file, label, s.warmup_steps, s.trace.steps);
    try {
      if (window) window->start();
      record.metrics = runner.run(
          s.models.at(point.model), point.config, plan,
          [&](int step, int steps) {
            bar.step(point.index, label, step, steps);
            if (window) window->step_done(step);
            InterruptGuard::check();
          },
          [&](const DecodeEngine& engine) {
            if (!t.save_selections) return;
            const auto folder = fmt::format("selections/point-{}", point.index);
            if (save_selections(engine, out / folder) > 0)
              extras.set_point(point.index, "selections", folder);
          });
      if (window) window->finish();
    } catch (const StopRequested& stop) {
      record.ok = false;
      record.interrupted = true;
      record.error = fmt::format("interrupted by {}; its measurements were discarded",
                                 InterruptGuard::name(stop.signal));
      stopped_at = fmt::format("during point [{}/{}] {}", point.index + 1, points.size(), label);
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
    watchdog.disarm();
    if (window) {
      if (!window->message().empty()) trace_note("trace: " + window->message());
      if (record.ok && !window->steps().empty()) {
        extras.set_point(point.index, "gpu_phase_ms", trace::mean_phase_ms(window->steps()));
        extras.set_point(point.index, "gpu_phase_steps", window->steps().size());
        // The traced steps' own wall time, beside their GPU time: a GPU sum above it means
        // work overlapped on several streams, not a slower step.
        double wall_ms = 0.0;
        for (const auto& traced : window->steps()) wall_ms += traced.wall_ms;
        extras.set_point(point.index, "gpu_phase_wall_ms",
                         wall_ms / static_cast<double>(window->steps().size()));
      }
    }
    results.add(record);
    (void)write_results_files(document(), out, per_point_formats);
    bar.finished(
        point.index, label,
        record.ok            ? fmt::format("{:.1f} tok/s, step {:.3f} ms (median)",
                                           record.metrics.output_tokens_per_s, record.metrics.step_ms.median)
        : record.interrupted ? "INTERRUPTED"
                             : "FAILED: " + record.error);
    if (stopped_at) break;
  }

  const nlohmann::json j = document();
  (void)write_results_files(j, out, s.outputs.formats);
  if (stopped_at) {
    const int sig = InterruptGuard::signal();
    std::fprintf(stderr,
                 "%s: stopped by %s %s; %zu completed points are in %s/results.json; continue "
                 "with:\n  %s\n",
                 s.name.c_str(), InterruptGuard::name(sig), stopped_at->c_str(),
                 results.count("ok") + results.count("failed"), out.c_str(),
                 resume_command(scenario_arg, o, t, out).c_str());
    return InterruptGuard::exit_status(sig);
  }
  if (o.json) {
    print_json(j);
  } else if (!o.quiet) {
    print_points_table(j, backend, props, out, trace_file.get());
  }
  return results.any_failed() ? exit_code::point_failed : exit_code::ok;
}

}  // namespace hisparse::cli
