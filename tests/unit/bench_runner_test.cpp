// Runner on the CPU backend: measured steps, throughput arithmetic, admission (running vs queued).
#include <gtest/gtest.h>

#include <string>

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
  const PointMetrics m = runner.run(model, small_config(2), 1, 3, [&](int done, int total) {
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
  const PointMetrics m = runner.run(model, small_config(5), 0, 1);
  EXPECT_EQ(m.admitted, 2);
  EXPECT_EQ(m.running, 2);
  EXPECT_EQ(m.queued, 3);
  EXPECT_EQ(m.planned_gpu_bytes_per_request, per_request);
}

TEST(BenchRunner, NothingFitsIsAnError) {
  const ModelSpec model = load_model("tiny-gqa");
  const Runner runner(Backend::cpu, MemoryBudget{1.0, 0, "a one-byte budget"});
  try {
    (void)runner.run(model, small_config(1), 0, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "tiny-gqa dense at context 64");
    EXPECT_NE(e.problem().find("not one request fits"), std::string::npos) << e.what();
    EXPECT_NE(e.problem().find("a one-byte budget"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hisparse
