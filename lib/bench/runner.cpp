#include "bench/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "hotcache/policy_study.hpp"
#include "model/capacity_model.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {

MemoryBudget memory_budget_of(const DeviceProperties& device) {
  MemoryBudget b;
  b.bytes = static_cast<double>(device.total_memory);
  // On a GPU the host pool is pinned host memory: admission leaves a quarter of the RAM to the
  // process, the weights it synthesises and the system.
  if (device.backend == Backend::cuda)
    b.host_bytes = 0.75 * static_cast<double>(Device::cpu().properties().total_memory);
  b.source =
      device.backend == Backend::cuda
          ? fmt::format("device memory of {} ({})", device.name, format_bytes(device.total_memory))
          : fmt::format("host RAM ({}), CPU backend", format_bytes(device.total_memory));
  return b;
}

Error Runner::nothing_fits(const CapacityModel& capacity, Mode mode, const CapacityQuery& q,
                           const RequestFootprint& footprint, const std::string& model) const {
  const std::string where =
      fmt::format("{} {} at context {}", model, name_of(mode), q.context_length);
  const std::int64_t longest = capacity.longest_context(mode, q);
  const bool by_host =
      q.host_mem_bytes > 0 && static_cast<double>(footprint.host_bytes) > q.host_mem_bytes;
  const std::string problem =
      by_host ? fmt::format(
                    "not one request fits: {} per request in host memory against a "
                    "host budget of {}",
                    format_bytes(footprint.host_bytes),
                    format_bytes(static_cast<std::size_t>(q.host_mem_bytes)))
              : fmt::format("not one request fits: {} per request{} and {} of weights against {}",
                            format_bytes(budgeted_bytes(footprint, q)),
                            q.one_memory && footprint.host_bytes > 0
                                ? " (its GPU and host bytes, both in RAM on the CPU backend)"
                                : "",
                            format_bytes(capacity.weight_bytes()), budget_.source);
  if (longest == 0)
    return Error(where, problem,
                 "even a one-token request does not fit beside the weights and the activation "
                 "reserve; use a device with more memory, a smaller model, or a smaller "
                 "hot_buffer or top_k");
  // The modes that keep the rows on the GPU can name the one that does not (on a GPU).
  const bool rows_on_gpu = (mode == Mode::dense || mode == Mode::sparse_gpu) && !q.one_memory;
  return Error(
      where, problem,
      fmt::format("lower context_length to {} or less (the longest at which one {} "
                  "request fits){}",
                  longest, name_of(mode),
                  rows_on_gpu ? ", or use hisparse, which keeps the rows in host memory" : ""));
}

struct Runner::Measured {
  PointMetrics metrics;
  std::vector<double> step_ms;
  std::map<std::string, std::vector<double>> phases;
};

namespace {

/// FNV-1a over the tokens' bytes, continued from `hash`.
std::uint64_t fnv1a(std::uint64_t hash, const std::vector<std::int32_t>& tokens) {
  for (const std::int32_t t : tokens)
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (static_cast<std::uint32_t>(t) >> (8 * byte)) & 0xffu;
      hash *= 0x100000001b3ull;
    }
  return hash;
}

/// Step times and phases over the samples, and the figures derived from them.
void set_timings(PointMetrics& m, const std::vector<double>& step_ms,
                 std::map<std::string, std::vector<double>> phases) {
  m.step_ms = summarize(step_ms);
  m.tpot_ms = m.step_ms.median;
  m.output_tokens_per_s = m.step_ms.median > 0 ? m.running / (m.step_ms.median * 1e-3) : 0.0;
  m.phase_ms.clear();
  for (auto& [phase, v] : phases) m.phase_ms[phase] = percentile(std::move(v), 50);
}

/// The first deterministic metric in which `again` differs from `first`, as "name (a vs b)".
std::string deterministic_difference(const PointMetrics& first, const PointMetrics& again) {
  const std::pair<const char*, std::pair<double, double>> numbers[] = {
      {"hits", {static_cast<double>(first.hits), static_cast<double>(again.hits)}},
      {"misses", {static_cast<double>(first.misses), static_cast<double>(again.misses)}},
      {"bytes_h2d_per_step", {first.bytes_h2d_per_step, again.bytes_h2d_per_step}},
      {"bytes_scanned_per_step", {first.bytes_scanned_per_step, again.bytes_scanned_per_step}},
      {"bits_per_token", {first.bits_per_token, again.bits_per_token}},
      {"selection_recall", {first.selection_recall, again.selection_recall}},
      {"attention_rel_error", {first.attention_rel_error, again.attention_rel_error}}};
  for (const auto& [name, values] : numbers)
    if (values.first != values.second)
      return fmt::format("{} ({} vs {})", name, values.first, values.second);
  if (first.next_tokens_digest != again.next_tokens_digest)
    return fmt::format("next_tokens_digest ({} vs {})", first.next_tokens_digest,
                       again.next_tokens_digest);
  return "";
}

}  // namespace

