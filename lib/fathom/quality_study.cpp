#include "fathom/quality_study.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/metrics.hpp"
#include "core/parallel.hpp"
#include "fathom/key_centre.hpp"
#include "fathom/klt.hpp"
#include "fathom/plane_store.hpp"
#include "fathom/selector.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

std::vector<MethodSpec> default_methods() {
  std::vector<MethodSpec> m;
  // Dense enough below 136 bits that "bits at the 32-channel scan's error" is interpolated
  // between neighbours 8-16 plane bits apart, not read off a 4-point curve.
  for (int b : {32, 40, 48, 56, 64, 80, 96, 128}) m.push_back({ScanMethod::fathom, b, 0});
  m.push_back({ScanMethod::full_scan, 0, 0});
  m.push_back({ScanMethod::fixed_channels, 0, 32});
  m.push_back({ScanMethod::sparq, 0, 16});
  m.push_back({ScanMethod::sparq, 0, 32});
  m.push_back({ScanMethod::oracle, 0, 0});
  return m;
}

std::vector<MethodSpec> study_methods(const QualityConfig& config) {
  auto methods = config.methods.empty() ? default_methods() : config.methods;
  if (!config.klt) return methods;
  const std::size_t given = methods.size();
  for (std::size_t m = 0; m < given; ++m) {
    MethodSpec twin = methods[m];
    if (twin.klt ||
        (twin.method != ScanMethod::fathom && twin.method != ScanMethod::fixed_channels))
      continue;
    twin.klt = true;
    const bool present = std::any_of(methods.begin(), methods.end(),
                                     [&](const MethodSpec& x) { return x.name() == twin.name(); });
    if (!present) methods.push_back(twin);
  }
  return methods;
}

namespace {

/// One KV head's data seen in a key basis: the plane store, the planner's variances and the
/// calibration queries, all in that basis (plain channels, or the KLT eigenbasis).
struct BasisView {
  std::optional<PlaneStore> store;
  std::vector<float> variance;
  std::vector<float> calibration_queries;
  std::vector<int> fixed32;    ///< calibrated 32-channel set
  PlaneReadCalibration reads;  ///< calibrate_plane_reads() of the keys (PlanRule::measured)
};

void fill_view(BasisView& view, const std::uint16_t* keys, std::int64_t n, int d,
               std::vector<float> variance, std::vector<float> calibration_queries,
               const SyntheticKeySpec& spec) {
  view.reads = calibrate_plane_reads(keys, n, d, spec.calibration_skip, spec.calibration_tokens);
  view.store.emplace(Backend::cpu, PlaneLayoutKind::hbm, 1, d, n, "quality study planes");
  view.store->append(0, 1, keys, d, 0, n);
  view.variance = std::move(variance);
  view.calibration_queries = std::move(calibration_queries);
  // Offline calibration of the fixed channel set on held-out queries (never the test queries).
  view.fixed32 = calibrate_fixed_channels(view.variance, view.calibration_queries, d, 32);
}

/// KV head `kvh` of the study: its keys, values and queries (the synthetic workload with the head's
/// own seed, or config.source's) and their shape (channels, query heads, tokens).
struct StudyHead {
  SyntheticKeySpec spec;
  SyntheticKeys data;
  int d = 0, heads = 0;
  std::int64_t n = 0;
};
StudyHead study_head(const QualityConfig& config, int kvh) {
  StudyHead h;
  if (config.source) {
    h.data = config.source(kvh);
  } else {
    h.data = make_synthetic_keys(study_head_spec(config.workload, kvh));
  }
  if (const int steps = config.score_calibration_steps; steps > 0) {
    // Score the last `steps` held-out calibration queries instead of the test queries.
    const auto per_step = static_cast<std::size_t>(h.data.spec.heads) * h.data.spec.channels;
    const std::size_t held = h.data.calibration_queries.size() / per_step;
    if (static_cast<std::size_t>(steps) > held)
      throw Error("quality study: calibration steps",
                  fmt::format("{} calibration query steps asked for, {} are held out", steps, held),
                  fmt::format("use at most {}", held));
    h.data.queries.assign(
        h.data.calibration_queries.end() - static_cast<std::ptrdiff_t>(steps * per_step),
        h.data.calibration_queries.end());
    h.data.spec.steps = steps;
  }
  h.spec = h.data.spec;
  h.d = h.spec.channels;
  h.heads = h.spec.heads;
  h.n = h.spec.tokens;
  return h;
}

/// Tokens each query head selects beyond the sinks and the recent window.
int study_keep(const QualityConfig& config) {
  return config.top_k - config.sinks - config.recent;
}

/// Runs work(kvh) for every study head on up to config.threads threads (0: every hardware thread)
/// and returns the results in head order (parallel_map), so that the figures do not depend on the
/// thread count.
template <class Work>
auto for_each_head(const QualityConfig& config, Work work) {
  return parallel_map(config.kv_heads, config.threads, work);
}

}  // namespace

