#include "commands.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/ceilings.hpp"
#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "model/capacity_model.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"
#include "progress.hpp"
#include "scenario/scenario.hpp"

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

int run_command(const std::string& scenario_arg, const CommonOptions& o) {
  const auto path = find_scenario(scenario_arg, "run: SCENARIO");
  const Scenario s = load_scenario(path, o.sets);
  const std::string requested = o.backend.empty() ? s.backend : o.backend;
  const Backend backend =
      resolve_backend(requested, o.backend.empty() ? path.string() + ": backend" : "--backend");
  const Device device = Device::for_backend(backend);
  const DeviceProperties props = device.properties();
  const std::filesystem::path out = o.out.empty() ? s.outputs.dir : std::filesystem::path(o.out);
  const bool chatty = !o.quiet && !o.json;

  RunInfo info;
  info.command_line = o.command_line;
  info.device = props;
  info.ceilings = measure_ceilings(device, ceiling_probe_bytes(backend), 3);
  info.budget = memory_budget_of(props);
  info.synthetic_workload = s.workload.generator == "synthetic";
  for (const auto& [name, model] : s.models)
    if (!model.weights.empty()) info.synthetic_weights = false;

  const std::vector<SweepPoint> points = s.expand();
  ResultSet results(run_metadata(info), s.to_json(), points.size());
  (void)results.write(out, s.outputs.formats);  // an empty set first: the folder is writable
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
    try {
      record.metrics =
          runner.run(s.models.at(point.model), point.config, s.warmup_steps, s.decode_steps,
                     [&](int step, int steps) { bar.step(point.index, label, step, steps); });
    } catch (const std::exception& e) {
      record.ok = false;
      record.error = e.what();
    }
    results.add(record);
    (void)results.write(out, s.outputs.formats);
    bar.finished(
        point.index, label,
        record.ok ? fmt::format("{:.1f} tok/s, step {:.3f} ms (median)",
                                record.metrics.output_tokens_per_s, record.metrics.step_ms.median)
                  : "FAILED: " + record.error);
  }

  const nlohmann::json j = results.to_json();
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
  }
  return results.any_failed() ? exit_code::point_failed : exit_code::ok;
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
  } else {
    fmt::print("{} hardware threads\n", props.multiprocessors);
    fmt::print("measured ({} copies): host memcpy {:.1f} GB/s (read + write)\n",
               format_bytes(c.bytes), c.host_copy_gbps);
  }
  return exit_code::ok;
}

}  // namespace hisparse::cli