PointMetrics Runner::run(const ModelSpec& model, EngineConfig config, const PointPlan& plan,
                         const Progress& progress, const Inspect& inspect) const {
  HISPARSE_FUNC_RANGE();
  const int repetitions = std::max(plan.repetitions, 1);
  const int warmup_steps = plan.warmup_steps, decode_steps = plan.decode_steps;
  const int per_repetition = warmup_steps + decode_steps;
  const auto started = std::chrono::steady_clock::now();
  PointMetrics m;
  std::vector<double> step_ms;
  std::map<std::string, std::vector<double>> phases;
  for (int r = 0; r < repetitions; ++r) {
    const Progress counted = [&](int done, int) {
      const int all_done = r * per_repetition + done, all = repetitions * per_repetition;
      if (plan.time_limit_s > 0 && all_done < all) {
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        if (elapsed > plan.time_limit_s)
          throw Error(fmt::format("{} {} at context {}", model.name, name_of(config.mode),
                                  config.context_length),
                      fmt::format("the point ran past point_time_limit_s ({:g} s): {:.1f} s after "
                                  "{} of its {} steps",
                                  plan.time_limit_s, elapsed, all_done, all),
                      "raise point_time_limit_s, or lower decode_steps, repetitions or the "
                      "point's size");
      }
      if (progress) progress(all_done, all);
    };
    Measured once;
    try {
      once = run_once(model, config, warmup_steps, decode_steps, r == 0 ? plan.verify_every : 0,
                      counted, r + 1 == repetitions ? inspect : Inspect{});
    } catch (const OutOfMemoryError& e) {
      throw out_of_memory(e, model, config);
    } catch (const std::bad_alloc&) {  // a container of the engine, not one of its buffers
      throw Error(fmt::format("{} {} at context {}", model.name, name_of(config.mode),
                              config.context_length),
                  "ran out of host memory (std::bad_alloc)",
                  "lower concurrency or context_length, or free host memory on this node");
    }
    if (r == 0) {
      m = once.metrics;
    } else if (const std::string d = deterministic_difference(m, once.metrics); !d.empty()) {
      throw Error(fmt::format("{} {} at context {}", model.name, name_of(config.mode),
                              config.context_length),
                  fmt::format("repetition {} differs from the first in {}, though the seed is "
                              "the same",
                              r + 1, d),
                  "run with repetitions: 1 and report the scenario: the engine must decode the "
                  "same for a seed");
    }
    m.repetition_tokens_per_s.push_back(once.metrics.output_tokens_per_s);
    m.repetition_step_ms_median.push_back(once.metrics.step_ms.median);
    step_ms.insert(step_ms.end(), once.step_ms.begin(), once.step_ms.end());
    for (auto& [phase, v] : once.phases)
      phases[phase].insert(phases[phase].end(), v.begin(), v.end());
  }
  m.repetitions = repetitions;
  set_timings(m, step_ms, std::move(phases));
  return m;
}

CapacityQuery Runner::query_of(const EngineConfig& config) const {
  CapacityQuery q;
  q.context_length = config.context_length;
  q.top_k = config.top_k;
  q.hot_buffer = config.hot_buffer;
  q.budget_bits = config.budget_bits;
  q.gpu_mem_bytes = budget_.bytes;
  q.host_mem_bytes = budget_.host_bytes;
  q.one_memory = backend_ == Backend::cpu;
  return q;
}

std::int64_t Runner::admitted_requests(const CapacityModel& capacity, Mode mode,
                                       const CapacityQuery& q, std::int64_t requested) {
  for (const auto& row : capacity.plan(q))
    if (row.footprint.mode == mode) return row.max_concurrency;
  return requested;  // a mode the planner has no row for is not limited by it
}

