// DSA selection, one layer (kernels/indexer, kernels/topk), synthetic keys and queries:
//   dsa_indexer/heads:H/dim:D/context:N/batch:B: the indexer scoring every cached token of B
//     requests (fp8 keys + fp32 scales, N tokens each); counters: us per call, the key bytes read
//     (N x (D + 4) per request), GB/s, the fraction of the HBM copy ceiling, and the path;
//   dsa_topk/context:N/k:K/batch:B: the exact top-k over those scores; us per call.
// L2 is flushed before every timed call. The first indexer call is checked against the CPU twin
// on request 0's first 4096 scores.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/topk/topk.hpp"
#include "microbench_util.hpp"

namespace hisparse::microbench {
namespace {

struct DsaCase {
  int heads, dim;
  std::int64_t context;
  int batch, k;  ///< k 0: time the indexer, else the top-k
};

#if HISPARSE_WITH_CUDA
void run_dsa(benchmark::State& state, const DsaCase& c) {
  const auto tokens = static_cast<std::size_t>(c.batch) * static_cast<std::size_t>(c.context);
  std::vector<std::uint8_t> codes(tokens * c.dim);
  std::vector<float> scales(tokens), q(static_cast<std::size_t>(c.batch) * c.heads * c.dim),
      w(static_cast<std::size_t>(c.batch) * c.heads);
  // Codes of random keys (a 64K-token pattern repeated: the values do not change the time).
  std::vector<float> key(static_cast<std::size_t>(c.dim));
  const std::size_t pattern = std::min<std::size_t>(tokens, std::size_t{1} << 16);
  for (std::size_t t = 0; t < pattern; ++t) {
    for (int d = 0; d < c.dim; ++d)
      key[static_cast<std::size_t>(d)] = random_normal(31, t * c.dim + d);
    kernels::quantize_index_key(key.data(), c.dim, codes.data() + t * c.dim, &scales[t]);
  }
  for (std::size_t t = pattern; t < tokens; ++t) {
    std::copy_n(codes.data() + (t % pattern) * c.dim, c.dim, codes.data() + t * c.dim);
    scales[t] = scales[t % pattern];
  }
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * random_normal(32, i);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = random_normal(33, i);
  auto d_codes = device_copy(codes, "index keys");
  auto d_scales = device_copy(scales, "index key scales");
  auto d_q = device_copy(q, "index queries");
  auto d_w = device_copy(w, "head weights");
  auto d_lens = device_copy(std::vector<std::int64_t>(static_cast<std::size_t>(c.batch), c.context),
                            "lengths");
  auto d_scores = Buffer<float>::device(tokens, Backend::cuda, "scores");
  auto d_out = Buffer<std::int32_t>::device(static_cast<std::size_t>(c.batch) * std::max(c.k, 1),
                                            Backend::cuda, "selection");
  kernels::IndexerArgs a;
  a.q = d_q.device_data();
  a.weights = d_w.device_data();
  a.keys = d_codes.device_data();
  a.key_scales = d_scales.device_data();
  a.seq_lens = d_lens.device_data();
  a.scores = d_scores.device_data();
  a.batch = c.batch;
  a.heads = c.heads;
  a.dim = c.dim;
  a.capacity = c.context;
  kernels::TopkArgs tk;
  tk.scores = a.scores;
  tk.lengths = a.seq_lens;
  tk.out = d_out.device_data();
  tk.rows = c.batch;
  tk.stride = c.context;
  tk.k = c.k;

  Stream stream(Backend::cuda);
  kernels::launch_indexer(a, stream.native());
  stream.synchronize();
  {  // request 0's first 4096 scores against the twin
    const std::int64_t check = std::min<std::int64_t>(c.context, 4096);
    std::vector<float> got(static_cast<std::size_t>(check)), want(static_cast<std::size_t>(check));
    copy_bytes(got.data(), a.scores, got.size() * 4, Backend::cuda);
    kernels::IndexerArgs one = a;
    const std::int64_t len = check;
    one.q = q.data();
    one.weights = w.data();
    one.keys = codes.data();
    one.key_scales = scales.data();
    one.seq_lens = &len;
    one.scores = want.data();
    one.batch = 1;
    one.capacity = check;
    kernels::indexer_ref(one);
    if (!matches_twin(state, got, want, 1e-4, "request 0's first scores")) return;
  }
  const double per_call = time_graph_after_l2_flush(state, stream, [&](cudaStream_t s) {
    if (c.k > 0)
      kernels::launch_topk(tk, s);
    else
      kernels::launch_indexer(a, s);
  });
  state.counters["us_per_call"] = per_call * 1e6;
  if (c.k == 0) {
    const double bytes = static_cast<double>(tokens) * (c.dim + 4.0);
    const double gbps = bytes / per_call / 1e9;
    const double ceiling = hbm_copy_gbps();
    state.counters["key_MB"] = bytes / 1e6;
    state.counters["GBps"] = gbps;
    state.counters["ceiling_fraction"] = gbps / ceiling;
    state.SetLabel(fmt::format(
        "{} path, synthetic keys, ceiling {:.0f} GB/s (HBM copy)",
        kernels::indexer_uses_tensor_cores(c.heads, c.dim) ? "tensor-core" : "CUDA-core", ceiling));
  } else {
    state.SetLabel("synthetic scores");
  }
}
#endif

void bench_dsa(benchmark::State& state, [[maybe_unused]] DsaCase c) {
  guarded(state, "dsa_indexer", [&] { HISPARSE_GPU_ONLY(run_dsa(state, c)); });
}

bool register_dsa() {
  // GLM-5.1 / DeepSeek-V3.2 indexer: 32 heads x 128 (DeepSeek-V3.2: 64 heads), top-k 2048.
  for (int heads : {32, 64})
    for (std::int64_t context : {32768, 131072})
      for (int batch : {1, 8, 32})
        register_timed(
            fmt::format("dsa_indexer/heads:{}/dim:128/context:{}/batch:{}", heads, context, batch),
            bench_dsa, DsaCase{heads, 128, context, batch, 0});
  for (std::int64_t context : {32768, 131072})
    for (int batch : {1, 8, 32})
      register_timed(fmt::format("dsa_topk/context:{}/k:2048/batch:{}", context, batch), bench_dsa,
                     DsaCase{32, 128, context, batch, 2048});
  return true;
}

[[maybe_unused]] const bool registered = register_dsa();

}  // namespace
}  // namespace hisparse::microbench
