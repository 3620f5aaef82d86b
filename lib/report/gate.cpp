// Judging results against a gate's baselines (see gate.hpp), and the gate's views.
#include "report/gate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "bench/statistics.hpp"
#include "core/error.hpp"
#include "report/atomic_file.hpp"
#include "report/benchmark_file.hpp"
#include "report/detail/result_points.hpp"
#include "report/json_lookup.hpp"
#include "report/results_file.hpp"

namespace hisparse {
namespace {

using detail::config_difference;
using detail::metric_at;
using detail::point_key;
using detail::swept_axes;
using detail::text_of;
using json_lookup::at;
using nlohmann::json;

const std::string kUpdateFix =
    "record the baseline on purpose: hisparse-bench gate BASELINE RESULTS... --update";

/// A value as the table shows it.
std::string value_text(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) return fmt::format("{:.6g}", v.get<double>());
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  return s.size() > 24 ? s.substr(0, 21) + "..." : s;
}

std::string number_text(double v) {
  return std::isfinite(v) ? fmt::format("{:.6g}", v) : "-";
}

/// A timing metric's repetitions on one point: metrics.repetitions[name] when the run repeated
/// the point, else its one value.
std::vector<double> timing_samples(const json& point, const std::string& name) {
  if (const json* reps = metric_at(point, "repetitions"); reps && reps->is_object())
    if (const json& list = at(*reps, name.c_str()); list.is_array() && !list.empty()) {
      std::vector<double> v;
      for (const auto& x : list)
        if (x.is_number()) v.push_back(x.get<double>());
      return v;
    }
  const json* v = metric_at(point, name);
  return v && v->is_number() ? std::vector<double>{v->get<double>()} : std::vector<double>{};
}

/// Relative p10..p90 spread of a point's step times, in percent (0 when unknown): the noise of a
/// single run of a step-time metric.
double step_spread_pct(const json& point, const std::string& metric) {
  if (metric != "output_tokens_per_s" && metric != "tpot_ms" && metric.rfind("step_ms.", 0) != 0)
    return 0.0;
  const json& s = at(at(point, "metrics"), "step_ms");
  const json &p10 = at(s, "p10"), &p90 = at(s, "p90"), &median = at(s, "median");
  if (!p10.is_number() || !p90.is_number() || !median.is_number() || median.get<double>() <= 0)
    return 0.0;
  return 100.0 * (p90.get<double>() - p10.get<double>()) / median.get<double>();
}

double spread_pct(const std::vector<double>& samples, double single) {
  if (samples.size() < 2) return single;
  const double m = percentile(samples, 50);
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return m > 0 ? 100.0 * (*hi - *lo) / m : 0.0;
}

// --- Verdicts ---

/// The fewest repetitions a side with which the rank test can reject at `alpha`.
std::size_t repetitions_for_a_test(double alpha) {
  std::size_t n = 2;
  while (smallest_p_value(n, n) >= alpha && n < 64) ++n;
  return n;
}

bool worse_direction(GateMetric::Better better, double delta) {
  return better == GateMetric::Better::higher ? delta < 0 : delta > 0;
}

void judge_timing(GateRow& r, const GateMetric& m, const std::vector<double>& base,
                  const std::vector<double>& next, double base_single_spread,
                  double new_single_spread) {
  r.base_samples = base.size();
  r.new_samples = next.size();
  r.base = percentile(base, 50);
  r.next = percentile(next, 50);
  r.base_text = number_text(r.base);
  r.new_text = number_text(r.next);
  if (!(r.base > 0)) {
    r.verdict = GateVerdict::not_measured;
    r.note = "BASE median is 0";
    return;
  }
  r.delta_pct = 100.0 * (r.next - r.base) / r.base;
  const bool worse = worse_direction(m.better, r.delta_pct);
  const GateVerdict decided = worse ? GateVerdict::slower : GateVerdict::faster;
  if (std::abs(r.delta_pct) <= m.min_effect_pct) {
    r.verdict = GateVerdict::same;
  } else if (smallest_p_value(base.size(), next.size()) < m.alpha) {
    r.p_value = mann_whitney_u(base, next).p_value;
    r.verdict = r.p_value < m.alpha ? decided : GateVerdict::ambiguous;
  } else {
    r.noise_pct =
        std::max(spread_pct(base, base_single_spread), spread_pct(next, new_single_spread));
    r.verdict = std::abs(r.delta_pct) > r.noise_pct ? decided : GateVerdict::ambiguous;
    if (r.verdict == GateVerdict::ambiguous)
      r.note = fmt::format(
          "within the {:.1f}% spread; {} repetitions a side would let a rank "
          "test decide",
          r.noise_pct, repetitions_for_a_test(m.alpha));
  }
}

void judge_deterministic(GateRow& r, const GateMetric& m, const json& base, const json& next) {
  r.base_text = value_text(base);
  r.new_text = value_text(next);
  r.base_samples = r.new_samples = 1;
  if (base.is_null() && next.is_null()) {
    r.verdict = GateVerdict::not_measured;
    return;
  }
  if (base.is_number() && next.is_number()) {
    r.base = base.get<double>();
    r.next = next.get<double>();
    if (r.base != 0) r.delta_pct = 100.0 * (r.next - r.base) / std::abs(r.base);
    const double scale = std::max(std::abs(r.base), std::abs(r.next));
    const double relative = scale > 0 ? std::abs(r.next - r.base) / scale : 0.0;
    if (relative <= m.tolerance) {
      r.verdict = GateVerdict::same;
    } else if (m.better == GateMetric::Better::none) {
      r.verdict = GateVerdict::changed;
    } else {
      r.verdict =
          worse_direction(m.better, r.next - r.base) ? GateVerdict::worse : GateVerdict::better;
    }
    return;
  }
  r.verdict = base == next ? GateVerdict::same : GateVerdict::changed;
}

GateRow make_row(const std::string& baseline, const std::string& item, const std::string& metric) {
  GateRow r;
  r.baseline = baseline;
  r.item = item;
  r.metric = metric;
  return r;
}

GateRun make_run(const GateBaseline& b, json base, json next) {
  GateRun run;
  run.baseline = b.name;
  run.base = std::move(base);
  run.next = std::move(next);
  run.baseline_files.push_back(b.file);
  for (const auto& f : b.extra_files) run.baseline_files.push_back(f);
  return run;
}

// --- Inputs ---

struct Document {
  json doc;
  std::filesystem::path path;
  [[nodiscard]] std::string label() const { return path.string(); }
};

Document read_document(const std::filesystem::path& path) {
  Document d{read_json_file(path,
                            "give results.json files written by 'hisparse-bench run' or "
                            "Google Benchmark JSON written by hisparse-microbench"),
             path};
  if (is_results_document(d.doc)) {
    d.doc = checked_results(std::move(d.doc), d.label());
  } else if (!is_benchmark_document(d.doc)) {
    throw Error(d.label(), "is neither a hisparse-bench results file nor a Google Benchmark output",
                "give results.json files written by 'hisparse-bench run' or "
                "hisparse-microbench --benchmark_out=FILE --benchmark_out_format=json files");
  }
  return d;
}

Document read_baseline(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(path.string(), "the baseline file does not exist", kUpdateFix);
  return read_document(path);
}

bool is_results(const Document& d) {
  return is_results_document(d.doc);
}

std::string scenario_name(const Document& d) {
  const json& n = at(at(d.doc, "scenario"), "name");
  return n.is_string() ? n.get<std::string>() : "";
}

BenchmarkRuns pooled_runs(const std::vector<Document>& docs) {
  BenchmarkRuns runs = read_benchmark_runs(docs.front().doc, docs.front().label());
  for (std::size_t i = 1; i < docs.size(); ++i)
    pool_benchmark_runs(runs, read_benchmark_runs(docs[i].doc, docs[i].label()));
  return runs;
}

std::vector<Document> baseline_documents(const GateBaseline& b) {
  std::vector<Document> docs{read_baseline(b.file)};
  for (const auto& f : b.extra_files) docs.push_back(read_baseline(f));
  for (const auto& d : docs)
    if (is_results(d) != (b.kind == GateInputKind::results))
      throw Error(
          d.label(),
          fmt::format("is a {} file, but {} gates a {}",
                      is_results(d) ? "results" : "Google Benchmark", b.where,
                      b.kind == GateInputKind::results ? "scenario's results" : "microbenchmark"),
          "point the baseline's file: at the right document");
  return docs;
}

bool case_gated(const GateBaseline& b, const std::string& name) {
  return b.cases.empty() || std::regex_search(name, std::regex(b.cases));
}

struct Match {
  const GateBaseline* baseline = nullptr;
  std::vector<Document> inputs;
};

std::string baseline_names(const GateSpec& gate, GateInputKind kind) {
  std::string names;
  for (const auto& b : gate.baselines)
    if (b.kind == kind) names += (names.empty() ? "" : ", ") + b.name;
  return names.empty() ? "none" : names;
}

std::string gate_label(const GateSpec& gate) {
  return gate.file.empty() ? "the default gate" : gate.file.string();
}

/// Each input with the baseline it is judged against, in the gate's order.
std::vector<Match> match_inputs(const GateSpec& gate,
                                const std::vector<std::filesystem::path>& inputs) {
  if (inputs.empty())
    throw Error("RESULTS", "no results to judge", "give the results.json files of the run");
  std::vector<Match> matches(gate.baselines.size());
  for (std::size_t i = 0; i < gate.baselines.size(); ++i) matches[i].baseline = &gate.baselines[i];
  std::map<std::size_t, std::set<std::string>> baseline_cases;  // microbench baselines' cases
  for (const auto& path : inputs) {
    Document d = read_document(path);
    std::optional<std::size_t> chosen;
    if (is_results(d)) {
      const std::string name = scenario_name(d);
      for (std::size_t i = 0; i < gate.baselines.size(); ++i)
        if (gate.baselines[i].kind == GateInputKind::results && gate.baselines[i].name == name)
          chosen = i;
      if (!chosen)
        throw Error(d.label(),
                    fmt::format("no baseline of scenario '{}' in {} (it gates: {})", name,
                                gate_label(gate), baseline_names(gate, GateInputKind::results)),
                    "judge a run of a scenario the baseline gates, or add an entry for it to "
                    "gate.yaml and record it with --update");
    } else {
      // The microbench baseline that holds most of this file's cases (the only one, if one).
      const BenchmarkRuns runs = read_benchmark_runs(d.doc, d.label());
      std::vector<std::size_t> candidates;
      for (std::size_t i = 0; i < gate.baselines.size(); ++i)
        if (gate.baselines[i].kind == GateInputKind::microbench) candidates.push_back(i);
      std::size_t best_shared = 0;
      for (std::size_t i : candidates) {
        std::error_code ec;
        if (candidates.size() == 1) {
          chosen = i;
          break;
        }
        if (!std::filesystem::exists(gate.baselines[i].file, ec)) continue;
        if (!baseline_cases.count(i))
          for (const auto& name : pooled_runs(baseline_documents(gate.baselines[i])).order)
            baseline_cases[i].insert(name);
        std::size_t shared = 0;
        for (const auto& name : runs.order)
          shared += case_gated(gate.baselines[i], name) && baseline_cases[i].count(name);
        if (shared > best_shared) best_shared = shared, chosen = i;
      }
      if (!chosen)
        throw Error(d.label(),
                    fmt::format("shares no benchmark case with a microbench baseline of {} (it "
                                "gates: {})",
                                gate_label(gate), baseline_names(gate, GateInputKind::microbench)),
                    "run the cases a baseline holds (the same --benchmark_filter), or add a "
                    "microbench entry to gate.yaml and record it with --update");
    }
    matches[*chosen].inputs.push_back(std::move(d));
  }
  std::erase_if(matches, [](const Match& m) { return m.inputs.empty(); });
  return matches;
}

json results_provenance(const Document& d) {
  const json& meta = at(d.doc, "metadata");
  return {{"label", d.label()},
          {"backend", at(meta, "backend")},
          {"device", at(at(meta, "device"), "name")},
          {"git_revision", at(meta, "git_revision")},
          {"start_time", at(meta, "start_time")}};
}

json benchmark_provenance(const BenchmarkRuns& r) {
  return {{"label", r.label},
          {"backend", r.backend},
          {"device", r.device},
          {"git_revision", r.revision},
          {"start_time", r.date}};
}

/// Refuses (or, when allowed, warns about) a new run from another backend or device.
void check_devices(const json& base, const json& next, bool judges_timing,
                   const GateOptions& options, GateOutcome& out) {
  const std::string bb = text_of(base["backend"]), nb = text_of(next["backend"]);
  const std::string bd = text_of(base["device"]), nd = text_of(next["device"]);
  std::string problem;
  if (!bb.empty() && !nb.empty() && bb != nb)
    problem = fmt::format("backend {} differs from the baseline's {}", nb, bb);
  else if (!bd.empty() && !nd.empty() && bd != nd)
    problem = fmt::format("device {} differs from the baseline's {}", nd, bd);
  if (problem.empty()) return;
  // A deterministic metric is the same on any machine of one backend.
  if (bb == nb && !judges_timing) {
    out.warnings.push_back(fmt::format("{}: {}; judged, since this baseline gates no timing",
                                       text_of(next["label"]), problem));
    return;
  }
  if (!options.allow_different_devices)
    throw Error(text_of(next["label"]),
                problem + ": timings of different devices or backends are not comparable",
                "judge runs of the baseline's device and backend (a baseline per device, e.g. "
                "reports/baselines/<device>/), or pass --allow-different-devices");
  out.warnings.push_back(fmt::format("{}: {} (judged anyway: --allow-different-devices)",
                                     text_of(next["label"]), problem));
}

void check_scenarios(const Document& base, const Document& next, const GateOptions& options,
                     GateOutcome& out) {
  // Keys that do not change what a point measures.
  std::vector<std::string> diff =
      scenario_differences(at(base.doc, "scenario"), at(next.doc, "scenario"),
                           {"outputs", "trace", "repetitions", "point_time_limit_s", "source",
                            "description", "backend"});
  if (diff.empty()) return;
  if (diff.size() > 4) diff.resize(4), diff.emplace_back("...");
  const std::string problem = fmt::format("its scenario differs from the baseline's ({}) in {}",
                                          base.label(), fmt::format("{}", fmt::join(diff, ", ")));
  if (!options.allow_different_scenarios)
    throw Error(next.label(), problem + ": its metrics would differ for that reason alone",
                "run the scenario the baseline was recorded with, or, if the scenario changed "
                "on purpose, " +
                    kUpdateFix);
  out.warnings.push_back(next.label() + ": " + problem);
}

/// The metrics of `b` that its baseline documents have (an absent required one is an error).
std::vector<const GateMetric*> present_metrics(
    const GateBaseline& b, const std::function<bool(const std::string&)>& baseline_has,
    const std::string& where, const std::string& known) {
  std::vector<const GateMetric*> present;
  for (const auto& m : b.metrics) {
    if (baseline_has(m.name)) {
      present.push_back(&m);
    } else if (m.required) {
      throw Error(b.where + ": metrics." + m.name,
                  fmt::format("no point or case of {} has {}", where, m.name),
                  known.empty() ? "name a metric the baseline has" : "use one of: " + known);
    }
  }
  return present;
}

void judge_results(const GateBaseline& b, const std::vector<Document>& base,
                   const std::vector<Document>& next, const GateOptions& options,
                   GateOutcome& out) {
  const bool judges_timing =
      std::any_of(b.metrics.begin(), b.metrics.end(), [](const auto& m) { return m.timing; });
  GateRun run = make_run(b, results_provenance(base.front()), results_provenance(next.front()));
  for (const auto& d : next) {
    check_devices(run.base, results_provenance(d), judges_timing, options, out);
    check_scenarios(base.front(), d, options, out);
    run.inputs.push_back(d.path);
  }
  out.runs.push_back(std::move(run));

  std::vector<const json*> all;
  for (const auto* side : {&base, &next})
    for (const auto& d : *side) all.push_back(&d.doc);
  const std::vector<std::string> axes = swept_axes(all);
  using Points = std::map<std::string, std::vector<const json*>>;
  auto index = [&](const std::vector<Document>& docs, std::vector<std::string>& order) {
    Points points;
    for (const auto& d : docs) {
      std::set<std::string> seen;  // duplicate axis values in one file: the first one counts
      for (const auto& p : at(d.doc, "points")) {
        const std::string key = point_key(p, axes);
        if (!seen.insert(key).second) continue;
        if (points[key].empty()) order.push_back(key);
        points[key].push_back(&p);
      }
    }
    return points;
  };
  std::vector<std::string> base_order, new_order;
  const Points base_points = index(base, base_order), new_points = index(next, new_order);

  // The metrics a point has, for the message naming a metric it does not (objects one level
  // deep: step_ms.median).
  std::vector<std::string> known;
  for (const auto& p : at(base.front().doc, "points"))
    if (const json& m = at(p, "metrics"); m.is_object() && known.empty())
      for (const auto& [k, v] : m.items()) {
        if (!v.is_object()) known.push_back(k);
        if (v.is_object() && k != "repetitions")
          for (const auto& [child, cv] : v.items())
            if (!cv.is_object()) known.push_back(k + "." + child);
      }
  const auto metrics = present_metrics(
      b,
      [&](const std::string& name) {
        bool any_ok = false;  // a baseline of failed points only has no metric to miss
        for (const auto& [key, points] : base_points)
          for (const json* p : points) {
            if (metric_at(*p, name)) return true;
            any_ok = any_ok || at(*p, "status") == json("ok");
          }
        return !any_ok;
      },
      base.front().label(), fmt::format("{}", fmt::join(known, ", ")));

  auto row = [&](const std::string& item, const std::string& metric) {
    return make_row(b.name, item, metric);
  };
  auto all_ok = [](const std::vector<const json*>& points) {
    return std::all_of(points.begin(), points.end(),
                       [](const json* p) { return at(*p, "status") == json("ok"); });
  };
  auto first_error = [](const std::vector<const json*>& points) {
    for (const json* p : points)
      if (at(*p, "status") != json("ok")) return text_of(at(*p, "error"));
    return std::string();
  };
  std::size_t matched = 0;
  for (const auto& key : base_order) {
    const auto& bp = base_points.at(key);
    const auto it = new_points.find(key);
    if (it == new_points.end()) {
      GateRow r = row(key, "-");
      r.verdict = all_ok(bp) ? GateVerdict::missing : GateVerdict::not_measured;
      r.note = "only in BASE";
      out.rows.push_back(std::move(r));
      continue;
    }
    ++matched;
    const auto& np = it->second;
    if (!all_ok(bp) || !all_ok(np)) {
      GateRow r = row(key, "status");
      r.base_text = all_ok(bp) ? "ok" : "failed";
      r.new_text = all_ok(np) ? "ok" : "failed";
      r.verdict = all_ok(bp) ? GateVerdict::failed : GateVerdict::not_measured;
      r.note = all_ok(bp) ? "failed in NEW: " + first_error(np) : "failed in BASE";
      out.rows.push_back(std::move(r));
      continue;
    }
    const std::string config_note =
        options.allow_different_scenarios ? config_difference(*bp.front(), *np.front(), axes) : "";
    for (const GateMetric* m : metrics) {
      GateRow r = row(key, m->name);
      const json* base_value = metric_at(*bp.front(), m->name);
      const json* new_value = metric_at(*np.front(), m->name);
      if (!base_value) {
        r.verdict = GateVerdict::not_measured;
        r.note = "BASE has no metrics." + m->name;
      } else if (!new_value) {
        r.verdict = GateVerdict::missing;
        r.note = "NEW has no metrics." + m->name;
      } else if (m->timing) {
        std::vector<double> bs, ns;
        for (const json* p : bp) {
          const auto v = timing_samples(*p, m->name);
          bs.insert(bs.end(), v.begin(), v.end());
        }
        for (const json* p : np) {
          const auto v = timing_samples(*p, m->name);
          ns.insert(ns.end(), v.begin(), v.end());
        }
        if (bs.empty() || ns.empty()) {
          r.verdict = GateVerdict::not_measured;
          r.note = fmt::format("no number in {}", bs.empty() ? "BASE" : "NEW");
        } else {
          judge_timing(r, *m, bs, ns, step_spread_pct(*bp.front(), m->name),
                       step_spread_pct(*np.front(), m->name));
        }
      } else {
        judge_deterministic(r, *m, *base_value, *new_value);
        for (std::size_t i = 1; i < np.size(); ++i) {
          const json* again = metric_at(*np[i], m->name);
          if (!again || *again != *new_value) {
            r.verdict = GateVerdict::changed;
            r.note = "differs between NEW's files, though the same for a fixed seed";
          }
        }
      }
      if (!config_note.empty())
        r.note += (r.note.empty() ? "" : "; ") + ("config differs: " + config_note);
      out.rows.push_back(std::move(r));
    }
  }
  for (const auto& key : new_order)
    if (!base_points.count(key)) {
      GateRow r = row(key, "-");
      r.verdict = GateVerdict::added;
      r.note = "only in NEW";
      out.rows.push_back(std::move(r));
    }
  if (matched == 0)
    throw Error(
        next.front().label(),
        fmt::format("no sweep point matches one of the baseline's ({}) by its axis "
                    "values{}",
                    base.front().label(),
                    axes.empty() ? "" : " (" + fmt::format("{}", fmt::join(axes, ", ")) + ")"),
        "judge a run of the scenario the baseline was recorded with");
}

void judge_microbench(const GateBaseline& b, const std::vector<Document>& base_docs,
                      const std::vector<Document>& new_docs, const GateOptions& options,
                      GateOutcome& out) {
  const BenchmarkRuns base = pooled_runs(base_docs), next = pooled_runs(new_docs);
  GateRun run = make_run(b, benchmark_provenance(base), benchmark_provenance(next));
  for (const auto& d : new_docs) run.inputs.push_back(d.path);
  check_devices(run.base, run.next, true, options, out);
  out.runs.push_back(std::move(run));

  std::vector<std::string> gated;
  for (const auto& name : base.order)
    if (case_gated(b, name)) gated.push_back(name);
  std::string known;
  if (!gated.empty())
    for (const auto& [counter, values] : base.cases.at(gated.front()))
      known += (known.empty() ? "" : ", ") + counter;
  const auto metrics = present_metrics(
      b,
      [&](const std::string& name) {
        return std::any_of(gated.begin(), gated.end(),
                           [&](const auto& c) { return base.cases.at(c).count(name) > 0; });
      },
      base.label, known);
  std::size_t matched = 0;
  for (const auto& name : gated) {
    const auto it = next.cases.find(name);
    if (it == next.cases.end()) {
      GateRow r = make_row(b.name, name, "-");
      r.verdict = GateVerdict::missing;
      r.note = "only in BASE";
      out.rows.push_back(std::move(r));
      continue;
    }
    ++matched;
    for (const GateMetric* m : metrics) {
      GateRow r = make_row(b.name, name, m->name);
      const auto& bc = base.cases.at(name);
      const auto bv = bc.find(m->name), nv = it->second.find(m->name);
      if (bv == bc.end()) {
        r.verdict = GateVerdict::not_measured;
      } else if (nv == it->second.end()) {
        r.verdict = GateVerdict::missing;
        r.note = "NEW has no " + m->name;
      } else if (m->timing) {
        judge_timing(r, *m, bv->second, nv->second, 0.0, 0.0);
      } else {
        judge_deterministic(r, *m, json(percentile(bv->second, 50)),
                            json(percentile(nv->second, 50)));
      }
      out.rows.push_back(std::move(r));
    }
  }
  for (const auto& name : next.order)
    if (case_gated(b, name) && !base.cases.count(name)) {
      GateRow r = make_row(b.name, name, "-");
      r.verdict = GateVerdict::added;
      r.note = "only in NEW";
      out.rows.push_back(std::move(r));
    }
  if (matched == 0)
    throw Error(next.label,
                fmt::format("no benchmark case{} is in the baseline ({})",
                            b.cases.empty() ? "" : " matching '" + b.cases + "'", base.label),
                "run the cases the baseline holds (the same --benchmark_filter)");
}

}  // namespace