AttentionStats attention_stats(const QualityConfig& config) {
  const int keep = study_keep(config);
  // Per head: one AttentionStats sample per (step, query head), summed below in head order.
  const auto per_head = for_each_head(config, [&](int kvh) {
    const StudyHead head = study_head(config, kvh);
    const auto& [spec, data, d, heads, n] = head;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<float> scores(static_cast<std::size_t>(n) * heads);
    std::vector<std::int32_t> oracle(
        static_cast<std::size_t>(config.sinks + config.recent + heads * keep));
    std::vector<double> p(static_cast<std::size_t>(n));
    std::vector<AttentionStats> samples;
    for (int step = 0; step < spec.steps; ++step) {
      exact_scores(data.query(step), heads, data.keys.data(), n, d, scores.data());
      const auto oracle_n = kf::select_from_scores_ref(scores.data(), heads, n, keep, config.sinks,
                                                       config.recent, oracle.data());
      for (int h = 0; h < heads; ++h) {
        const float* s = scores.data() + static_cast<std::size_t>(h) * n;
        const double mx = *std::max_element(s, s + n) * scale;
        double z = 0;
        for (std::int64_t i = 0; i < n; ++i) z += (p[i] = std::exp(s[i] * scale - mx));
        AttentionStats a;
        for (std::int64_t i = 0; i < n; ++i) {
          p[i] /= z;
          if (p[i] > 0) a.entropy -= p[i] * std::log(p[i]);
          if (i < config.sinks)
            a.sink_mass += p[i];
          else
            a.top1_mass = std::max(a.top1_mass, p[i]);
          if (i >= n - config.recent) a.recent_mass += p[i];
        }
        for (std::int64_t r = 0; r < oracle_n; ++r) a.selected_mass += p[oracle[r]];
        samples.push_back(a);
      }
    }
    return samples;
  });
  AttentionStats out;
  double samples = 0;
  for (const auto& head : per_head)
    for (const AttentionStats& a : head) {
      out.entropy += a.entropy, out.sink_mass += a.sink_mass, out.recent_mass += a.recent_mass;
      out.selected_mass += a.selected_mass, out.top1_mass += a.top1_mass;
      samples += 1;
    }
  if (samples > 0) {
    out.entropy /= samples, out.sink_mass /= samples, out.recent_mass /= samples;
    out.selected_mass /= samples, out.top1_mass /= samples;
  }
  return out;
}

int study_threads(int requested, unsigned hardware, std::size_t free_bytes, std::int64_t tokens,
                  int channels) {
  if (requested > 0) return requested;
  const double per_head =
      kStudyBytesPerTokenChannel * static_cast<double>(tokens) * static_cast<double>(channels);
  const double fit = per_head > 0 ? 0.5 * static_cast<double>(free_bytes) / per_head : 1e9;
  return static_cast<int>(
      std::max(1.0, std::min(static_cast<double>(std::max(hardware, 1u)), std::floor(fit))));
}

std::vector<QualityRow> quality_study(const QualityConfig& config) {
  return quality_study_grouped(config, 0).rows;
}

