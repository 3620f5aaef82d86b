// The CPU decode engine: the reference every CUDA kernel and the CUDA engine are checked
// against (tests/gpu), and the CPU backend of every scenario. DecodeEngine (decode_engine.cpp)
// makes it through detail::make_cpu_engine.
#include "model/decode_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/topk/topk.hpp"
#include "model/capacity_model.hpp"
#include "model/detail/engine_impl.hpp"
#include "model/engine_fathom_index.hpp"
#include "model/engine_hot_rows.hpp"
#include "model/kv_workload.hpp"
#include "model/selection_quality.hpp"
#include "model/weights.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
using detail::kDefaultDecodeSteps;
using detail::kFathomRecent;
using detail::kFathomSinks;
using detail::kModelQueryShare;
using detail::validate_config;
namespace {

using Clock = std::chrono::steady_clock;
using std::size_t;

[[nodiscard]] size_t zu(std::int64_t v) {
  return static_cast<size_t>(v);
}

// Adds the model's query to the workload's, scaled to `share` of its RMS (nothing at share 0).
void blend_query(float* workload_q, const float* model_q, int n, float share) {
  if (share == 0.0f) return;
  double wl = 0, md = 0;
  for (int i = 0; i < n; ++i) {
    wl += static_cast<double>(workload_q[i]) * workload_q[i];
    md += static_cast<double>(model_q[i]) * model_q[i];
  }
  if (md <= 0) return;
  const auto gain = static_cast<float>(share * std::sqrt(wl / md));
  for (int i = 0; i < n; ++i) workload_q[i] += gain * model_q[i];
}

// A linear layer. With bf16_gemm, as a bf16 deployment runs it (the CUDA engine's bf16 GEMM): the
// weights hold bf16 values already (ModelWeights), the activations are rounded to bf16, the sum
// is fp32.
void linear(bool bf16_gemm, const float* x, const float* w, float* y, int m, int n, int k,
            float beta = 0.0f, int ldy = 0, float alpha = 1.0f) {
  thread_local std::vector<float> rounded;
  if (bf16_gemm) {
    rounded.assign(x, x + static_cast<std::size_t>(m) * static_cast<std::size_t>(k));
    detail::round_to_bf16_values(rounded.data(), rounded.size());
    x = rounded.data();
  }
  kernels::GemmArgs a;
  a.x = x;
  a.w = w;
  a.y = y;
  a.m = m;
  a.n = n;
  a.k = k;
  a.beta = beta;
  a.ldy = ldy;
  a.alpha = alpha;
  kernels::gemm_ref(a);
}

void rmsnorm(const float* x, const float* weight, float* y, int rows, int n, float eps,
             int ld = 0) {
  kernels::RmsNormArgs a;
  a.x = x;
  a.weight = weight;
  a.y = y;
  a.rows = rows;
  a.n = n;
  a.eps = eps;
  a.ldx = ld;
  a.ldy = ld;
  kernels::rmsnorm_ref(a);
}

// Times a phase into StepStats::phase_ms (or quality_ms for the name "quality").
class PhaseTimer {
 public:
  PhaseTimer(StepStats& stats, const char* name)
      : stats_(stats), name_(name), start_(Clock::now()) {}
  ~PhaseTimer() {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
    if (std::string_view(name_) == "quality")
      stats_.quality_ms += ms;
    else
      stats_.phase_ms[name_] += ms;
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  StepStats& stats_;
  const char* name_;
  Clock::time_point start_;
};

}  // namespace

// The CPU engine: the reference every other backend is checked against.
class CpuDecodeEngine final : public detail::EngineImpl {
 public:
  CpuDecodeEngine(const ModelSpec& model, const EngineConfig& config);
  StepStats step() override;
  [[nodiscard]] const std::vector<std::string>& workload_notes() const noexcept override {
    return workload_.notes();
  }
  [[nodiscard]] std::vector<SelectionTrace> selection_traces() const override {
    return hot_rows_ ? hot_rows_->traces() : std::vector<SelectionTrace>{};
  }
  [[nodiscard]] std::vector<float> last_attention(int layer) const override;
  [[nodiscard]] std::vector<float> last_queries(int layer) const override;

  std::unique_ptr<HotRowCache> hot_rows_;
  std::vector<std::vector<float>> last_attention_;  ///< per layer
  std::vector<std::vector<float>> last_queries_;    ///< per layer, as attention read them

 private:
  void fill_context();
  void setup_offload();
  void ensure_pool_room() const;
  void place_hot(int layer, int kv_heads, std::int64_t seq_len, kernels::DecodeAttentionArgs& a,
                 StepStats& stats);
  void measure_quality(int layer, const kernels::DecodeAttentionArgs& sparse,
                       const float* sparse_out, int groups, StepStats& stats);
  void ensure_capacity(std::int64_t rows);
  void attention_gqa(int layer, const float* h, float* x, StepStats& stats);
  void attention_mla(int layer, const float* h, float* x, StepStats& stats);
  void select_dsa(int layer, const float* h, const float* q_a, StepStats& stats);
  void ffn(int layer, const float* h, float* x);
  /// Weight `suffix` of layer `layer`. Resolved once per (layer, name) and then cached, so a
  /// decode step neither formats names nor searches the tensor map.
  [[nodiscard]] const float* w(int layer, std::string_view suffix) const {
    auto& cache = layer_weights_[static_cast<std::size_t>(layer)];
    const auto it = cache.find(suffix);
    if (it != cache.end()) return it->second;
    const float* p =
        weights_.get(layer_tensor_name(model_, layer, suffix, config_.share_layer_weights));
    cache.emplace(suffix, p);
    return p;
  }
  [[nodiscard]] int indexer_layer(int layer) const {
    return layer - layer % model_.indexer.every_n_layers;
  }

