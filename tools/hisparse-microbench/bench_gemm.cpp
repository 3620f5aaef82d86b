// linear/<layer>/m:M: one bf16 linear layer of the GLM-5.1 rank (kernels/gemm: fp32 activations
// rounded to bf16, cuBLASLt, fp32 out) for M decode tokens, synthetic weights. Counters: us per
// call (the rounding kernel included, as the engine runs it), the weight bytes, GB/s and the
// fraction of the HBM copy ceiling. L2 is flushed before every timed call; the first call is
// checked against the CPU twin on row 0.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "kernels/gemm/gemm.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

struct LinearCase {
  int m, n, k;
};

#if HISPARSE_WITH_CUDA
void run_linear(benchmark::State& state, const LinearCase& c) {
  const auto wn = static_cast<std::size_t>(c.n) * static_cast<std::size_t>(c.k);
  std::vector<std::uint16_t> w(wn);
  for (std::size_t i = 0; i < wn; ++i) w[i] = float_to_bf16(0.02f * random_normal(41, i % 4099999));
  std::vector<float> x(static_cast<std::size_t>(c.m) * c.k);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = random_normal(42, i);
  auto d_w = device_copy(w, "weights");
  auto d_x = device_copy(x, "activations");
  auto d_xb = Buffer<std::uint16_t>::device(x.size(), Backend::cuda, "bf16 activations");
  auto d_y = Buffer<float>::device(static_cast<std::size_t>(c.m) * c.n, Backend::cuda, "out");
  kernels::GemmArgs a;
  a.x = d_x.device_data();
  a.w_bf16 = d_w.device_data();
  a.x_bf16 = d_xb.device_data();
  a.y = d_y.device_data();
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;
  Stream stream(Backend::cuda);
  kernels::launch_gemm(a, stream.native());
  stream.synchronize();
  {  // row 0 against the twin over the same bf16 values
    std::vector<float> got(static_cast<std::size_t>(c.n)), want(got.size()), wf(wn),
        x0(x.begin(), x.begin() + c.k);
    copy_bytes(got.data(), a.y, got.size() * 4, Backend::cuda);
    std::transform(w.begin(), w.end(), wf.begin(), bf16_to_float);
    for (float& v : x0) v = bf16_to_float(float_to_bf16(v));
    kernels::GemmArgs one;
    one.x = x0.data();
    one.w = wf.data();
    one.y = want.data();
    one.m = 1;
    one.n = c.n;
    one.k = c.k;
    kernels::gemm_ref(one);
    if (!matches_twin(state, got, want, 1e-4, "row 0")) return;
  }
  const double per_call =
      time_graph_after_l2_flush(state, stream, [&](cudaStream_t s) { kernels::launch_gemm(a, s); });
  const double bytes = 2.0 * static_cast<double>(wn);
  const double gbps = bytes / per_call / 1e9;
  const double ceiling = hbm_copy_gbps();
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["weight_MB"] = bytes / 1e6;
  state.counters["GBps"] = gbps;
  state.counters["ceiling_fraction"] = gbps / ceiling;
  state.SetLabel(
      fmt::format("cuBLASLt bf16, synthetic weights, ceiling {:.0f} GB/s (HBM copy)", ceiling));
}
#endif

void bench_linear(benchmark::State& state, [[maybe_unused]] LinearCase c) {
  guarded(state, "linear", [&] { HISPARSE_GPU_ONLY(run_linear(state, c)); });
}

bool register_linear() {
  // The GLM-5.1 rank's attention sublayer and shared expert (hidden 6144).
  const std::pair<const char*, LinearCase> layers[] = {
      {"q_a", {0, 2048, 6144}},         {"q_b", {0, 64 * 256, 2048}},
      {"kv_a", {0, 576, 6144}},         {"o_proj", {0, 6144, 64 * 256}},
      {"expert_gate", {0, 2048, 6144}}, {"expert_down", {0, 6144, 2048}}};
  for (const auto& [name, shape] : layers)
    for (int m : {1, 32})
      register_timed(fmt::format("linear/{}/m:{}", name, m), bench_linear,
                     LinearCase{m, shape.n, shape.k});
  return true;
}

[[maybe_unused]] const bool registered = register_linear();

}  // namespace
}  // namespace hisparse::microbench