std::string_view name_of(GateVerdict v) noexcept {
  switch (v) {
    case GateVerdict::same:
      return "same";
    case GateVerdict::faster:
      return "faster";
    case GateVerdict::slower:
      return "slower";
    case GateVerdict::ambiguous:
      return "ambiguous";
    case GateVerdict::better:
      return "better";
    case GateVerdict::worse:
      return "worse";
    case GateVerdict::changed:
      return "changed";
    case GateVerdict::failed:
      return "failed";
    case GateVerdict::missing:
      return "missing";
    case GateVerdict::added:
      return "added";
    case GateVerdict::not_measured:
      return "not_measured";
  }
  return "same";
}

bool fails(GateVerdict v) noexcept {
  return v == GateVerdict::slower || v == GateVerdict::worse || v == GateVerdict::changed ||
         v == GateVerdict::failed || v == GateVerdict::missing;
}

std::size_t GateOutcome::count(GateVerdict v) const noexcept {
  return static_cast<std::size_t>(
      std::count_if(rows.begin(), rows.end(), [&](const GateRow& r) { return r.verdict == v; }));
}

bool GateOutcome::failed() const noexcept {
  return std::any_of(rows.begin(), rows.end(), [](const GateRow& r) { return fails(r.verdict); });
}

GateOutcome judge_documents(const GateBaseline& baseline, const std::vector<nlohmann::json>& base,
                            const std::vector<std::string>& base_labels,
                            const std::vector<nlohmann::json>& next,
                            const std::vector<std::string>& new_labels,
                            const GateOptions& options) {
  auto documents = [](const std::vector<json>& docs, const std::vector<std::string>& labels) {
    std::vector<Document> out;
    for (std::size_t i = 0; i < docs.size(); ++i)
      out.push_back({docs[i], i < labels.size() ? labels[i] : fmt::format("document {}", i + 1)});
    return out;
  };
  GateOutcome out;
  const auto b = documents(base, base_labels), n = documents(next, new_labels);
  if (b.empty() || n.empty()) throw Error("gate", "nothing to judge", "give both sides");
  if (baseline.kind == GateInputKind::results)
    judge_results(baseline, b, n, options, out);
  else
    judge_microbench(baseline, b, n, options, out);
  return out;
}

