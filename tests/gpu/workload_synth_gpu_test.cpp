// kernels/workload on the GPU against its CPU twins (which the unit test holds to KvWorkload):
// context rows, index keys and the query walk on both tiny models and a wide MLA-sized shape.
// Values and queries bit for bit; keys within one float rounding of their exp-based boost (the
// device's double exp may differ from the host's in the last bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "kernels/workload/workload_synth.hpp"
#include "model/kv_workload.hpp"
#include "model/model_spec.hpp"
#include "support/gpu.hpp"
#include "support/workload_tables.hpp"

namespace hisparse {
namespace {

#if HISPARSE_WITH_CUDA

template <class T>
Buffer<T> to_device(const std::vector<T>& host) {
  auto b = Buffer<T>::device(std::max<std::size_t>(host.size(), 1), Backend::cuda, "test");
  copy_bytes(b.device_data(), host.data(), host.size() * sizeof(T), Backend::cuda);
  return b;
}
template <class T>
std::vector<T> to_host(const Buffer<T>& b, std::size_t n) {
  std::vector<T> out(n);
  HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
  copy_bytes(out.data(), b.device_data(), n * sizeof(T), Backend::cuda);
  return out;
}

// Rows of one (layer, KV head) on the GPU and by the twin; returns how many keys differ by more
// than the tolerance and asserts values are identical.
void check_rows(const KvWorkload& w, int layer, bool values, bool index) {
  const test::WorkloadTables t(w, layer, 0);
  const int dim = values ? w.value_dim() : w.key_dim();
  const int out_dim = index ? w.index_dim() : dim;
  const std::int64_t first = 3, count = w.context_length() + 40;
  const std::int64_t stride = count * out_dim + 5;  // a gap between streams
  kernels::SynthRowsArgs a;
  a.seeds = values ? t.value_seeds.data() : t.key_seeds.data();
  if (!values) {
    a.scale = t.scale.data();
    a.anchor = t.anchor.data();
  }
  a.channels = index ? t.channels.data() : nullptr;
  a.boost = t.boost;
  a.streams = w.requests();
  a.dim = dim;
  a.out_dim = index ? out_dim : 0;
  a.first = first;
  a.count = count;
  a.stream_stride = stride;
  std::vector<float> want(static_cast<std::size_t>(stride * a.streams), -7.0f);
  a.out = want.data();
  kernels::synth_rows_ref(a);
  auto seeds = to_device(values ? t.value_seeds : t.key_seeds);
  auto scale = to_device(t.scale), anchor = to_device(t.anchor);
  auto channels = to_device(t.channels);
  auto out = to_device(std::vector<float>(want.size(), -7.0f));
  a.seeds = seeds.device_data();
  if (!values) {
    a.scale = scale.device_data();
    a.anchor = anchor.device_data();
  }
  if (index) a.channels = channels.device_data();
  a.out = out.device_data();
  kernels::launch_synth_rows(a, nullptr);
  const std::vector<float> got = to_host(out, want.size());
  std::int64_t off = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (values)
      off += got[i] != want[i];
    else
      off += std::fabs(got[i] - want[i]) > 1e-6f * (1.0f + std::fabs(want[i]));
  }
  EXPECT_EQ(off, 0) << (values ? "values" : index ? "index keys" : "keys") << " differ";
}

TEST(WorkloadSynthGpu, ContextRowsMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
  for (const char* name : {"tiny-gqa", "tiny-dsa", "glm-5.1-fp8-rank"}) {
    SCOPED_TRACE(name);
    const ModelSpec model = load_model(name);
    WorkloadSpec spec;
    spec.seed = 11;
    const KvWorkload w(model, spec, 3, 700);
    check_rows(w, model.layers - 1, false, false);
    if (!model.is_mla()) check_rows(w, 0, true, false);
    if (w.index_dim() > 0) check_rows(w, 0, false, true);
  }
}

TEST(WorkloadSynthGpu, QueryWalkAndIndexQueriesMatchTheTwinBitForBit) {
  HISPARSE_REQUIRE_GPU();
  for (const char* name : {"tiny-gqa", "tiny-dsa", "glm-5.1-fp8-rank"}) {
    SCOPED_TRACE(name);
    const ModelSpec model = load_model(name);
    WorkloadSpec spec;
    spec.query_drift = 0.1;
    const KvWorkload w(model, spec, 4, 32);
    const test::WorkloadTables t(w, 0, 0);
    const std::size_t n = static_cast<std::size_t>(4 * w.q_heads() * w.key_dim());
    std::vector<float> state(n), out(n);
    auto seeds = to_device(t.query_seeds);
    auto anchors = to_device(t.anchors);
    auto d_state = to_device(state), d_out = to_device(out);
    kernels::SynthQueriesArgs q = t.query_args(w, 4);
    kernels::SynthQueriesArgs dq = q;
    dq.seeds = seeds.device_data();
    dq.anchors = anchors.device_data();
    dq.state = d_state.device_data();
    dq.out = d_out.device_data();
    q.state = state.data();
    q.out = out.data();
    // Odd steps read the step from device memory (a replayed CUDA graph's way), the host's value
    // poisoned.
    auto d_step = to_device(std::vector<std::int64_t>{0});
    for (std::int64_t step = 0; step < 5; ++step) {
      q.step = dq.step = step;
      dq.step_device = nullptr;
      if (step % 2 == 1) {
        copy_bytes(d_step.device_data(), &step, sizeof(step), Backend::cuda);
        dq.step = -7;
        dq.step_device = d_step.device_data();
      }
      kernels::synth_queries_ref(q);
      kernels::launch_synth_queries(dq, nullptr);
      EXPECT_EQ(to_host(d_out, n), out) << "step " << step;
    }
    if (w.index_dim() == 0) continue;
    const std::size_t ni = static_cast<std::size_t>(4 * w.index_heads() * w.index_dim());
    std::vector<float> iq(ni);
    auto channels = to_device(t.channels);
    auto d_iq = to_device(iq);
    kernels::GatherIndexQueriesArgs g;
    g.q = out.data();
    g.channels = t.channels.data();
    g.out = iq.data();
    g.requests = 4;
    g.q_heads = w.q_heads();
    g.q_dim = w.key_dim();
    g.heads = w.index_heads();
    g.dim = w.index_dim();
    kernels::gather_index_queries_ref(g);
    g.q = d_out.device_data();
    g.channels = channels.device_data();
    g.out = d_iq.device_data();
    kernels::launch_gather_index_queries(g, nullptr);
    EXPECT_EQ(to_host(d_iq, ni), iq);
  }
}

#else
TEST(WorkloadSynthGpu, NeedsACudaBuild) {
  GTEST_SKIP() << "GPU test skipped: this build has no CUDA backend";
}
#endif

}  // namespace
}  // namespace hisparse
