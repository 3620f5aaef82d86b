// The CPU decode engine's layers: GQA and MLA attention (dense, sparse, hot-buffer and Fathom
// selections), the DSA indexer's selection and the FFN (dense or MoE).
#include "model/detail/cpu_engine.hpp"

namespace hisparse::detail {
using namespace cpu;  // NOLINT: the engine's own host helpers

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

}  // namespace hisparse::detail