QualityResult quality_study_grouped(const QualityConfig& config, int group_heads) {
  HISPARSE_FUNC_RANGE();
  const auto methods = study_methods(config);
  const bool any_klt = std::any_of(methods.begin(), methods.end(), [](const MethodSpec& m) {
    return m.klt && m.method != ScanMethod::oracle;
  });
  std::vector<QualityRow> rows(methods.size());
  for (std::size_t m = 0; m < methods.size(); ++m)
    rows[m].method = methods[m], rows[m].name = methods[m].name();
  const int keep = study_keep(config);
  // Per head and step, each method's sample (bits, channels, recall, error); summed below in
  // head order.
  const auto per_head = for_each_head(config, [&](int kvh) {
    const StudyHead head = study_head(config, kvh);
    const auto& [spec, data, d, heads, n] = head;
    // The keys the planes hold: as generated, or minus their calibration mean.
    std::vector<std::uint16_t> centred;
    if (config.centre_keys) {
      centred.resize(data.keys.size());
      KeyCentre::calibrate(data.keys.data(), n, d, spec.calibration_skip, spec.calibration_tokens)
          .apply(data.keys.data(), centred.data(), n);
    }
    const std::uint16_t* stored = config.centre_keys ? centred.data() : data.keys.data();
    BasisView plain, klt;
    fill_view(plain, stored, n, d, data.variance, data.calibration_queries, spec);
    std::optional<KltBasis> basis;
    std::vector<float> q_klt;
    if (any_klt) {
      // KLT: calibrated on the same tokens as the channel variances; keys rotated before
      // quantization, queries (test and calibration) rotated into the same basis.
      basis = KltBasis::calibrate(stored, n, d, spec.calibration_skip, spec.calibration_tokens);
      std::vector<std::uint16_t> rotated(data.keys.size());
      basis->rotate_keys(stored, rotated.data(), n);
      std::vector<float> calibration(data.calibration_queries.size());
      basis->rotate(data.calibration_queries.data(), calibration.data(),
                    static_cast<std::int64_t>(calibration.size() / static_cast<std::size_t>(d)));
      fill_view(klt, rotated.data(), n, d, basis->variances(), std::move(calibration), spec);
      q_klt.resize(static_cast<std::size_t>(heads) * d);
    }
    std::vector<float> scores(static_cast<std::size_t>(n) * heads);
    std::vector<std::int32_t> oracle(
        static_cast<std::size_t>(config.sinks + config.recent + heads * keep));
    std::vector<std::int32_t> sel(oracle.size());
    std::vector<float> dense(static_cast<std::size_t>(heads) * d), approx(dense.size());
    std::vector<std::vector<QualityRow>> steps(static_cast<std::size_t>(spec.steps),
                                               std::vector<QualityRow>(methods.size()));
    for (int step = 0; step < spec.steps; ++step) {
      std::vector<QualityRow>& sample = steps[static_cast<std::size_t>(step)];
      const float* q = data.query(step);
      if (basis) basis->rotate(q, q_klt.data(), heads);
      exact_scores(q, heads, data.keys.data(), n, d, scores.data());
      const auto oracle_n = kf::select_from_scores_ref(scores.data(), heads, n, keep, config.sinks,
                                                       config.recent, oracle.data());
      attention_over(q, heads, data.keys.data(), data.values.data(), n, d, {}, dense.data());
      for (std::size_t m = 0; m < methods.size(); ++m) {
        std::int64_t count = 0;
        if (methods[m].method == ScanMethod::oracle) {
          std::copy_n(oracle.begin(), oracle_n, sel.begin());
          count = oracle_n;
          sample[m].bits_per_token = 16.0 * d;
          sample[m].active_channels = d;
        } else {
          const BasisView& view = methods[m].klt ? klt : plain;
          const float* qm = methods[m].klt ? q_klt.data() : q;
          auto depths =
              method_depths(methods[m], qm, heads, d, view.variance, view.fixed32, &view.reads);
          // Fixed channel sets are calibrated per method size.
          if (methods[m].method == ScanMethod::fixed_channels && methods[m].channels != 32) {
            const auto own = calibrate_fixed_channels(view.variance, view.calibration_queries, d,
                                                      methods[m].channels);
            depths = method_depths(methods[m], qm, heads, d, view.variance, own);
          }
          // The measured rule scores each read with its least-squares gain.
          std::vector<float> q_gained;
          if (methods[m].method == ScanMethod::fathom && methods[m].rule == PlanRule::measured) {
            q_gained.assign(qm, qm + static_cast<std::size_t>(heads) * d);
            apply_read_gains(q_gained.data(), heads, d, view.reads, depths);
            qm = q_gained.data();
          }
          const PlaneStore& store = *view.store;
          kf::PlaneScanArgs args;
          args.words = store.words();
          args.scales = store.scales();
          args.layout = store.layout();
          args.queries = qm;
          args.depths = depths.data();
          args.streams = 1;
          args.heads = heads;
          if (config.float_scores)
            kf::plane_scores_ref(args, 0, n, scores.data());
          else
            kf::plane_scores_quantized_ref(args, 0, n, scores.data());
          count = kf::select_from_scores_ref(scores.data(), heads, n, keep, config.sinks,
                                             config.recent, sel.data());
          sample[m].bits_per_token = plan_bits(depths);
          sample[m].active_channels = active_channels(depths);
        }
        std::vector<std::int32_t> inter;
        std::set_intersection(sel.begin(), sel.begin() + count, oracle.begin(),
                              oracle.begin() + oracle_n, std::back_inserter(inter));
        sample[m].recall = static_cast<double>(inter.size()) /
                           static_cast<double>(std::max<std::int64_t>(1, oracle_n));
        attention_over(q, heads, data.keys.data(), data.values.data(), n, d,
                       std::span<const std::int32_t>(sel.data(), static_cast<std::size_t>(count)),
                       approx.data());
        sample[m].attention_error = mean_relative_l2_error(approx.data(), dense.data(), heads, d);
      }
    }
    return steps;
  });
  // Means over the samples of heads [first, last), summed in head and step order.
  const auto mean_over = [&](std::size_t first, std::size_t last) {
    std::vector<QualityRow> out = rows;
    double samples = 0;
    for (std::size_t h = first; h < last; ++h)
      for (const auto& sample : per_head[h]) {
        for (std::size_t m = 0; m < methods.size(); ++m) {
          out[m].bits_per_token += sample[m].bits_per_token;
          out[m].active_channels += sample[m].active_channels;
          out[m].recall += sample[m].recall;
          out[m].attention_error += sample[m].attention_error;
        }
        samples += 1;
      }
    for (auto& r : out) {
      r.bits_per_token /= samples;
      r.bytes_per_token = r.bits_per_token / 8.0;
      r.active_channels /= samples;
      r.recall /= samples;
      r.attention_error /= samples;
    }
    return out;
  };
  QualityResult result;
  result.rows = mean_over(0, per_head.size());
  if (group_heads > 0)
    for (std::size_t first = 0; first < per_head.size(); first += group_heads)
      result.groups.push_back(mean_over(
          first, std::min(per_head.size(), first + static_cast<std::size_t>(group_heads))));
  return result;
}

