#include "commands.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/ceilings.hpp"
#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "model/capacity_model.hpp"
#include "model/mode.hpp"
#include "model/model_spec.hpp"
#include "report/compare.hpp"
#include "report/results_file.hpp"
#include "scenario/backend_choice.hpp"
#include "scenario/scenario.hpp"

namespace hisparse::cli {

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2) << std::endl;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

std::size_t ceiling_probe_bytes(Backend b) {
  // Small on the CPU (2 cores shared in CI); large enough on a GPU to reach the link's plateau.
  return b == Backend::cpu ? std::size_t{32} << 20 : std::size_t{512} << 20;
}

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789_-./=:,+@%") == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
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