  ModelWeights weights_;
  /// Per layer: weight name suffix -> tensor, filled by w() (std::less<> looks up string_views
  /// without building a string).
  mutable std::vector<std::map<std::string, const float*, std::less<>>> layer_weights_;
  KvWorkload workload_;
  std::int64_t pool_capacity_ = 0;  ///< tokens per stream of the host pool / plane stores
  std::unique_ptr<FathomKeyIndex> fathom_index_;
  std::vector<std::int32_t> slots_;  ///< last swap-in output [streams][width]
  std::int64_t capacity_ = 0;        ///< rows per (request, KV head) allocated
  std::int64_t step_ = 0;
  std::vector<Buffer<float>> k_cache_, v_cache_;  ///< per layer [batch][kv_heads][capacity][dim]
  std::vector<Buffer<std::uint8_t>> index_keys_;  ///< per layer [batch][capacity][index_dim]
  std::vector<Buffer<float>> index_scales_;       ///< per layer [batch][capacity]
  std::vector<std::int32_t> tokens_;
  std::vector<std::int32_t> indices_;  ///< last selection [batch][groups][top_k]
};

CpuDecodeEngine::CpuDecodeEngine(const ModelSpec& model, const EngineConfig& config)
    : EngineImpl(model, config),
      weights_((validate_config(model, config), model), config.share_layer_weights),
      layer_weights_(static_cast<std::size_t>(model.layers)),
      workload_(model, config.workload, config.concurrency, config.context_length) {
  derive_sizes(workload_);
  tokens_ = first_tokens();
  fill_context();
  setup_offload();
  last_attention_.resize(zu(model.layers));
  last_queries_.resize(zu(model.layers));
}

// The host-side structures of the offloading modes, filled from the context.
void CpuDecodeEngine::setup_offload() {
  HISPARSE_FUNC_RANGE();
  const bool mla = model_.is_mla();
  const int steps = config_.max_decode_steps > 0 ? config_.max_decode_steps : kDefaultDecodeSteps;
  pool_capacity_ = seq_len_ + steps;
  if (fathom_) {
    fathom_index_ = make_fathom_index(pool_capacity_, Backend::cpu);
    width_ = fathom_index_->width();
    for (int l = 0; l < model_.layers; ++l)
      fathom_index_->load_context(l, k_cache_[zu(l)].host_data(), capacity_ * key_dim_, seq_len_);
  }
  hot_rows_ = make_hot_rows(pool_capacity_, Backend::cpu);
  if (!hot_rows_) return;
  for (int l = 0; l < model_.layers; ++l)
    for (int s = 0; s < streams_; ++s)
      for (std::int64_t t = 0; t < seq_len_; ++t) {
        float* row = hot_rows_->pool_row(s, l, t);
        const size_t at = (zu(s) * zu(capacity_) + zu(t)) * zu(key_dim_);
        std::copy_n(k_cache_[zu(l)].host_data() + at, key_dim_, row);
        if (!mla) std::copy_n(v_cache_[zu(l)].host_data() + at, key_dim_, row + key_dim_);
      }
  hot_rows_->admit_all(seq_len_);
}

void CpuDecodeEngine::ensure_pool_room() const {
  if ((hot_rows_ || fathom_index_) && seq_len_ >= pool_capacity_)
    throw Error(fmt::format("mode {}", name_of(config_.mode)),
                fmt::format("step {} needs room for token {}, the host pool holds {} tokens per "
                            "request (context {} + max_decode_steps)",
                            step_, seq_len_, pool_capacity_, config_.context_length),
                "raise EngineConfig::max_decode_steps to the number of steps the run takes");
}

// HiSparse placement of one layer: swap-in of the selection in indices_, then point the
// attention at the hot rows and the slots the swap-in resolved.
void CpuDecodeEngine::place_hot(int l, int kv_heads, std::int64_t seq_len,
                                kernels::DecodeAttentionArgs& a, StepStats& stats) {
  HISPARSE_RANGE("swap_in", Phase::swap_in);
  PhaseTimer t(stats, "swap_in");
  slots_.resize(indices_.size());
  const SwapInStats s = hot_rows_->swap_in(l, indices_.data(), seq_len, slots_.data());
  stats.hits += s.hits;
  stats.misses += s.misses;
  // Deployment bytes: a miss fetches one stream's row in the model's KV layout.
  stats.bytes_h2d += s.misses * static_cast<std::int64_t>(deployed_row_bytes_);
  const float* rows = hot_rows_->layer_rows(l);
  const int row_floats = hot_rows_->shape().row_elements;
  a.k = rows;
  a.v = model_.is_mla() ? rows : rows + key_dim_;
  a.kv_heads = kv_heads;
  a.capacity = hot_slots_ + 1;
  a.k_row_stride = row_floats;
  a.v_row_stride = row_floats;
  a.indices = slots_.data();
}

// Recall of the selection (positions in indices_) and error of the attention output against
// dense attention over the whole cache, for the sampled layers.
void CpuDecodeEngine::measure_quality(int l, const kernels::DecodeAttentionArgs& sparse,
                                      const float* sparse_out, int groups, StepStats& stats) {
  if (!samples_quality(l)) return;
  PhaseTimer t(stats, "quality");
  const std::vector<std::int64_t> lens(zu(batch_), seq_len_ + 1);
  const float* k = k_cache_[zu(l)].host_data();
  kernels::DecodeAttentionArgs d = dense_twin(
      sparse, k, model_.is_mla() ? k : v_cache_[zu(l)].host_data(), capacity_, lens.data());
  std::vector<float> dense(zu(batch_) * zu(d.q_heads) * zu(d.v_dim));
  d.out = dense.data();
  kernels::decode_attention_ref(d);
  add_quality_sample(d, sparse.q, k, indices_.data(), groups, sparse_out, dense.data());
}

void CpuDecodeEngine::fill_context() {
  HISPARSE_FUNC_RANGE();
  ensure_capacity(seq_len_ + 16);
  const int ix_dim = workload_.index_dim();
  for (int l = 0; l < model_.layers; ++l) {
    for (int b = 0; b < batch_; ++b) {
      for (int g = 0; g < kv_heads_; ++g) {
        const std::int64_t base = (static_cast<std::int64_t>(b) * kv_heads_ + g) * capacity_;
        workload_.keys(b, l, g, 0, seq_len_, k_cache_[zu(l)].host_data() + zu(base) * zu(key_dim_));
        if (!model_.is_mla())
          workload_.values(b, l, g, 0, seq_len_,
                           v_cache_[zu(l)].host_data() + zu(base) * zu(value_dim_));
      }
      if (ix_dim > 0 && indexer_layer(l) == l) {  // index keys: fp8 from the float keys
        std::vector<float> keys(zu(seq_len_) * zu(ix_dim));
        workload_.index_keys(b, l, 0, seq_len_, keys.data());
        for (std::int64_t t = 0; t < seq_len_; ++t) {
          const std::int64_t row = static_cast<std::int64_t>(b) * capacity_ + t;
          kernels::quantize_index_key(keys.data() + zu(t) * zu(ix_dim), ix_dim,
                                      index_keys_[zu(l)].host_data() + zu(row) * zu(ix_dim),
                                      index_scales_[zu(l)].host_data() + zu(row));
        }
      }
    }
    detail::round_to_bf16_values(k_cache_[zu(l)].host_data(), k_cache_[zu(l)].size());
    if (!model_.is_mla())
      detail::round_to_bf16_values(v_cache_[zu(l)].host_data(), v_cache_[zu(l)].size());
  }
}

// Grows every per-layer cache to hold `rows` tokens per (request, KV head), keeping contents.
void CpuDecodeEngine::ensure_capacity(std::int64_t rows) {
  if (rows <= capacity_) return;
  const std::int64_t cap = std::max(rows, capacity_ + capacity_ / 4 + 64);
  const int ix_dim = workload_.index_dim();
  const bool own_v = !model_.is_mla();
  auto regrow = [&](auto& buf, size_t groups, size_t width, const char* label) {
    using T = std::remove_pointer_t<decltype(buf.host_data())>;
    auto next = Buffer<T>::device(groups * zu(cap) * width, Backend::cpu, label);
    std::fill(next.host_data(), next.host_data() + next.size(), T{});
    if (buf.size() > 0)
      for (size_t g = 0; g < groups; ++g)
        std::memcpy(next.host_data() + g * zu(cap) * width,
                    buf.host_data() + g * zu(capacity_) * width, zu(capacity_) * width * sizeof(T));
    buf = std::move(next);
  };
  k_cache_.resize(zu(model_.layers));
  v_cache_.resize(zu(model_.layers));
  index_keys_.resize(zu(model_.layers));
  index_scales_.resize(zu(model_.layers));
  const size_t groups = zu(batch_) * zu(kv_heads_);
  for (int l = 0; l < model_.layers; ++l) {
    regrow(k_cache_[zu(l)], groups, zu(key_dim_), "KV cache (keys)");
    if (own_v) regrow(v_cache_[zu(l)], groups, zu(value_dim_), "KV cache (values)");
    if (ix_dim > 0 && indexer_layer(l) == l) {
      regrow(index_keys_[zu(l)], zu(batch_), zu(ix_dim), "index keys");
      regrow(index_scales_[zu(l)], zu(batch_), 1, "index key scales");
    }
  }
  capacity_ = cap;
}

StepStats CpuDecodeEngine::step() {
  HISPARSE_RANGE("step", Phase::step);
  StepStats stats;
  for (const char* p : {"embed", "indexer", "topk", "attention", "ffn", "lm_head", "append"})
    stats.phase_ms[p] = 0.0;
  if (hot_rows_) stats.phase_ms["swap_in"] = 0.0;
  if (fathom_) stats.phase_ms["scan"] = 0.0;
  const auto start = Clock::now();
  ensure_pool_room();
  ensure_capacity(seq_len_ + 1);
  const int H = model_.hidden;
  std::vector<float> x(zu(batch_) * zu(H)), h(x.size());
  int first_non_finite = detail::kNoSite;
  const auto check_finite = [&](const std::vector<float>& v, int site) {
    if (!config_.check_finite) return;
    kernels::MarkNonFiniteArgs a;
    a.x = v.data();
    a.n = static_cast<std::int64_t>(v.size());
    a.site = site;
    a.first_site = &first_non_finite;
    kernels::mark_non_finite_ref(a);
  };
  {
    HISPARSE_RANGE("embed", Phase::embed);
    PhaseTimer t(stats, "embed");
    const float* emb = weights_.get("model.embed_tokens.weight");
    for (int b = 0; b < batch_; ++b)
      std::copy_n(emb + zu(tokens_[zu(b)]) * zu(H), H, x.data() + zu(b) * zu(H));
    check_finite(x, 0);
  }
  for (int l = 0; l < model_.layers; ++l) {
    HISPARSE_RANGE_PAYLOAD("layer", Phase::layer, l);
    {
      PhaseTimer t(stats, "attention");
      rmsnorm(x.data(), w(l, "input_layernorm.weight"), h.data(), batch_, H, model_.norm_eps);
    }
    if (model_.is_mla()) {
      attention_mla(l, h.data(), x.data(), stats);
    } else {
      attention_gqa(l, h.data(), x.data(), stats);
    }
    check_finite(x, detail::finite_site(l, false));
    HISPARSE_RANGE("ffn", Phase::ffn);
    PhaseTimer t(stats, "ffn");
    rmsnorm(x.data(), w(l, "post_attention_layernorm.weight"), h.data(), batch_, H,
            model_.norm_eps);
    ffn(l, h.data(), x.data());
    check_finite(x, detail::finite_site(l, true));
  }
  {
    HISPARSE_RANGE("lm_head", Phase::lm_head);
    PhaseTimer t(stats, "lm_head");
    rmsnorm(x.data(), weights_.get("model.norm.weight"), h.data(), batch_, H, model_.norm_eps);
    std::vector<float> logits(zu(batch_) * zu(model_.vocab));
    linear(config_.bf16_gemm, h.data(), weights_.get("lm_head.weight"), logits.data(), batch_,
           model_.vocab, H);
    check_finite(logits, detail::logits_site(model_.layers));
    if (first_non_finite != detail::kNoSite)
      throw detail::non_finite_error(model_, config_, step_, first_non_finite);
    stats.next_tokens.resize(zu(batch_));
    for (int b = 0; b < batch_; ++b) {
      const float* row = logits.data() + zu(b) * zu(model_.vocab);
      // Greedy; ties go to the lower token id.
      stats.next_tokens[zu(b)] =
          static_cast<std::int32_t>(std::max_element(row, row + model_.vocab) - row);
    }
  }
  tokens_ = stats.next_tokens;
  ++seq_len_;
  ++step_;
  finish_quality(stats);
  stats.step_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() - stats.quality_ms;
  return stats;
}

void CpuDecodeEngine::attention_gqa(int l, const float* h, float* x, StepStats& stats) {
  const GqaShape& s = model_.gqa;
  const int H = model_.hidden, hd = s.head_dim, qh = s.q_heads, kvh = s.kv_heads;
  const std::int64_t pos = seq_len_;  // the new token's position
  std::vector<float> q(zu(batch_) * zu(qh) * zu(hd)), k(zu(batch_) * zu(kvh) * zu(hd)), v(k.size());
  {
    HISPARSE_RANGE("qkv", Phase::gemm);
    PhaseTimer t(stats, "attention");
    linear(config_.bf16_gemm, h, w(l, "self_attn.q_proj.weight"), q.data(), batch_, qh * hd, H);
    linear(config_.bf16_gemm, h, w(l, "self_attn.k_proj.weight"), k.data(), batch_, kvh * hd, H);
    linear(config_.bf16_gemm, h, w(l, "self_attn.v_proj.weight"), v.data(), batch_, kvh * hd, H);
    if (s.qk_norm) {
      rmsnorm(q.data(), w(l, "self_attn.q_norm.weight"), q.data(), batch_ * qh, hd,
              model_.norm_eps);
      rmsnorm(k.data(), w(l, "self_attn.k_norm.weight"), k.data(), batch_ * kvh, hd,
              model_.norm_eps);
    }
    const std::vector<std::int64_t> positions(zu(batch_), pos);
    kernels::RopeArgs r;
    r.x = q.data();
    r.positions = positions.data();
    r.rows = batch_;
    r.heads = qh;
    r.head_stride = hd;
    r.dim = hd;
    r.theta = model_.rope_theta;
    kernels::rope_ref(r);
    r.x = k.data();
    r.heads = kvh;
    kernels::rope_ref(r);
    // The attention query: the workload's, with the model's mixed in (synthetic workloads).
    std::vector<float> wl(zu(qh) * zu(hd));
    for (int b = 0; b < batch_; ++b) {
      workload_.queries(b, l, step_, wl.data());
      for (int hh = 0; hh < qh; ++hh) {
        float* qb = q.data() + (zu(b) * zu(qh) + zu(hh)) * zu(hd);
        blend_query(wl.data() + zu(hh) * zu(hd), qb, hd, model_query_share_);
        std::copy_n(wl.data() + zu(hh) * zu(hd), hd, qb);
      }
    }
    last_queries_[zu(l)].assign(q.begin(), q.end());
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    PhaseTimer t(stats, "append");
    detail::round_to_bf16_values(k.data(), k.size());  // the new row as the cache holds it
    detail::round_to_bf16_values(v.data(), v.size());
    for (int b = 0; b < batch_; ++b)
      for (int g = 0; g < kvh; ++g) {
        const size_t row = (zu(b) * zu(kvh) + zu(g)) * zu(capacity_) + zu(pos);
        std::copy_n(k.data() + (zu(b) * zu(kvh) + zu(g)) * zu(hd), hd,
                    k_cache_[zu(l)].host_data() + row * zu(hd));
        std::copy_n(v.data() + (zu(b) * zu(kvh) + zu(g)) * zu(hd), hd,
                    v_cache_[zu(l)].host_data() + row * zu(hd));
      }
    // The offloaded copies: [K | V] rows of the host pool and the newest-token slot; the
    // Fathom planes (k is [batch][kv_heads][head_dim] = [streams][head_dim]).
    if (hot_rows_) {
      std::vector<float> kv_row(2 * zu(hd));
      for (int st = 0; st < batch_ * kvh; ++st) {
        std::copy_n(k.data() + zu(st) * zu(hd), hd, kv_row.data());
        std::copy_n(v.data() + zu(st) * zu(hd), hd, kv_row.data() + hd);
        hot_rows_->append(l, st, pos + 1, kv_row.data());
      }
    }
    if (fathom_index_) fathom_index_->append(l, k.data());
  }
  const std::vector<std::int64_t> lens(zu(batch_), pos + 1);
  kernels::DecodeAttentionArgs a;
  a.q = q.data();
  a.k = k_cache_[zu(l)].host_data();
  a.v = v_cache_[zu(l)].host_data();
  a.seq_lens = lens.data();
  a.batch = batch_;
  a.q_heads = qh;
  a.kv_heads = kvh;
  a.qk_dim = hd;
  a.v_dim = hd;
  a.capacity = capacity_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (sparse_) {
    // The baseline's exact top-k: attention mass of each token summed over the KV head's group.
    std::vector<float> mass(zu(batch_) * zu(kvh) * zu(capacity_));
    {
      HISPARSE_RANGE("exact_scores", Phase::indexer);
      PhaseTimer t(stats, "indexer");
      kernels::GroupAttentionMassArgs m;
      m.q = q.data();
      m.k = a.k;
      m.seq_lens = lens.data();
      m.mass = mass.data();
      m.batch = batch_;
      m.q_heads = qh;
      m.kv_heads = kvh;
      m.qk_dim = hd;
      m.capacity = capacity_;
      m.scale = a.scale;
      kernels::group_attention_mass_ref(m);
    }
    // The exact top-k reads every key: the K half of each KV row.
    stats.bytes_scanned +=
        static_cast<std::int64_t>(model_.kv_row_bytes() / 2) * batch_ * (pos + 1);
    HISPARSE_RANGE("topk", Phase::topk);
    PhaseTimer t(stats, "topk");
    std::vector<std::int64_t> group_lens(zu(batch_) * zu(kvh), pos + 1);
    indices_.assign(zu(batch_) * zu(kvh) * zu(top_k_), -1);
    kernels::TopkArgs tk;
    tk.scores = mass.data();
    tk.lengths = group_lens.data();
    tk.out = indices_.data();
    tk.rows = batch_ * kvh;
    tk.stride = capacity_;
    tk.k = top_k_;
    kernels::topk_ref(tk);
    a.indices = indices_.data();
    a.top_k = top_k_;
    a.index_groups = kvh;
  } else if (fathom_) {
    HISPARSE_RANGE("fathom_select", Phase::scan);
    PhaseTimer t(stats, "scan");
    indices_.assign(zu(streams_) * zu(width_), -1);
    // q is [batch][q_heads][head_dim] = [streams][group][head_dim].
    const FathomSelectStats fs = fathom_index_->select(l, q.data(), indices_.data());
    stats.bytes_scanned += fs.bytes_scanned;
    stats.plans += fs.plans;
    stats.plan_bits += fs.plan_bits;
    stats.plan_active_channels += fs.active_channels;
    // Fathom caches nothing between steps: every selected row crosses the link.
    if (!hot_rows_)
      stats.bytes_h2d += fs.rows_selected * static_cast<std::int64_t>(deployed_row_bytes_);
    a.indices = indices_.data();
    a.top_k = width_;
    a.index_groups = kvh;
  }
  if (hot_rows_) place_hot(l, kvh, pos + 1, a, stats);
  std::vector<float> out(q.size());
  {
    HISPARSE_RANGE("attention", Phase::attention);
    PhaseTimer t(stats, "attention");
    a.out = out.data();
    kernels::decode_attention_ref(a);
  }
  measure_quality(l, a, out.data(), kvh, stats);
  HISPARSE_RANGE("o_proj", Phase::gemm);
  PhaseTimer t(stats, "attention");
  linear(config_.bf16_gemm, out.data(), w(l, "self_attn.o_proj.weight"), x, batch_, H, qh * hd,
         1.0f);
  last_attention_[zu(l)] = std::move(out);
}

void CpuDecodeEngine::attention_mla(int l, const float* h, float* x, StepStats& stats) {
  const MlaShape& s = model_.mla;
  const int H = model_.hidden, heads = s.heads, nope = s.qk_nope_head_dim,
            rope = s.qk_rope_head_dim;
  const int lora = s.kv_lora_rank, vd = s.v_head_dim, qk = nope + rope, row = lora + rope;
  const std::int64_t pos = seq_len_;
  const std::vector<std::int64_t> positions(zu(batch_), pos);
  std::vector<float> q_a(zu(batch_) * zu(s.q_lora_rank)), q(zu(batch_) * zu(heads) * zu(qk));
  std::vector<float> kv(zu(batch_) * zu(row)), q_abs(zu(batch_) * zu(heads) * zu(row));
  const float* kv_b = w(l, "self_attn.kv_b_proj.weight");  // [heads * (nope + v), lora]
  {
    HISPARSE_RANGE("q_kv", Phase::gemm);
    PhaseTimer t(stats, "attention");
    linear(config_.bf16_gemm, h, w(l, "self_attn.q_a_proj.weight"), q_a.data(), batch_,
           s.q_lora_rank, H);
    rmsnorm(q_a.data(), w(l, "self_attn.q_a_layernorm.weight"), q_a.data(), batch_, s.q_lora_rank,
            model_.norm_eps);
    linear(config_.bf16_gemm, q_a.data(), w(l, "self_attn.q_b_proj.weight"), q.data(), batch_,
           heads * qk, s.q_lora_rank);
    linear(config_.bf16_gemm, h, w(l, "self_attn.kv_a_proj_with_mqa.weight"), kv.data(), batch_,
           row, H);
    rmsnorm(kv.data(), w(l, "self_attn.kv_a_layernorm.weight"), kv.data(), batch_, lora,
            model_.norm_eps, row);
    kernels::RopeArgs r;
    r.x = q.data();
    r.positions = positions.data();
    r.rows = batch_;
    r.heads = heads;
    r.head_stride = qk;
    r.offset = nope;
    r.dim = rope;
    r.theta = model_.rope_theta;
    kernels::rope_ref(r);
    r.x = kv.data();
    r.heads = 1;
    r.head_stride = row;
    r.offset = lora;
    kernels::rope_ref(r);
    // Absorb W_uk into the query: q_lat = W_uk[h]^T q_nope, then [q_lat | q_rope].
    std::vector<float> model_q(zu(row)), wl(zu(heads) * zu(row));
    for (int b = 0; b < batch_; ++b) {
      workload_.queries(b, l, step_, wl.data());
      for (int hh = 0; hh < heads; ++hh) {
        const float* qn = q.data() + (zu(b) * zu(heads) + zu(hh)) * zu(qk);
        std::fill(model_q.begin(), model_q.end(), 0.0f);
        for (int n = 0; n < nope; ++n) {
          const float* uk = kv_b + (zu(hh) * zu(nope + vd) + zu(n)) * zu(lora);
          for (int c = 0; c < lora; ++c) model_q[zu(c)] += qn[n] * uk[c];
        }
        std::copy_n(qn + nope, rope, model_q.data() + lora);
        float* target = q_abs.data() + (zu(b) * zu(heads) + zu(hh)) * zu(row);
        std::copy_n(wl.data() + zu(hh) * zu(row), row, target);
        blend_query(target, model_q.data(), row, model_query_share_);
      }
    }
    last_queries_[zu(l)].assign(q_abs.begin(), q_abs.end());
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    PhaseTimer t(stats, "append");
    detail::round_to_bf16_values(kv.data(), kv.size());  // the new row as the cache holds it
    for (int b = 0; b < batch_; ++b)
      std::copy_n(kv.data() + zu(b) * zu(row), row,
                  k_cache_[zu(l)].host_data() + (zu(b) * zu(capacity_) + zu(pos)) * zu(row));
    if (hot_rows_)
      for (int b = 0; b < batch_; ++b)
        hot_rows_->append(l, b, pos + 1, kv.data() + zu(b) * zu(row));
  }
  if (model_.has_indexer() && indexer_layer(l) == l) select_dsa(l, h, q_a.data(), stats);
  const std::vector<std::int64_t> lens(zu(batch_), pos + 1);
  std::vector<float> lat(zu(batch_) * zu(heads) * zu(lora));
  kernels::DecodeAttentionArgs a;
  a.q = q_abs.data();
  a.k = k_cache_[zu(l)].host_data();
  a.v = a.k;
  a.seq_lens = lens.data();
  a.out = lat.data();
  a.batch = batch_;
  a.q_heads = heads;
  a.kv_heads = 1;
  a.qk_dim = row;
  a.v_dim = lora;
  a.capacity = capacity_;
  a.k_row_stride = row;
  a.v_row_stride = row;
  a.scale = 1.0f / std::sqrt(static_cast<float>(qk));
  if (sparse_ && model_.has_indexer()) {
    a.indices = indices_.data();
    a.top_k = top_k_;
    a.index_groups = 1;
  } else if (sparse_) {
    throw Error(fmt::format("model {}", model_.name),
                "sparse-gpu on an MLA model needs a DSA indexer",
                "add `indexer:` to the model or use mode dense");
  }
  if (hot_rows_) place_hot(l, 1, pos + 1, a, stats);
  {
    HISPARSE_RANGE("attention", Phase::attention);
    PhaseTimer t(stats, "attention");
    kernels::decode_attention_ref(a);
  }
  measure_quality(l, a, lat.data(), 1, stats);
  HISPARSE_RANGE("o_proj", Phase::gemm);
  PhaseTimer t(stats, "attention");
  // Up-project the attended latent per head (W_uv) and apply o_proj.
  std::vector<float> o(zu(batch_) * zu(heads) * zu(vd));
  for (int b = 0; b < batch_; ++b)
    for (int hh = 0; hh < heads; ++hh)
      linear(false, lat.data() + (zu(b) * zu(heads) + zu(hh)) * zu(lora),
             kv_b + (zu(hh) * zu(nope + vd) + zu(nope)) * zu(lora),
             o.data() + (zu(b) * zu(heads) + zu(hh)) * zu(vd), 1, vd, lora);
  linear(config_.bf16_gemm, o.data(), w(l, "self_attn.o_proj.weight"), x, batch_, H, heads * vd,
         1.0f);
  last_attention_[zu(l)] = std::move(lat);
}

// DSA: append the new index key, then (sparse-gpu) score every token and take the top-k.
void CpuDecodeEngine::select_dsa(int l, const float* h, const float* q_a, StepStats& stats) {
  const IndexerShape& ix = model_.indexer;
  const int H = model_.hidden;
  const std::int64_t pos = seq_len_;
  std::vector<float> q(zu(batch_) * zu(ix.heads) * zu(ix.head_dim)),
      k(zu(batch_) * zu(ix.head_dim));
  std::vector<float> wts(zu(batch_) * zu(ix.heads));
  {
    HISPARSE_RANGE("indexer_proj", Phase::indexer);
    PhaseTimer t(stats, "indexer");
    linear(config_.bf16_gemm, h, w(l, "self_attn.indexer.wk.weight"), k.data(), batch_, ix.head_dim,
           H);
    rmsnorm(k.data(), w(l, "self_attn.indexer.k_norm.weight"), k.data(), batch_, ix.head_dim,
            model_.norm_eps);
    const float* bias = w(l, "self_attn.indexer.k_norm.bias");
    for (int b = 0; b < batch_; ++b)
      for (int c = 0; c < ix.head_dim; ++c) k[zu(b) * zu(ix.head_dim) + zu(c)] += bias[c];
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    PhaseTimer t(stats, "append");
    for (int b = 0; b < batch_; ++b) {
      const size_t r = zu(b) * zu(capacity_) + zu(pos);
      kernels::quantize_index_key(k.data() + zu(b) * zu(ix.head_dim), ix.head_dim,
                                  index_keys_[zu(l)].host_data() + r * zu(ix.head_dim),
                                  index_scales_[zu(l)].host_data() + r);
    }
  }
  if (!sparse_) return;
  std::vector<float> scores(zu(batch_) * zu(capacity_));
  const std::vector<std::int64_t> lens(zu(batch_), pos + 1);
  {
    HISPARSE_RANGE("indexer", Phase::indexer);
    PhaseTimer t(stats, "indexer");
    linear(config_.bf16_gemm, q_a, w(l, "self_attn.indexer.wq_b.weight"), q.data(), batch_,
           ix.heads * ix.head_dim, model_.mla.q_lora_rank);
    linear(config_.bf16_gemm, h, w(l, "self_attn.indexer.weights_proj.weight"), wts.data(), batch_,
           ix.heads, H);
    std::vector<float> wl(zu(ix.heads) * zu(ix.head_dim));
    for (int b = 0; b < batch_; ++b) {
      workload_.index_queries(b, l, step_, wl.data());
      for (int hh = 0; hh < ix.heads; ++hh) {
        float* qb = q.data() + (zu(b) * zu(ix.heads) + zu(hh)) * zu(ix.head_dim);
        blend_query(wl.data() + zu(hh) * zu(ix.head_dim), qb, ix.head_dim, model_query_share_);
        std::copy_n(wl.data() + zu(hh) * zu(ix.head_dim), ix.head_dim, qb);
        // Positive head weights around 1 / heads, modulated by the model.
        float& wt = wts[zu(b) * zu(ix.heads) + zu(hh)];
        wt = (1.0f + model_query_share_ * std::tanh(wt)) / static_cast<float>(ix.heads);
      }
    }
    kernels::IndexerArgs a;
    a.q = q.data();
    a.weights = wts.data();
    a.keys = index_keys_[zu(l)].host_data();
    a.key_scales = index_scales_[zu(l)].host_data();
    a.seq_lens = lens.data();
    a.scores = scores.data();
    a.batch = batch_;
    a.heads = ix.heads;
    a.dim = ix.head_dim;
    a.capacity = capacity_;
    kernels::indexer_ref(a);
    // The indexer reads every token's index key (fp8 values + fp32 scale).
    stats.bytes_scanned += static_cast<std::int64_t>(model_.index_key_bytes()) * batch_ * (pos + 1);
  }
  HISPARSE_RANGE("topk", Phase::topk);
  PhaseTimer t(stats, "topk");
  indices_.assign(zu(batch_) * zu(top_k_), -1);
  kernels::TopkArgs tk;
  tk.scores = scores.data();
  tk.lengths = lens.data();
  tk.out = indices_.data();
  tk.rows = batch_;
  tk.stride = capacity_;
  tk.k = top_k_;
  kernels::topk_ref(tk);
}

void CpuDecodeEngine::ffn(int l, const float* h, float* x) {
  const int H = model_.hidden;
  auto swiglu = [&](const float* in, int rows, const std::string& prefix, int width) {
    std::vector<float> gate_up(zu(rows) * 2 * zu(width)), act(zu(rows) * zu(width));
    linear(config_.bf16_gemm, in, w(l, (prefix + "gate_proj.weight").c_str()), gate_up.data(), rows,
           width, H, 0.0f, 2 * width);
    linear(config_.bf16_gemm, in, w(l, (prefix + "up_proj.weight").c_str()), gate_up.data() + width,
           rows, width, H, 0.0f, 2 * width);
    kernels::SwigluArgs s;
    s.gate_up = gate_up.data();
    s.out = act.data();
    s.rows = rows;
    s.width = width;
    kernels::swiglu_ref(s);
    return act;
  };
  if (model_.ffn.kind == FfnKind::dense || l < model_.ffn.first_dense_layers) {
    const auto act = swiglu(h, batch_, "mlp.", model_.ffn.dense_width);
    linear(config_.bf16_gemm, act.data(), w(l, "mlp.down_proj.weight"), x, batch_, H,
           model_.ffn.dense_width, 1.0f);
    return;
  }
  const FfnShape& f = model_.ffn;
  // Router over this rank's experts (rows 0 .. experts_held-1 of the gate).
  std::vector<float> logits(zu(batch_) * zu(f.experts_held));
  linear(config_.bf16_gemm, h, w(l, "mlp.gate.weight"), logits.data(), batch_, f.experts_held, H);
  for (int b = 0; b < batch_; ++b) {
    const float* lg = logits.data() + zu(b) * zu(f.experts_held);
    std::vector<int> order(zu(f.experts_held));
    for (int e = 0; e < f.experts_held; ++e) order[zu(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return lg[a] > lg[c]; });
    order.resize(zu(f.active_experts));
    float mx = -INFINITY, denom = 0.0f;
    for (int e : order) mx = std::max(mx, lg[e]);
    for (int e : order) denom += std::exp(lg[e] - mx);
    const float* hb = h + zu(b) * zu(H);
    for (int e : order) {
      const std::string prefix = fmt::format("mlp.experts.{}.", e);
      const auto act = swiglu(hb, 1, prefix, f.expert_width);
      linear(config_.bf16_gemm, act.data(), w(l, (prefix + "down_proj.weight").c_str()),
             x + zu(b) * zu(H), 1, H, f.expert_width, 1.0f, 0, std::exp(lg[e] - mx) / denom);
    }
  }
  if (f.shared_experts > 0) {
    const int width = f.shared_experts * f.expert_width;
    const auto act = swiglu(h, batch_, "mlp.shared_experts.", width);
    linear(config_.bf16_gemm, act.data(), w(l, "mlp.shared_experts.down_proj.weight"), x, batch_, H,
           width, 1.0f);
  }
}

std::vector<float> CpuDecodeEngine::last_attention(int layer) const {
  return detail::layer_record(last_attention_, layer, "last_attention");
}
std::vector<float> CpuDecodeEngine::last_queries(int layer) const {
  return detail::layer_record(last_queries_, layer, "last_queries");
}

namespace detail {
std::unique_ptr<EngineImpl> make_cpu_engine(const ModelSpec& model, const EngineConfig& config) {
  return std::make_unique<CpuDecodeEngine>(model, config);
}
}  // namespace detail

}  // namespace hisparse