Error Runner::out_of_memory(const OutOfMemoryError& e, const ModelSpec& model,
                            const EngineConfig& config) const {
  const std::string where =
      fmt::format("{} {} at context {}", model.name, name_of(config.mode), config.context_length);
  const std::string problem = fmt::format("{}: {}", e.where(), e.problem());
  // What is free now that the point's engine is gone is what a smaller point could use.
  const bool gpu = e.kind() == MemoryKind::device && backend_ == Backend::cuda;
  const std::size_t free =
      Device::for_backend(gpu ? Backend::cuda : Backend::cpu).properties().free_memory;
  CapacityQuery q = query_of(config);
  const CapacityModel capacity(model);
  const auto running = std::min<std::int64_t>(
      config.concurrency, admitted_requests(capacity, config.mode, q, config.concurrency));
  if (e.kind() == MemoryKind::pinned && !q.one_memory)
    q.host_mem_bytes = static_cast<double>(free);
  else
    q.gpu_mem_bytes = std::min(q.gpu_mem_bytes, static_cast<double>(free));
  const std::int64_t fits = admitted_requests(capacity, config.mode, q, config.concurrency);
  const std::string memory = fmt::format("the {} of {} memory free", format_bytes(free),
                                         gpu                              ? "GPU"
                                         : e.kind() == MemoryKind::pinned ? "pinnable host"
                                                                          : "host");
  if (fits >= running)
    return Error(where, problem,
                 fmt::format("the capacity model fits {} such requests in {}, so something else "
                             "holds the memory (another process on this node?): free it, or "
                             "lower concurrency",
                             fits, memory));
  const std::int64_t longest =
      capacity.longest_context(config.mode, q, std::max<std::int64_t>(running, 1));
  if (fits < 1 && longest < 1)
    return Error(where, problem,
                 fmt::format("not one request fits in {}: use a device with more memory, a "
                             "smaller model, or a smaller hot_buffer or top_k",
                             memory));
  std::string fix = fits >= 1 ? fmt::format("set concurrency to {} or less", fits) : "";
  if (longest >= 1)
    fix += fmt::format("{}set context_length to {} or less at concurrency {}",
                       fix.empty() ? "" : ", or ", longest, running);
  return Error(where, problem, fmt::format("{}: what fits in {}", fix, memory));
}

Runner::Measured Runner::run_once(const ModelSpec& model, EngineConfig config, int warmup_steps,
                                  int decode_steps, int verify_every, const Progress& progress,
                                  const Inspect& inspect) const {
  Measured measured;
  PointMetrics& m = measured.metrics;
  m.requested = config.concurrency;
  config.backend = backend_;

  // Admission: a serving system runs what fits and queues the rest.
  const CapacityQuery q = query_of(config);
  const CapacityModel capacity(model);
  const RequestFootprint footprint = capacity.footprint(config.mode, q);
  m.planned_gpu_bytes_per_request = footprint.gpu_bytes;
  m.planned_host_bytes_per_request = footprint.host_bytes;
  m.admitted = admitted_requests(capacity, config.mode, q, config.concurrency);
  m.running = static_cast<int>(std::min<std::int64_t>(config.concurrency, m.admitted));
  m.queued = m.requested - m.running;
  if (m.running < 1) throw nothing_fits(capacity, config.mode, q, footprint, model.name);
  config.concurrency = m.running;
  const int total = warmup_steps + decode_steps;
  config.max_decode_steps = std::max(config.max_decode_steps, total);

  if (verify_every > 0) config = PipelineVerifier::checked(config);
  DecodeEngine engine(model, config);
  std::unique_ptr<PipelineVerifier> verifier;
  if (verify_every > 0) verifier = std::make_unique<PipelineVerifier>(model, config, verify_every);
  m.gpu_bytes_per_request = engine.gpu_bytes_per_request();
  m.workload_notes = engine.workload_notes();
  if (config.share_layer_weights)
    m.workload_notes.push_back(fmt::format(
        "weights shared across layers (deployment.share_layer_weights): layer 0's synthetic "
        "tensors serve every dense layer{}; each layer still reads its full weight bytes",
        model.ffn.kind == FfnKind::moe
            ? fmt::format(" and layer {}'s every MoE layer", model.ffn.first_dense_layers)
            : ""));
  const bool wall_clock = backend_ == Backend::cpu;
  m.timing = wall_clock ? "cpu wall clock per step (CPU backend, not GPU figures)"
                        : "cuda events per step (DecodeEngine StepStats)";
  if (verifier) m.timing += ", with --verify's non-finite checks";
  std::vector<double>& step_ms = measured.step_ms;
  std::vector<double> recalls, errors;
  std::map<std::string, std::vector<double>>& phases = measured.phases;
  std::uint64_t tokens_hash = 0xcbf29ce484222325ull;  // FNV-1a offset basis
  double h2d = 0, scanned = 0, plan_bits = 0;
  std::int64_t plans = 0, active_channels = 0;
  int graph_steps = 0;  // measured steps that replayed the CUDA engine's graph
  for (int s = 0; s < total; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepStats st = engine.step();
    const auto t1 = std::chrono::steady_clock::now();
    if (verifier) verifier->after_step(s, engine, st);
    if (s >= warmup_steps) {
      // The quality measurement (a dense pass on sampled layers) is not part of the step.
      step_ms.push_back(wall_clock ? std::chrono::duration<double, std::milli>(t1 - t0).count() -
                                         st.quality_ms
                                   : st.step_ms);
      if (st.recall >= 0) recalls.push_back(st.recall);
      if (st.attention_rel_error >= 0) errors.push_back(st.attention_rel_error);
      for (const auto& [phase, ms] : st.phase_ms) phases[phase].push_back(ms);
      m.hits += st.hits;
      m.misses += st.misses;
      h2d += static_cast<double>(st.bytes_h2d);
      scanned += static_cast<double>(st.bytes_scanned);
      plans += st.plans;
      plan_bits += st.plan_bits;
      active_channels += st.plan_active_channels;
      tokens_hash = fnv1a(tokens_hash, st.next_tokens);
      graph_steps += st.graph_replay ? 1 : 0;
    }
    if (progress) progress(s + 1, total);
  }
  if (graph_steps > 0)
    m.timing += fmt::format(", {} of {} measured steps replayed a CUDA graph of the whole step",
                            graph_steps, decode_steps);
  set_timings(m, step_ms, phases);
  m.next_tokens_digest = fmt::format("{:016x}", tokens_hash);
  if (m.hits + m.misses > 0)
    m.hit_rate = static_cast<double>(m.hits) / static_cast<double>(m.hits + m.misses);
  m.bytes_h2d_per_step = decode_steps > 0 ? h2d / decode_steps : 0;
  m.bytes_scanned_per_step = decode_steps > 0 ? scanned / decode_steps : 0;
  if (plans > 0) {
    m.bits_per_token = plan_bits / static_cast<double>(plans);
    m.bytes_per_token = m.bits_per_token / 8.0;
    m.active_channels = static_cast<double>(active_channels) / static_cast<double>(plans);
  }
  if (!recalls.empty()) m.selection_recall = percentile(recalls, 50);
  if (!errors.empty()) m.attention_rel_error = percentile(errors, 50);
  if (verifier) m.verify = verifier->report();
  analyse_policy(engine, config, m);
  m.policy_steps = engine.hot_slots() > 0 ? total : 0;
  if (inspect) inspect(engine);
  return measured;
}