std::string format_quality_table(const std::vector<QualityRow>& rows) {
  std::string out =
      "| method | bits/token | bytes/token | active channels | recall | attention rel. error |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& r : rows)
    out += fmt::format("| {} | {:.1f} | {:.2f} | {:.1f} | {:.4f} | {:.5f} |\n", r.name,
                       r.bits_per_token, r.bytes_per_token, r.active_channels, r.recall,
                       r.attention_error);
  return out;
}

double fathom_bits_at_error(const std::vector<QualityRow>& rows, double error, bool klt) {
  std::vector<const QualityRow*> f;
  for (const auto& r : rows)
    if (r.method.method == ScanMethod::fathom && r.method.klt == klt) f.push_back(&r);
  if (f.empty()) return 0;
  std::sort(f.begin(), f.end(),
            [](auto a, auto b) { return a->bits_per_token < b->bits_per_token; });
  // The last row above `error`; every row after it is at or below.
  std::size_t last_above = f.size();
  for (std::size_t i = f.size(); i-- > 0;)
    if (f[i]->attention_error > error) {
      last_above = i;
      break;
    }
  if (last_above == f.size()) return f.front()->bits_per_token;
  if (last_above + 1 == f.size()) return f.back()->bits_per_token;
  const QualityRow& a = *f[last_above];
  const QualityRow& b = *f[last_above + 1];
  const double e0 = std::log(a.attention_error), e1 = std::log(b.attention_error);
  const double b0 = std::log(a.bits_per_token), b1 = std::log(b.bits_per_token);
  const double t = (e0 - std::log(error)) / std::max(e0 - e1, 1e-300);
  return std::exp(b0 + t * (b1 - b0));
}