GateOutcome run_gate(const GateSpec& gate, const std::vector<std::filesystem::path>& inputs,
                     const GateOptions& options) {
  GateOutcome out;
  for (const Match& m : match_inputs(gate, inputs)) {
    const std::vector<Document> base = baseline_documents(*m.baseline);
    if (m.baseline->kind == GateInputKind::results)
      judge_results(*m.baseline, base, m.inputs, options, out);
    else
      judge_microbench(*m.baseline, base, m.inputs, options, out);
  }
  for (const auto& b : gate.baselines)
    if (std::none_of(out.runs.begin(), out.runs.end(),
                     [&](const GateRun& r) { return r.baseline == b.name; }))
      out.warnings.push_back(
          fmt::format("baseline '{}' was not judged: no input matched it", b.name));
  return out;
}

std::vector<std::filesystem::path> update_gate_baselines(
    const GateSpec& gate, const std::vector<std::filesystem::path>& inputs) {
  std::vector<std::filesystem::path> written;
  for (const Match& m : match_inputs(gate, inputs)) {
    const GateBaseline& b = *m.baseline;
    if (!b.extra_files.empty())
      throw Error(b.where, "is pooled from several files, and --update writes one",
                  "write a gate.yaml whose entry names one file");
    json doc = m.inputs.front().doc;
    if (b.kind == GateInputKind::results) {
      if (m.inputs.size() > 1)
        throw Error(m.inputs[1].label(),
                    fmt::format("is a second results file of scenario '{}'", b.name),
                    "record one run, with --repetitions N for timings");
    } else {
      for (std::size_t i = 1; i < m.inputs.size(); ++i)
        for (const auto& r : at(m.inputs[i].doc, "benchmarks")) doc["benchmarks"].push_back(r);
    }
    std::error_code ec;
    std::filesystem::create_directories(b.file.parent_path(), ec);
    write_file_atomically(b.file, doc.dump(2) + "\n");
    written.push_back(b.file);
  }
  return written;
}

