// The CPU decode engine: the reference every CUDA kernel and the CUDA engine are checked
// against (tests/gpu), and the CPU backend of every scenario. DecodeEngine (decode_engine.cpp)
// makes it through detail::make_cpu_engine. The layers' arithmetic is in cpu_engine_layers.cpp.
#include "model/detail/cpu_engine.hpp"

namespace hisparse::detail {
using namespace cpu;  // NOLINT: the engine's own host helpers

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
  StepStats stats = begin_step_stats();
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
  end_step(stats, start);
  return stats;
}

std::vector<float> CpuDecodeEngine::last_attention(int layer) const {
  return detail::layer_record(last_attention_, layer, "last_attention");
}
std::vector<float> CpuDecodeEngine::last_queries(int layer) const {
  return detail::layer_record(last_queries_, layer, "last_queries");
}

std::unique_ptr<EngineImpl> make_cpu_engine(const ModelSpec& model, const EngineConfig& config) {
  return std::make_unique<CpuDecodeEngine>(model, config);
}
}  // namespace hisparse::detail