namespace {
struct Point {
  double bits, error;
};
/// One head's move to its next hull point: the chosen and the scored change of the mean, and the
/// head's budget after the move.
struct Step {
  Point chosen, scored;
  std::size_t head;
  int budget;
};
/// The Lagrangian path of per-head splits on the chosen curves: every head at its smallest hull
/// budget (`start`, scored mean `at`), then the hull steps, steepest chosen error reduction per
/// bit first. nullopt when the head counts differ, a head has no row of the rule or a chosen
/// budget is missing from its scored rows.
struct SplitPath {
  std::vector<int> start;
  Point at{0, 0};
  std::vector<Step> steps;
};
std::optional<SplitPath> split_path(const std::vector<std::vector<QualityRow>>& choose_on,
                                    const std::vector<std::vector<QualityRow>>& score_on,
                                    PlanRule rule, bool klt) {
  // One head's points by budget: where it is chosen and where it is scored.
  struct Budget {
    int budget;
    Point chosen, scored;
  };
  if (choose_on.empty() || choose_on.size() != score_on.size()) return std::nullopt;
  const auto heads = static_cast<double>(choose_on.size());
  const auto own = [&](const QualityRow& r) {
    return r.method.method == ScanMethod::fathom && r.method.rule == rule && r.method.klt == klt;
  };
  SplitPath path;
  for (std::size_t h = 0; h < choose_on.size(); ++h) {
    std::vector<Budget> p;
    for (const auto& r : choose_on[h]) {
      if (!own(r)) continue;
      const auto s = std::find_if(score_on[h].begin(), score_on[h].end(), [&](const QualityRow& x) {
        return own(x) && x.method.budget == r.method.budget;
      });
      if (s == score_on[h].end()) return std::nullopt;
      p.push_back({r.method.budget,
                   {r.bits_per_token, r.attention_error},
                   {s->bits_per_token, s->attention_error}});
    }
    if (p.empty()) return std::nullopt;
    std::sort(p.begin(), p.end(), [](const Budget& a, const Budget& b) {
      return a.chosen.bits < b.chosen.bits ||
             (a.chosen.bits == b.chosen.bits && a.chosen.error < b.chosen.error);
    });
    // Lower convex hull of the chosen points (monotone chain), then only its part where their
    // error still falls.
    std::vector<Budget> hull;
    for (const Budget& q : p) {
      if (!hull.empty() && hull.back().chosen.bits == q.chosen.bits) continue;  // lower came first
      while (hull.size() >= 2) {
        const Point& o = hull[hull.size() - 2].chosen;
        const Point& a = hull.back().chosen;
        if ((a.bits - o.bits) * (q.chosen.error - o.error) -
                (a.error - o.error) * (q.chosen.bits - o.bits) >
            0)
          break;
        hull.pop_back();
      }
      hull.push_back(q);
    }
    path.at.bits += hull.front().scored.bits / heads;
    path.at.error += hull.front().scored.error / heads;
    path.start.push_back(hull.front().budget);
    for (std::size_t i = 1; i < hull.size() && hull[i].chosen.error < hull[i - 1].chosen.error; ++i)
      path.steps.push_back({{hull[i].chosen.bits - hull[i - 1].chosen.bits,
                             hull[i].chosen.error - hull[i - 1].chosen.error},
                            {(hull[i].scored.bits - hull[i - 1].scored.bits) / heads,
                             (hull[i].scored.error - hull[i - 1].scored.error) / heads},
                            h,
                            hull[i].budget});
  }
  // Steepest chosen error reduction per bit first; a head's own steps come in hull order, since
  // its slopes flatten along the hull (stable for equal slopes). The splits along this path are
  // the Lagrangian optima of the chosen curves.
  std::stable_sort(path.steps.begin(), path.steps.end(), [](const Step& a, const Step& b) {
    return a.chosen.error / a.chosen.bits < b.chosen.error / b.chosen.bits;
  });
  return path;
}
}  // namespace