json gate_overlay(const GateOutcome& o) {
  std::vector<json> docs;
  std::vector<std::string> labels;
  for (const auto& run : o.runs) {
    if (run.baseline_files.empty()) continue;
    const Document base = read_document(run.baseline_files.front());
    if (!is_results(base)) continue;
    std::vector<json> next;
    for (const auto& input : run.inputs) next.push_back(read_document(input).doc);
    std::vector<const json*> all{&base.doc};
    for (const auto& d : next) all.push_back(&d);
    const std::vector<std::string> axes = swept_axes(all);  // as the rows were keyed
    docs.push_back(base.doc);
    labels.push_back(fmt::format("baseline {} (git {})", run.baseline,
                                 text_of(run.base["git_revision"]).substr(0, 12)));
    for (auto& d : next) {
      for (auto& p : d["points"]) {
        json verdicts = json::array();
        for (const auto& r : o.rows)
          if (r.baseline == run.baseline && r.item == point_key(p, axes))
            verdicts.push_back(
                {{"metric", r.metric},
                 {"verdict", std::string(name_of(r.verdict))},
                 {"delta_pct", std::isfinite(r.delta_pct) ? json(r.delta_pct) : json()},
                 {"fails", fails(r.verdict)}});
        p["gate"] = std::move(verdicts);
      }
      docs.push_back(std::move(d));
      labels.push_back(fmt::format("new {} (git {})", run.baseline,
                                   text_of(run.next["git_revision"]).substr(0, 12)));
    }
  }
  return docs.empty() ? json() : merge_results(docs, labels);
}

}  // namespace hisparse
