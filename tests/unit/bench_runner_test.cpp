// Runner on the CPU backend: measured steps, throughput arithmetic, admission (running vs queued).
#include <gtest/gtest.h>

#include <string>

#include "bench/result_set.hpp"
#include "bench/runner.hpp"
#include "core/error.hpp"
#include "model/capacity_model.hpp"
#include "model/model_spec.hpp"

namespace hisparse {
namespace {

EngineConfig small_config(int concurrency) {
  EngineConfig c;
  c.mode = Mode::dense;
  c.concurrency = concurrency;
  c.context_length = 64;
  c.top_k = 16;
  c.hot_buffer = 32;
  return c;
}

TEST(BenchRunner, MeasuresDecodeStepsAfterWarmup) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  int calls = 0;
  const PointMetrics m = runner.run(model, small_config(2), {1, 3}, [&](int done, int total) {
    ++calls;
    EXPECT_EQ(total, 4);
    EXPECT_EQ(done, calls);
  });
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(m.step_ms.count, 3u);
  EXPECT_EQ(m.requested, 2);
  EXPECT_EQ(m.running, 2);
  EXPECT_EQ(m.queued, 0);
  EXPECT_GT(m.step_ms.median, 0.0);
  EXPECT_DOUBLE_EQ(m.tpot_ms, m.step_ms.median);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 2 / (m.step_ms.median * 1e-3));
  EXPECT_TRUE(m.phase_ms.count("attention")) << "phases from StepStats";
  EXPECT_DOUBLE_EQ(m.hit_rate, -1.0);  // dense: no hot buffer
  EXPECT_NE(m.timing.find("not GPU figures"), std::string::npos);
}

TEST(BenchRunner, AdmitsWhatFitsAndQueuesTheRest) {
  const ModelSpec model = load_model("tiny-gqa");
  const CapacityModel capacity(model);
  CapacityQuery q;
  q.context_length = 64;
  q.top_k = 16;
  q.hot_buffer = 32;
  const auto per_request = capacity.footprint(Mode::dense, q).gpu_bytes;
  // Room for exactly two requests (and a half) besides weights and the activation reserve.
  const double budget = static_cast<double>(capacity.weight_bytes()) + q.activation_reserve_bytes +
                        2.5 * static_cast<double>(per_request);
  const Runner runner(Backend::cpu, MemoryBudget{budget, 0, "test budget"});
  const PointMetrics m = runner.run(model, small_config(5), {0, 1});
  EXPECT_EQ(m.admitted, 2);
  EXPECT_EQ(m.running, 2);
  EXPECT_EQ(m.queued, 3);
  EXPECT_EQ(m.planned_gpu_bytes_per_request, per_request);
}

// The Error a run that cannot admit one request throws; a test failure when it throws none.
Error admission_error(const Runner& runner, const ModelSpec& model, const EngineConfig& config) {
  try {
    (void)runner.run(model, config, {0, 1});
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error("", "");
}

EngineConfig small_hisparse_config() {
  EngineConfig c = small_config(1);
  c.mode = Mode::hisparse;
  return c;
}

TEST(BenchRunner, NothingFitsIsAnError) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1.0, 0, "a one-byte budget"});
  const Error e = admission_error(runner, model, small_config(1));
  EXPECT_EQ(e.where(), "tiny-gqa dense at context 64");
  EXPECT_NE(e.problem().find("not one request fits"), std::string::npos) << e.what();
  EXPECT_NE(e.problem().find("a one-byte budget"), std::string::npos) << e.what();
  EXPECT_EQ(e.fix(),
            "even a one-token request does not fit beside the weights and the activation "
            "reserve; use a device with more memory, a smaller model, or a smaller hot_buffer "
            "or top_k");
}