std::optional<HeadAllocation> per_head_allocation(
    const std::vector<std::vector<QualityRow>>& choose_on,
    const std::vector<std::vector<QualityRow>>& score_on, double error, PlanRule rule, bool klt) {
  const auto split = split_path(choose_on, score_on, rule, klt);
  if (!split) return std::nullopt;
  // Each split on the path is scored; the figure is where the scored error last falls to
  // `error` (linear between two splits, which mixes them).
  std::vector<Point> path{split->at};
  Point at = split->at;
  for (const Step& g : split->steps) {
    at.bits += g.scored.bits;
    at.error += g.scored.error;
    path.push_back(at);
  }
  std::size_t last_above = path.size();
  for (std::size_t i = path.size(); i-- > 0;)
    if (path[i].error > error) {
      last_above = i;
      break;
    }
  if (last_above + 1 == path.size()) return std::nullopt;
  // The budgets of the first split past the last one above `error` (no mixing).
  const std::size_t reached = last_above == path.size() ? 0 : last_above + 1;
  std::vector<int> budgets = split->start;
  for (std::size_t k = 0; k < reached; ++k) budgets[split->steps[k].head] = split->steps[k].budget;
  HeadAllocation out;
  out.budgets = std::move(budgets);
  if (reached == 0) {
    out.bits = path.front().bits;
  } else {
    const Point& a = path[last_above];
    const Point& b = path[reached];
    out.bits = a.bits + (a.error - error) / (a.error - b.error) * (b.bits - a.bits);
  }
  return out;
}

std::map<int, std::vector<int>> per_head_splits_at_mean_budgets(
    const std::vector<std::vector<QualityRow>>& choose_on, PlanRule rule, bool klt,
    std::span<const int> means) {
  std::map<int, std::vector<int>> out;
  const auto split = split_path(choose_on, choose_on, rule, klt);
  if (!split) return out;
  const auto heads = static_cast<std::int64_t>(split->start.size());
  std::vector<int> budgets = split->start;
  std::int64_t total = 0;  // sum of the current split's budgets
  for (const int b : budgets) total += b;
  std::vector<int> sorted(means.begin(), means.end());
  std::sort(sorted.begin(), sorted.end());
  std::size_t k = 0;  // steps taken
  for (const int mean : sorted) {
    if (total > static_cast<std::int64_t>(mean) * heads) continue;  // below the path's start
    // Take steps while the split's mean budget stays at or below `mean`.
    while (k < split->steps.size()) {
      const Step& g = split->steps[k];
      const std::int64_t next = total - budgets[g.head] + g.budget;
      if (next > static_cast<std::int64_t>(mean) * heads) break;
      total = next;
      budgets[g.head] = g.budget;
      ++k;
    }
    out[mean] = budgets;
  }
  return out;
}

std::optional<double> per_head_allocation_bits(const std::vector<std::vector<QualityRow>>& per_head,
                                               double error, PlanRule rule, bool klt) {
  const auto split = per_head_allocation(per_head, per_head, error, rule, klt);
  return split ? std::optional<double>(split->bits) : std::nullopt;
}

SyntheticKeySpec study_head_spec(const SyntheticKeySpec& workload, int kv_head) {
  SyntheticKeySpec spec = workload;
  spec.seed = workload.seed + static_cast<std::uint64_t>(kv_head) * 1000003ull;
  return spec;
}

}  // namespace hisparse::fathom
