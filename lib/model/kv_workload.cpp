#include "model/kv_workload.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/workload/workload_synth.hpp"
#include "model/replay_capture.hpp"
#include "model/selection_quality.hpp"

namespace hisparse {
namespace {
enum : std::uint64_t { kScale = 1, kAnchor, kKey, kValue, kQuery, kIndexPick, kPerm };
constexpr int kCalibrationSkip = 16;  // Fathom's calibration skips the first 16 tokens (sinks)
}  // namespace

std::uint64_t KvWorkload::stream(std::uint64_t kind, std::uint64_t a, std::uint64_t b,
                                 std::uint64_t c) const noexcept {
  return splitmix64(splitmix64(splitmix64(splitmix64(spec_.seed ^ (kind << 56)) ^ a) ^ b) ^ c);
}

KvWorkload::KvWorkload(const ModelSpec& model, const WorkloadSpec& spec, int requests,
                       std::int64_t context_length)
    : spec_(spec),
      mla_(model.is_mla()),
      requests_(requests),
      context_(context_length),
      layers_(model.layers) {
  if (spec.generator != "synthetic" && spec.generator != "replay")
    throw Error("workload.generator", fmt::format("unknown generator '{}'", spec.generator),
                "use workload.generator: synthetic or replay");
  if (spec.query_drift < 0 || spec.query_drift > 1)
    throw Error("workload.query_drift", fmt::format("must lie in [0, 1], got {}", spec.query_drift),
                "use e.g. 0.05");
  if (mla_) {
    kv_heads_ = 1;
    q_heads_ = model.mla.heads;
    key_dim_ = model.mla.kv_lora_rank + model.mla.qk_rope_head_dim;
    value_dim_ = model.mla.kv_lora_rank;
  } else {
    kv_heads_ = model.gqa.kv_heads;
    q_heads_ = model.gqa.q_heads;
    key_dim_ = value_dim_ = model.gqa.head_dim;
  }
  if (model.has_indexer()) {
    index_heads_ = model.indexer.heads;
    index_dim_ = model.indexer.head_dim;
  }
  if (spec.generator == "replay") load_capture(model);
  const int outliers = std::clamp(spec.outlier_channels, 0, key_dim_);
  for (int l = 0; l < layers_; ++l) {
    for (int g = 0; g < kv_heads_; ++g) {
      // Channel order: a seeded permutation; rank r gets variance 10^(-spread * r / (d - 1)).
      std::vector<int> perm(static_cast<std::size_t>(key_dim_));
      std::iota(perm.begin(), perm.end(), 0);
      Rng rng(stream(kPerm, static_cast<std::uint64_t>(l), static_cast<std::uint64_t>(g)));
      for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
      std::vector<float> d(static_cast<std::size_t>(key_dim_));
      for (int r = 0; r < key_dim_; ++r) {
        const double frac = key_dim_ > 1 ? static_cast<double>(r) / (key_dim_ - 1) : 0.0;
        double s = std::pow(10.0, -0.5 * spec.channel_spread_decades * frac);
        if (r < outliers) s *= spec.outlier_scale;
        d[static_cast<std::size_t>(perm[static_cast<std::size_t>(r)])] = static_cast<float>(s);
      }
      double sum_sq = 0;
      for (float v : d) sum_sq += static_cast<double>(v) * v;
      std::vector<float> a(static_cast<std::size_t>(key_dim_));
      double norm = 0;
      const std::uint64_t as =
          stream(kAnchor, static_cast<std::uint64_t>(l), static_cast<std::uint64_t>(g));
      for (std::size_t j = 0; j < a.size(); ++j) {
        a[j] = random_normal(as, j);
        norm += static_cast<double>(a[j]) * a[j];
      }
      for (float& v : a) v = static_cast<float>(v / std::sqrt(norm));
      scale_.push_back(std::move(d));
      anchor_.push_back(std::move(a));
      sigma_.push_back(static_cast<float>(std::sqrt(sum_sq)));
    }
    if (index_dim_ > 0) {
      std::vector<int> pick(static_cast<std::size_t>(std::max(key_dim_, index_dim_)));
      for (std::size_t i = 0; i < pick.size(); ++i) pick[i] = static_cast<int>(i % key_dim_);
      Rng rng(stream(kIndexPick, static_cast<std::uint64_t>(l)));
      for (std::size_t i = pick.size(); i > 1; --i) std::swap(pick[i - 1], pick[rng.below(i)]);
      pick.resize(static_cast<std::size_t>(index_dim_));
      index_channels_.push_back(std::move(pick));
    }
  }
}

void KvWorkload::load_capture(const ModelSpec& model) {
  ReplayGeometry geo;
  geo.model_name = model.name;
  geo.mla = mla_;
  geo.layers = layers_;
  geo.kv_heads = kv_heads_;
  geo.q_heads = q_heads_;
  geo.key_dim = key_dim_;
  geo.value_dim = value_dim_;
  auto capture = std::make_shared<const ReplayCapture>(spec_.replay_path, geo);
  if (context_ > capture->tokens())
    throw Error(fmt::format("workload.replay_path: {}", capture->key_source()),
                fmt::format("context_length {} is longer than the {} captured tokens", context_,
                            capture->tokens()),
                fmt::format("lower context_length to at most {} or capture more tokens",
                            capture->tokens()));
  notes_ = capture->notes();
  if (!mla_ && !capture->has_values())
    notes_.emplace_back("no values (v) captured: values are synthetic N(0, 1)");
  if (index_dim_ > 0)
    notes_.emplace_back("DSA index keys and queries are channels of the captured keys and queries");
  capture_ = std::move(capture);
}

kernels::KeyBoost KvWorkload::key_boost_params(int layer, int kv_head) const {
  kernels::KeyBoost b;
  const float c_q = 0.5f * std::sqrt(static_cast<float>(key_dim_));
  b.unit = sigma_[static_cast<std::size_t>(layer * kv_heads_ + kv_head)] / c_q;
  b.sink_tokens = spec_.sink_tokens;
  b.recency_bias = spec_.recency_bias;
  b.context = context_;
  return b;
}

std::uint64_t KvWorkload::key_seed(int request, int layer, int kv_head) const noexcept {
  return stream(kKey, static_cast<std::uint64_t>(request), static_cast<std::uint64_t>(layer),
                static_cast<std::uint64_t>(kv_head));
}
std::uint64_t KvWorkload::value_seed(int request, int layer, int kv_head) const noexcept {
  return stream(kValue, static_cast<std::uint64_t>(request), static_cast<std::uint64_t>(layer),
                static_cast<std::uint64_t>(kv_head));
}
std::uint64_t KvWorkload::query_seed(int request, int layer) const noexcept {
  return stream(kQuery, static_cast<std::uint64_t>(request), static_cast<std::uint64_t>(layer));
}
float KvWorkload::query_rho() const noexcept {
  return static_cast<float>(1.0 - spec_.query_drift);
}
float KvWorkload::query_fresh() const noexcept {
  const float rho = query_rho();
  return std::sqrt(std::max(0.0f, 1.0f - rho * rho));
}
float KvWorkload::query_anchor_gain() const noexcept {
  return 0.5f * std::sqrt(static_cast<float>(key_dim_));
}

void KvWorkload::keys(int request, int layer, int kv_head, std::int64_t first, std::int64_t count,
                      float* out) const {
  if (capture_) return capture_->keys(layer, kv_head, first, count, out);
  const auto idx = static_cast<std::size_t>(layer * kv_heads_ + kv_head);
  const std::vector<float>& d = scale_[idx];
  const std::vector<float>& a = anchor_[idx];
  const std::uint64_t s = key_seed(request, layer, kv_head);
  const kernels::KeyBoost boost = key_boost_params(layer, kv_head);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t t = first + i;
    const float b = kernels::key_boost(boost, t);
    float* row = out + i * key_dim_;
    for (int j = 0; j < key_dim_; ++j)
      row[j] = kernels::synthetic_key(s, t, j, key_dim_, d[static_cast<std::size_t>(j)],
                                      a[static_cast<std::size_t>(j)], b);
  }
}