TEST(BenchRunner, NothingFitsNamesTheLongestContextThatDoes) {
  // tiny-gqa dense holds 512 B per token (2 layers of 256-B rows): room for 40 of the 64 tokens.
  const ModelSpec model = load_model("tiny-gqa");
  const CapacityModel capacity(model);
  const double budget = static_cast<double>(capacity.weight_bytes()) +
                        CapacityQuery{}.activation_reserve_bytes + 512.0 * 40;
  const Runner runner(Backend::cpu, MemoryBudget{budget, 0, "test budget"});
  const Error dense = admission_error(runner, model, small_config(1));
  EXPECT_EQ(dense.problem(),
            "not one request fits: 32.00 KiB per request and 3.13 MiB of weights against test "
            "budget");
  // On the CPU backend hisparse would not help: its host rows share the same RAM.
  EXPECT_EQ(dense.fix(),
            "lower context_length to 40 or less (the longest at which one dense request fits)");
  // hisparse on the CPU backend counts its host rows too: 256 B of keys + 512 B of rows per
  // token, 16,896 B of hot buffer (33 slots x 256 B x 2 layers) and 512 + 8 ceil(L / 32) B of
  // tables, so 768 L + 8 ceil(L / 32) <= 3,072: L = 3.
  const Error hisparse = admission_error(runner, model, small_hisparse_config());
  EXPECT_NE(hisparse.problem().find("(its GPU and host bytes, both in RAM on the CPU backend)"),
            std::string::npos)
      << hisparse.what();
  EXPECT_EQ(hisparse.fix(),
            "lower context_length to 3 or less (the longest at which one hisparse request fits)");
}

TEST(BenchRunner, NothingFitsNamesTheHostBudgetWhenThatIsWhatBinds) {
  // A pinned host budget of 1000 B holds the host rows (512 B per token) of one token only.
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 1000, "test budget"});
  const Error e = admission_error(runner, model, small_hisparse_config());
  EXPECT_EQ(e.problem(),
            "not one request fits: 32.00 KiB per request in host memory against a host budget "
            "of 1000 B");
  EXPECT_EQ(e.fix(),
            "lower context_length to 1 or less (the longest at which one hisparse request fits)");
}

EngineConfig hisparse_config(const std::string& policy, int hot) {
  EngineConfig c;
  c.mode = Mode::hisparse;
  c.concurrency = 2;
  c.context_length = 160;
  c.top_k = 16;
  c.hot_buffer = hot;
  c.policy = policy;
  return c;
}

