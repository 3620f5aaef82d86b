// mla_decode/heads:H/top_k:K/batch:B: the sparse MLA decode attention of one layer
// (kernels/attention, the tensor-core kernel and its split merge) over the GLM-5.1 / DeepSeek-V3.2
// latent rows (bf16 1152 B: 576 = 512 latent + 64 rope, values the first 512), K rows selected per
// request at random (distinct) out of 4096, synthetic rows and queries. Counters: us per call, the
// selected rows' bytes, GB/s, useful TFLOP/s (2 x heads x K x (576 + 512) per request; the split
// operands' extra MMAs are not counted), and the roofline fraction: the larger of the bytes at the
// HBM copy ceiling and the FLOPs at the bf16 rate (790 TFLOP/s, REFERENCE.md section 4), over the
// measured time. L2 is flushed before every timed call; the first call is checked against the CPU
// twin on request 0.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/rng.hpp"
#include "kernels/attention/mla_decode_attention.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

constexpr int kQkDim = 576, kVDim = 512;
constexpr std::int64_t kRowsPerRequest = 4096;
constexpr double kBf16TflopRate = 790.0;  ///< dense bf16 GEMM, REFERENCE.md section 4

struct MlaCase {
  int heads, top_k, batch;
};

#if HISPARSE_WITH_CUDA
void run_mla(benchmark::State& state, const MlaCase& c) {
  const auto B = static_cast<std::size_t>(c.batch), K = static_cast<std::size_t>(c.top_k);
  const auto rows = B * static_cast<std::size_t>(kRowsPerRequest);
  // A 1M-value pattern repeated (odd-sized, so rows differ): the values do not change the time.
  static const std::vector<std::uint16_t> pattern = [] {
    std::vector<std::uint16_t> p(1048573);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = float_to_bf16(random_normal(51, i));
    return p;
  }();
  std::vector<std::uint16_t> kv(rows * kQkDim);
  for (std::size_t i = 0; i < kv.size(); i += pattern.size())
    std::copy_n(pattern.begin(), std::min(pattern.size(), kv.size() - i),
                kv.begin() + static_cast<std::ptrdiff_t>(i));
  std::vector<float> q(B * c.heads * kQkDim);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.05f * random_normal(52, i);
  std::vector<std::int32_t> idx(B * K);
  std::vector<std::int32_t> order(static_cast<std::size_t>(kRowsPerRequest));
  for (std::size_t b = 0; b < B; ++b) {  // K distinct rows per request, in a random order
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t i = 0; i < K; ++i)
      std::swap(order[i], order[i + random_bits(53, b * K + i) % (order.size() - i)]);
    std::copy_n(order.begin(), K, idx.begin() + static_cast<std::ptrdiff_t>(b * K));
  }
  auto d_kv = device_copy(kv, "latent rows");
  auto d_q = device_copy(q, "absorbed queries");
  auto d_idx = device_copy(idx, "selections");
  auto d_out = Buffer<float>::device(B * c.heads * kVDim, Backend::cuda, "attended latents");
  kernels::DecodeAttentionArgs a;
  a.q = d_q.device_data();
  a.k_bf16 = a.v_bf16 = d_kv.device_data();
  a.indices = d_idx.device_data();
  a.out = d_out.device_data();
  a.batch = c.batch;
  a.q_heads = c.heads;
  a.kv_heads = 1;
  a.qk_dim = kQkDim;
  a.v_dim = kVDim;
  a.capacity = kRowsPerRequest;
  a.k_row_stride = a.v_row_stride = kQkDim;
  a.top_k = c.top_k;
  a.scale = 1.0f / std::sqrt(192.0f);
  const auto plan = kernels::plan_mla_decode_attention(c.batch, c.heads, c.top_k, sm_count());
  const std::size_t floats =
      kernels::mla_decode_workspace_floats(c.batch, c.heads, kVDim, plan.splits);
  auto workspace = Buffer<float>::device(floats, Backend::cuda, "partial sums");
  Stream stream(Backend::cuda);
  auto launch = [&](cudaStream_t s) {
    kernels::launch_mla_decode_attention(a, plan, workspace.device_data(), floats, s);
  };
  launch(stream.native());
  stream.synchronize();
  {  // request 0 against the twin
    std::vector<float> got(static_cast<std::size_t>(c.heads) * kVDim), want(got.size());
    copy_bytes(got.data(), a.out, got.size() * 4, Backend::cuda);
    kernels::DecodeAttentionArgs one = a;
    one.q = q.data();
    one.k_bf16 = one.v_bf16 = kv.data();
    one.indices = idx.data();
    one.out = want.data();
    one.batch = 1;
    kernels::decode_attention_ref(one);
    if (!matches_twin(state, got, want, 1e-4, "request 0's outputs")) return;
  }
  const double per_call = time_graph_after_l2_flush(state, stream, launch);
  const double bytes = static_cast<double>(B * K) * kQkDim * 2.0;
  const double flops = 2.0 * static_cast<double>(B * K) * c.heads * (kQkDim + kVDim);
  const double ceiling = hbm_copy_gbps();
  const double roofline = std::max(bytes / (ceiling * 1e9), flops / (kBf16TflopRate * 1e12));
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["rows_MB"] = bytes / 1e6;
  state.counters["GBps"] = bytes / per_call / 1e9;
  state.counters["TFLOPs"] = flops / per_call / 1e12;
  state.counters["roofline_fraction"] = roofline / per_call;
  state.SetLabel(
      fmt::format("{} splits of {} rows, synthetic rows, roofline {} ({:.0f} GB/s HBM "
                  "copy, {:.0f} TFLOP/s bf16)",
                  plan.splits, plan.rows_per_split,
                  bytes / (ceiling * 1e9) >= flops / (kBf16TflopRate * 1e12) ? "bytes" : "FLOPs",
                  ceiling, kBf16TflopRate));
}
#endif

void bench_mla(benchmark::State& state, [[maybe_unused]] MlaCase c) {
  guarded(state, "mla_decode", [&] { HISPARSE_GPU_ONLY(run_mla(state, c)); });
}

bool register_mla() {
  // GLM-5.1 (64 heads on a rank) and DeepSeek-V3.2 (128), top-k 2048.
  for (int heads : {64, 128})
    for (int batch : {1, 8, 32, 64, 128})
      register_timed(fmt::format("mla_decode/heads:{}/top_k:2048/batch:{}", heads, batch),
                     bench_mla, MlaCase{heads, 2048, batch});
  return true;
}

[[maybe_unused]] const bool registered = register_mla();

}  // namespace
}  // namespace hisparse::microbench
