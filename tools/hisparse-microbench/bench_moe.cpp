// moe_experts/tokens:T/experts:E/hidden:H/width:W: one MoE layer's routed experts
// (kernels/moe, bf16 weights, the tensor-core path at these shapes) for T decode tokens, each
// routed to 8 of the E experts the rank holds (random top-8 of random router logits, the same
// every call). Counters: us per call, the weight bytes of the experts routed to (each read once:
// gate, up and down of every expert with a token), GB/s, the fraction of the HBM copy ceiling,
// and the experts routed to. L2 is flushed before every timed call. The first call is checked
// against the CPU twin on one token's output row. Synthetic weights and routing.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/moe/moe_experts.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

struct MoeCase {
  int tokens, experts, hidden, width;
};

constexpr int kActive = 8;

#if HISPARSE_WITH_CUDA
void run_moe(benchmark::State& state, const MoeCase& c) {
  const auto per_matrix = static_cast<std::size_t>(c.hidden) * static_cast<std::size_t>(c.width);
  // One bf16 matrix per expert and projection, copied from one random piece of 16 MiB at an
  // offset per matrix (the values do not change the time; generating 2.4 GB would).
  static const std::vector<std::uint16_t> piece = [] {
    std::vector<std::uint16_t> p(std::size_t{8} << 20);
    for (std::size_t j = 0; j < p.size(); ++j) p[j] = float_to_bf16(0.02f * random_normal(7, j));
    return p;
  }();
  std::vector<Buffer<std::uint16_t>> weights;
  for (int i = 0; i < 3 * c.experts; ++i) {
    auto w = Buffer<std::uint16_t>::device(per_matrix, Backend::cuda, "expert weights");
    for (std::size_t at = 0; at < per_matrix; at += piece.size() / 2) {
      const std::size_t n = std::min(piece.size() / 2, per_matrix - at);
      copy_bytes(w.device_data() + at,
                 piece.data() + (static_cast<std::size_t>(i) * 4099) % (piece.size() / 2), n * 2,
                 Backend::cuda);
    }
    weights.push_back(std::move(w));
  }
  std::vector<const void*> table;
  for (int p = 0; p < 3; ++p)
    for (int e = 0; e < c.experts; ++e)
      table.push_back(weights[static_cast<std::size_t>(3 * e + p)].device_data());
  std::vector<float> logits(static_cast<std::size_t>(c.tokens) * c.experts), route(logits.size());
  std::vector<float> h(static_cast<std::size_t>(c.tokens) * c.hidden);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = random_normal(101, i);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = random_normal(102, i);
  kernels::MoeRouteArgs r{logits.data(), route.data(), c.tokens, c.experts, kActive};
  kernels::moe_route_ref(r);
  int routed_experts = 0;
  for (int e = 0; e < c.experts; ++e) {
    bool any = false;
    for (int t = 0; t < c.tokens; ++t)
      any = any || route[static_cast<std::size_t>(t * c.experts + e)] != 0;
    routed_experts += any ? 1 : 0;
  }
  auto d_table = device_copy(table, "expert table");
  auto d_h = device_copy(h, "h");
  auto d_route = device_copy(route, "route");
  auto d_x = device_copy(std::vector<float>(h.size(), 0.0f), "x");

  kernels::MoeExpertsArgs a;
  a.h = d_h.device_data();
  a.route_weights = d_route.device_data();
  a.gate = d_table.device_data();
  a.up = a.gate + c.experts;
  a.down = a.gate + 2 * c.experts;
  a.bf16 = true;
  a.x = d_x.device_data();
  a.tokens = c.tokens;
  a.experts = c.experts;
  a.hidden = c.hidden;
  a.width = c.width;
  const std::size_t workspace_bytes = kernels::moe_experts_workspace_bytes(a);
  auto act = Buffer<float>::device(
      workspace_bytes > 0 ? 1 : static_cast<std::size_t>(c.experts) * c.tokens * c.width,
      Backend::cuda, "expert activations");
  auto workspace = Buffer<std::uint8_t>::device(std::max<std::size_t>(workspace_bytes, 1),
                                                Backend::cuda, "moe workspace");
  a.act = workspace_bytes > 0 ? nullptr : act.device_data();
  a.workspace = workspace.device_data();
  a.workspace_bytes = workspace_bytes;

  Stream stream(Backend::cuda);
  // Check: token 0's output (x starts at 0) against the twin over host copies of its experts.
  kernels::launch_moe_experts(a, stream.native());
  stream.synchronize();
  std::vector<float> got(static_cast<std::size_t>(c.hidden));
  copy_bytes(got.data(), a.x, got.size() * 4, Backend::cuda);
  {
    std::vector<std::vector<std::uint16_t>> host_w;
    std::vector<const void*> host_table(table.size(), nullptr);
    for (int e = 0; e < c.experts; ++e) {
      if (route[static_cast<std::size_t>(e)] == 0) continue;
      for (int p = 0; p < 3; ++p) {
        host_w.emplace_back(per_matrix);
        copy_bytes(host_w.back().data(), table[static_cast<std::size_t>(p * c.experts + e)],
                   per_matrix * 2, Backend::cuda);
        host_table[static_cast<std::size_t>(p * c.experts + e)] = host_w.back().data();
      }
    }
    std::vector<float> x0(got.size(), 0.0f), act0(static_cast<std::size_t>(c.experts) * c.width);
    kernels::MoeExpertsArgs one = a;
    one.h = h.data();
    one.route_weights = route.data();
    one.gate = host_table.data();
    one.up = host_table.data() + c.experts;
    one.down = host_table.data() + 2 * c.experts;
    one.act = act0.data();
    one.x = x0.data();
    one.tokens = 1;
    kernels::moe_experts_ref(one);
    // bf16 activations may round to the neighbouring value in another summation order.
    if (!matches_twin(state, got, x0, 1e-3, "token 0's output")) return;
  }
  const double per_call = time_graph_after_l2_flush(
      state, stream, [&](cudaStream_t s) { kernels::launch_moe_experts(a, s); });
  const double bytes = 3.0 * routed_experts * static_cast<double>(per_matrix) * 2.0;
  const double gbps = bytes / per_call / 1e9;
  const double ceiling = hbm_copy_gbps();
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["weight_MB"] = bytes / 1e6;
  state.counters["GBps"] = gbps;
  state.counters["ceiling_fraction"] = gbps / ceiling;
  state.counters["experts_routed"] = routed_experts;
  state.SetLabel(
      fmt::format("{} path, synthetic weights and routing (top-{}), ceiling {:.0f} GB/s "
                  "(HBM copy)",
                  workspace_bytes > 0 ? "tensor-core" : "CUDA-core", kActive, ceiling));
}
#endif

void bench_moe(benchmark::State& state, [[maybe_unused]] MoeCase c) {
  guarded(state, "moe_experts", [&] { HISPARSE_GPU_ONLY(run_moe(state, c)); });
}

bool register_moe() {
  // GLM-5.1 and DeepSeek-V3.2 ranks: 32 of 256 experts, hidden 6144 / 7168, width 2048.
  for (int hidden : {6144, 7168})
    for (int tokens : {1, 8, 32, 64})
      register_timed(
          fmt::format("moe_experts/tokens:{}/experts:32/hidden:{}/width:2048", tokens, hidden),
          bench_moe, MoeCase{tokens, 32, hidden, 2048});
  return true;
}

[[maybe_unused]] const bool registered = register_moe();

}  // namespace
}  // namespace hisparse::microbench