void KvWorkload::values(int request, int layer, int kv_head, std::int64_t first, std::int64_t count,
                        float* out) const {
  if (mla_) {
    std::vector<float> row(static_cast<std::size_t>(key_dim_));
    for (std::int64_t i = 0; i < count; ++i) {
      keys(request, layer, kv_head, first + i, 1, row.data());
      std::copy_n(row.begin(), value_dim_, out + i * value_dim_);
    }
    return;
  }
  if (capture_ && capture_->has_values())
    return capture_->values(layer, kv_head, first, count, out);
  const std::uint64_t s = value_seed(request, layer, kv_head);
  for (std::int64_t i = 0; i < count; ++i)
    for (int j = 0; j < value_dim_; ++j)
      out[i * value_dim_ + j] = random_normal(
          s, static_cast<std::uint64_t>(first + i) * value_dim_ + static_cast<std::uint64_t>(j));
}

void KvWorkload::index_keys(int request, int layer, std::int64_t first, std::int64_t count,
                            float* out) const {
  if (index_dim_ == 0)
    throw Error("KvWorkload::index_keys", "the model has no DSA indexer",
                "ask only DSA models for index keys");
  std::vector<float> row(static_cast<std::size_t>(key_dim_));
  const auto& pick = index_channels_[static_cast<std::size_t>(layer)];
  for (std::int64_t i = 0; i < count; ++i) {
    keys(request, layer, 0, first + i, 1, row.data());
    for (int c = 0; c < index_dim_; ++c)
      out[i * index_dim_ + c] = row[static_cast<std::size_t>(pick[static_cast<std::size_t>(c)])];
  }
}

std::vector<float> KvWorkload::channel_variance(int layer, int kv_head) const {
  if (capture_) return capture_->key_variance(layer, kv_head, kCalibrationSkip);
  std::vector<float> v = scale_[static_cast<std::size_t>(layer * kv_heads_ + kv_head)];
  for (float& x : v) x *= x;
  return v;
}