void analyse_policy(const DecodeEngine& engine, const EngineConfig& config, PointMetrics& m) {
  if (engine.hot_slots() < 1) return;
  std::vector<NamedTrace> streams;
  for (auto& trace : engine.selection_traces()) streams.push_back({{}, std::move(trace)});
  if (streams.empty()) return;
  HISPARSE_RANGE("policy_analysis", Phase::other);
  const ReplacementPolicy policy = parse_policy(config.policy, "policy");
  PolicyStudyOptions options;
  options.hots = {engine.hot_slots()};
  options.policies = {policy};
  if (policy != ReplacementPolicy::belady) options.policies.push_back(ReplacementPolicy::belady);
  options.seed = config.workload.seed;
  const PolicyStudy study = study_policies(streams, options);
  m.policy = std::string(name_of(policy));
  m.policy_miss_rate = study.cells.front().total.miss_rate();
  m.optimal_miss_rate = study.cells.back().total.miss_rate();
}

namespace {
// -1 marks "not measured": null in the JSON.
nlohmann::json or_null(double v) {
  return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v);
}
}  // namespace

void to_json(nlohmann::json& j, const PointMetrics& m) {
  j = nlohmann::json{
      {"output_tokens_per_s", m.output_tokens_per_s},
      {"step_ms", m.step_ms},
      {"tpot_ms", m.tpot_ms},
      {"timing", m.timing},
      {"requested_requests", m.requested},
      {"running_requests", m.running},
      {"queued_requests", m.queued},
      {"admitted_requests", m.admitted},
      {"phase_ms", m.phase_ms},
      {"hits", m.hits},
      {"misses", m.misses},
      {"hit_rate", m.hit_rate < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.hit_rate)},
      {"bytes_h2d_per_step", m.bytes_h2d_per_step},
      {"bytes_scanned_per_step", m.bytes_scanned_per_step},
      {"bits_per_token", or_null(m.bits_per_token)},
      {"bytes_per_token", or_null(m.bytes_per_token)},
      {"active_channels", or_null(m.active_channels)},
      {"selection_recall", or_null(m.selection_recall)},
      {"attention_rel_error", or_null(m.attention_rel_error)},
      {"policy", m.policy.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.policy)},
      {"policy_miss_rate", or_null(m.policy_miss_rate)},
      {"optimal_miss_rate", or_null(m.optimal_miss_rate)},
      {"policy_steps", m.policy_steps},
      {"gpu_bytes_per_request", m.gpu_bytes_per_request},
      {"planned_gpu_bytes_per_request", m.planned_gpu_bytes_per_request},
      {"planned_host_bytes_per_request", m.planned_host_bytes_per_request},
      {"workload_notes", m.workload_notes},
      {"next_tokens_digest", m.next_tokens_digest}};
  if (m.verify) j["verify"] = *m.verify;
  if (m.repetitions > 1)
    j["repetitions"] = {{"count", m.repetitions},
                        {"output_tokens_per_s", m.repetition_tokens_per_s},
                        {"step_ms.median", m.repetition_step_ms_median}};
}

}  // namespace hisparse
