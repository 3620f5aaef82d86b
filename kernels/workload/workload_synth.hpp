// The synthetic workload's values made where they are used: the context's KV rows and index keys,
// and each step's queries, as pure functions of counter-based random streams (core/rng.hpp), so a
// GPU fills a 128K-token context in milliseconds and every value equals KvWorkload's on the host
// (model/kv_workload.hpp describes the generator). The formulas live here once: KvWorkload calls
// the same HISPARSE_HD helpers, the kernels evaluate them with contraction-free arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/config.hpp"
#include "core/dtypes.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"

namespace hisparse::kernels {

/// a * b and a + b rounded once each: no fused multiply-add, so host and device agree bitwise.
HISPARSE_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
HISPARSE_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// How strongly token `token` leans towards the anchor direction: sinks by 8 units, recent tokens
/// by recency_bias x 3 units x exp(-age / 64), age counted back from the end of the context.
struct KeyBoost {
  float unit = 0.0f;  ///< sigma / c_q: a boost of one unit adds about one sigma to the logit
  int sink_tokens = 0;
  double recency_bias = 0.0;
  std::int64_t context = 0;
};
HISPARSE_HD float key_boost(const KeyBoost& b, std::int64_t token) {
  constexpr float kSinkSigmas = 8.0f;
  constexpr float kRecencySigmas = 3.0f;
  constexpr double kRecencyTokens = 64.0;
  if (token < b.sink_tokens) return kSinkSigmas * b.unit;
  const double age = fmax(0.0, static_cast<double>(b.context - 1 - token));
  return static_cast<float>(b.recency_bias * kRecencySigmas * b.unit * exp(-age / kRecencyTokens));
}

/// Channel j of token t's key: D[j] z + boost(t) a[j], z the stream's normal number t * dim + j.
HISPARSE_HD float synthetic_key(std::uint64_t seed, std::int64_t t, int j, int dim, float scale,
                                float anchor, float boost) {
  const float z =
      random_normal(seed, static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(dim) +
                              static_cast<std::uint64_t>(j));
  return add_rn(mul_rn(scale, z), mul_rn(boost, anchor));
}

/// Rows of tokens [first, first + count) for `streams` streams of one (layer, KV head): stream s,
/// token t, output channel c at out + s * stream_stride + (t - first) * row_stride + c.
/// Keys (scale and anchor set): channel channels[c] (or c) of the synthetic key. Values (scale
/// null): the stream's plain normal numbers, `dim` per token.
struct SynthRowsArgs {
  const std::uint64_t* seeds = nullptr;    ///< [streams]: KvWorkload::key_seed / value_seed
  const float* scale = nullptr;            ///< [dim] D, or null for values
  const float* anchor = nullptr;           ///< [dim] a (keys)
  const std::int32_t* channels = nullptr;  ///< [out_dim] channels picked (index keys), or null
  KeyBoost boost;
  float* out = nullptr;
  std::uint16_t* out_bf16 = nullptr;  ///< instead of out: each value rounded to bf16 (the caches)
  int streams = 0;
  int dim = 0;      ///< generator dimension (key_dim or value_dim)
  int out_dim = 0;  ///< channels written per row (0: dim)
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t stream_stride = 0;  ///< elements between streams
  std::int64_t row_stride = 0;     ///< elements between tokens (0: out_dim)
};

/// One step of the query random walk of `requests` requests on one layer, then the queries:
/// state = n_0 (step 0) or rho * state + fresh * n_step, out = state + c_q * anchor[kv head of h].
struct SynthQueriesArgs {
  const std::uint64_t* seeds = nullptr;  ///< [requests]: KvWorkload::query_seed
  const float* anchors = nullptr;        ///< [kv_heads][dim]
  float* state = nullptr;                ///< [requests][q_heads * dim], kept between steps
  float* out = nullptr;                  ///< [requests][q_heads * dim]
  int requests = 0;
  int q_heads = 0;
  int kv_heads = 1;
  int dim = 0;
  std::int64_t step = 0;
  /// Optional, in place of step (a step replayed from a CUDA graph reads it when it runs).
  const std::int64_t* step_device = nullptr;
  float rho = 1.0f;
  float fresh = 0.0f;
  float c_q = 0.0f;
};

/// DSA index queries from the attention queries: out[r][h][c] = q[r][h % q_heads][channels[c]].
struct GatherIndexQueriesArgs {
  const float* q = nullptr;                ///< [requests][q_heads][q_dim]
  const std::int32_t* channels = nullptr;  ///< [dim]
  float* out = nullptr;                    ///< [requests][heads][dim]
  int requests = 0;
  int q_heads = 0;
  int q_dim = 0;
  int heads = 0;
  int dim = 0;
};

#if HISPARSE_WITH_CUDA
void launch_synth_rows(const SynthRowsArgs& args, cudaStream_t stream);
void launch_synth_queries(const SynthQueriesArgs& args, cudaStream_t stream);
void launch_gather_index_queries(const GatherIndexQueriesArgs& args, cudaStream_t stream);
#endif
void synth_rows_ref(const SynthRowsArgs& args);
void synth_queries_ref(const SynthQueriesArgs& args);
void gather_index_queries_ref(const GatherIndexQueriesArgs& args);

/// One element of each: the per-thread bodies the CPU twins and the kernels share.
HISPARSE_HD float synth_row_value(const SynthRowsArgs& a, int s, std::int64_t t, int c);
/// Writes element (s, t - first, c) of the rows into out or out_bf16.
HISPARSE_HD void synth_row_store(const SynthRowsArgs& a, int s, std::int64_t i, int c,
                                 std::int64_t row_stride) {
  const float v = synth_row_value(a, s, a.first + i, c);
  const std::int64_t at = s * a.stream_stride + i * row_stride + c;
  if (a.out_bf16)
    a.out_bf16[at] = float_to_bf16(v);
  else
    a.out[at] = v;
}
HISPARSE_HD float synth_row_value(const SynthRowsArgs& a, int s, std::int64_t t, int c) {
  const int j = a.channels ? a.channels[c] : c;
  if (!a.scale) return random_normal(a.seeds[s], static_cast<std::uint64_t>(t) * a.dim + j);
  return synthetic_key(a.seeds[s], t, j, a.dim, a.scale[j], a.anchor[j], key_boost(a.boost, t));
}
HISPARSE_HD void synth_query_value(const SynthQueriesArgs& a, int r, std::int64_t i) {
  const std::int64_t n = std::int64_t{a.q_heads} * a.dim;
  float& st = a.state[r * n + i];
  const std::uint64_t seed = a.seeds[r];
  const std::int64_t step = a.step_device ? *a.step_device : a.step;
  if (step == 0) {
    st = random_normal(seed, static_cast<std::uint64_t>(i));
  } else {
    const float z = random_normal(seed, static_cast<std::uint64_t>(step * n + i));
    st = add_rn(mul_rn(a.rho, st), mul_rn(a.fresh, z));
  }
  const int h = static_cast<int>(i / a.dim), j = static_cast<int>(i % a.dim);
  const int group = a.q_heads / a.kv_heads;
  a.out[r * n + i] = add_rn(st, mul_rn(a.c_q, a.anchors[(h / group) * a.dim + j]));
}

}  // namespace hisparse::kernels