void KvWorkload::queries(int request, int layer, std::int64_t step, float* out) const {
  if (capture_) return capture_->queries(layer, step, out);
  const std::size_t n = static_cast<std::size_t>(q_heads_) * key_dim_;
  const float rho = query_rho();
  const float fresh = query_fresh();
  const std::uint64_t s = query_seed(request, layer);
  {
    std::lock_guard lock(mutex_);
    Walk& w = walks_[{request, layer}];
    if (w.step < 0 || w.step > step) {
      w.state.assign(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) w.state[i] = random_normal(s, i);
      w.step = 0;
    }
    while (w.step < step) {
      ++w.step;
      for (std::size_t i = 0; i < n; ++i)
        w.state[i] =
            rho * w.state[i] + fresh * random_normal(s, static_cast<std::uint64_t>(w.step) * n + i);
    }
    std::copy(w.state.begin(), w.state.end(), out);
  }
  const float c_q = query_anchor_gain();
  const int group = q_heads_ / kv_heads_;
  for (int h = 0; h < q_heads_; ++h) {
    const auto& a = anchor_[static_cast<std::size_t>(layer * kv_heads_ + h / group)];
    for (int j = 0; j < key_dim_; ++j)
      out[h * key_dim_ + j] += c_q * a[static_cast<std::size_t>(j)];
  }
}

void KvWorkload::index_queries(int request, int layer, std::int64_t step, float* out) const {
  if (index_dim_ == 0)
    throw Error("KvWorkload::index_queries", "the model has no DSA indexer", "ask only DSA models");
  std::vector<float> q(static_cast<std::size_t>(q_heads_) * key_dim_);
  queries(request, layer, step, q.data());
  const auto& pick = index_channels_[static_cast<std::size_t>(layer)];
  for (int h = 0; h < index_heads_; ++h)
    for (int c = 0; c < index_dim_; ++c)
      out[h * index_dim_ + c] = q[static_cast<std::size_t>((h % q_heads_) * key_dim_ +
                                                           pick[static_cast<std::size_t>(c)])];
}

std::vector<std::int32_t> KvWorkload::select(int request, int layer, std::int64_t step,
                                             std::int64_t seq_len, int top_k) const {
  std::vector<float> scores(static_cast<std::size_t>(seq_len), 0.0f);
  if (index_dim_ > 0) {
    std::vector<float> keys_f(static_cast<std::size_t>(seq_len) * index_dim_);
    index_keys(request, layer, 0, seq_len, keys_f.data());
    std::vector<std::uint8_t> codes(keys_f.size());
    std::vector<float> key_scales(static_cast<std::size_t>(seq_len));
    for (std::int64_t t = 0; t < seq_len; ++t)
      kernels::quantize_index_key(keys_f.data() + t * index_dim_, index_dim_,
                                  codes.data() + t * index_dim_,
                                  &key_scales[static_cast<std::size_t>(t)]);
    std::vector<float> q(static_cast<std::size_t>(index_heads_) * index_dim_);
    index_queries(request, layer, step, q.data());
    const std::vector<float> w(static_cast<std::size_t>(index_heads_),
                               1.0f / static_cast<float>(index_heads_));
    kernels::IndexerArgs a;
    a.q = q.data();
    a.weights = w.data();
    a.keys = codes.data();
    a.key_scales = key_scales.data();
    a.seq_lens = &seq_len;
    a.scores = scores.data();
    a.batch = 1;
    a.heads = index_heads_;
    a.dim = index_dim_;
    a.capacity = seq_len;
    kernels::indexer_ref(a);
  } else {
    // Exact attention mass summed over every query head.
    std::vector<float> q(static_cast<std::size_t>(q_heads_) * key_dim_);
    queries(request, layer, step, q.data());
    std::vector<float> k(static_cast<std::size_t>(seq_len) * key_dim_);
    std::vector<float> logits(static_cast<std::size_t>(seq_len));
    const int group = q_heads_ / kv_heads_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(key_dim_));
    for (int g = 0; g < kv_heads_; ++g) {
      keys(request, layer, g, 0, seq_len, k.data());
      for (int h = g * group; h < (g + 1) * group; ++h) {
        float mx = -INFINITY;
        for (std::int64_t t = 0; t < seq_len; ++t) {
          float dot = 0;
          for (int j = 0; j < key_dim_; ++j)
            dot += q[static_cast<std::size_t>(h * key_dim_ + j)] *
                   k[static_cast<std::size_t>(t * key_dim_ + j)];
          logits[static_cast<std::size_t>(t)] = dot * scale;
          mx = std::max(mx, logits[static_cast<std::size_t>(t)]);
        }
        float denom = 0;
        for (float& x : logits) denom += (x = std::exp(x - mx));
        for (std::size_t t = 0; t < logits.size(); ++t) scores[t] += logits[t] / denom;
      }
    }
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(top_k));
  top_k_positions(scores.data(), seq_len, top_k, out.data());
  return out;
}

}  // namespace hisparse