TEST(BenchRunner, LruPolicyReproducesTheMeasuredMissRate) {
  const ModelSpec model = load_model("tiny-dsa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  // No warm-up: the measured steps are exactly the steps the traces cover.
  const PointMetrics m = runner.run(model, hisparse_config("lru", 24), {0, 4});
  ASSERT_GT(m.misses, 0);
  EXPECT_EQ(m.policy, "lru");
  EXPECT_EQ(m.policy_steps, 4);
  EXPECT_EQ(m.policy_miss_rate,
            static_cast<double>(m.misses) / static_cast<double>(m.hits + m.misses));
  EXPECT_DOUBLE_EQ(m.hit_rate, 1.0 - m.policy_miss_rate);
  EXPECT_GE(m.optimal_miss_rate, 0.0);
  EXPECT_LE(m.optimal_miss_rate, m.policy_miss_rate);
  EXPECT_GT(m.bytes_h2d_per_step, 0.0);
  EXPECT_GT(m.bytes_scanned_per_step, 0.0);  // the indexer's keys
  EXPECT_GT(m.selection_recall, 0.0);
  EXPECT_LE(m.selection_recall, 1.0);
  EXPECT_GT(m.attention_rel_error, 0.0);
  EXPECT_TRUE(m.phase_ms.count("swap_in"));
}

TEST(BenchRunner, PolicyAnalysisCoversWarmupAndNamesThePolicy) {
  const ModelSpec model = load_model("tiny-dsa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  const PointMetrics belady = runner.run(model, hisparse_config("belady", 24), {1, 3});
  EXPECT_EQ(belady.policy, "belady");
  EXPECT_EQ(belady.policy_steps, 4);
  EXPECT_EQ(belady.policy_miss_rate, belady.optimal_miss_rate);
  const PointMetrics fifo = runner.run(model, hisparse_config("fifo", 24), {1, 3});
  EXPECT_EQ(fifo.policy, "fifo");
  EXPECT_EQ(fifo.optimal_miss_rate, belady.optimal_miss_rate);  // same traces
  EXPECT_GE(fifo.policy_miss_rate, fifo.optimal_miss_rate);
  EXPECT_EQ(fifo.hits, belady.hits);  // the engine itself always runs the swap-in's LRU
}

TEST(BenchRunner, UnmeasuredFieldsAreNullInTheJson) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  const nlohmann::json dense = runner.run(model, small_config(1), {0, 1});
  for (const char* key : {"selection_recall", "attention_rel_error", "policy", "policy_miss_rate",
                          "optimal_miss_rate", "hit_rate"})
    EXPECT_TRUE(dense.at(key).is_null()) << key;
  EXPECT_EQ(dense.at("policy_steps"), 0);
  EngineConfig c = small_config(1);
  c.mode = Mode::sparse_gpu;
  const nlohmann::json sparse = runner.run(model, c, {0, 2});
  EXPECT_GT(sparse.at("selection_recall").get<double>(), 0.0);
  EXPECT_GE(sparse.at("attention_rel_error").get<double>(), 0.0);
  EXPECT_TRUE(sparse.at("policy_miss_rate").is_null());
}

TEST(BenchRunner, RepetitionsPoolTheirStepsAndRecordEachRunsThroughput) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  int calls = 0, last_total = 0;
  const PointMetrics m = runner.run(model, small_config(2), {1, 3, 4}, [&](int done, int total) {
    EXPECT_EQ(done, ++calls);  // progress counts the steps of every repetition
    last_total = total;
  });
  EXPECT_EQ(calls, 16);
  EXPECT_EQ(last_total, 16);
  EXPECT_EQ(m.repetitions, 4);
  EXPECT_EQ(m.step_ms.count, 12u);  // 4 x 3 measured steps
  ASSERT_EQ(m.repetition_tokens_per_s.size(), 4u);
  ASSERT_EQ(m.repetition_step_ms_median.size(), 4u);
  for (std::size_t r = 0; r < 4; ++r)
    EXPECT_DOUBLE_EQ(m.repetition_tokens_per_s[r], 2 / (m.repetition_step_ms_median[r] * 1e-3));
  // The deterministic metrics are the first repetition's, checked equal in the others: the same
  // as one run of the point.
  const PointMetrics once = runner.run(model, small_config(2), {1, 3});
  EXPECT_EQ(m.next_tokens_digest, once.next_tokens_digest);
  EXPECT_EQ(m.next_tokens_digest.size(), 16u);
  EXPECT_EQ(m.hits, once.hits);
  const nlohmann::json j = m;
  EXPECT_EQ(j["repetitions"]["count"], 4);
  EXPECT_EQ(j["repetitions"]["output_tokens_per_s"].size(), 4u);
  EXPECT_FALSE(nlohmann::json(once).contains("repetitions"));
}

TEST(BenchRunner, APointPastItsTimeLimitFailsNamingTheKey) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  PointPlan plan{0, 50};
  plan.time_limit_s = 1e-9;  // past after the first step
  try {
    (void)runner.run(model, small_config(1), plan);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "tiny-gqa dense at context 64");
    EXPECT_EQ(e.problem().rfind("the point ran past point_time_limit_s (1e-09 s): ", 0), 0u)
        << e.what();
    EXPECT_NE(e.problem().find(" after 1 of its 50 steps"), std::string::npos) << e.what();
    EXPECT_EQ(e.fix(),
              "raise point_time_limit_s, or lower decode_steps, repetitions or the point's size");
  }
  plan.time_limit_s = 600;
  EXPECT_EQ(runner.run(model, small_config(1), plan).step_ms.count, 50u);
}

}  // namespace
}  // namespace hisparse
