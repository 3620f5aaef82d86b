// The CUDA decode engine's sublayers: GQA and MLA attention with their row selection (DSA
// indexer, exact top-k, Fathom, the HiSparse swap-in), the quality samples, and the FFN (dense,
// MoE with the fused experts or GEMMs, shared experts). The class is in detail/cuda_engine.hpp.
#include "model/detail/cuda_engine.hpp"

namespace hisparse::detail {

void CudaDecodeEngine::attention_gqa(int l, StepStats& stats) {
  const GqaShape& g = model_.gqa;
  const int H = model_.hidden, hd = g.head_dim, qh = g.q_heads, kvh = g.kv_heads;
  const std::int64_t pos = seq_len_;
  float* q = q_.device_data();
  {
    HISPARSE_RANGE("qkv", Phase::gemm);
    GpuPhaseClock::Scope t(clock_, "attention");
    linear(h_.device_data(), wl(l, "self_attn.q_proj.weight"), q, batch_, qh * hd, H);
    linear(h_.device_data(), wl(l, "self_attn.k_proj.weight"), k_.device_data(), batch_, kvh * hd,
           H);
    linear(h_.device_data(), wl(l, "self_attn.v_proj.weight"), v_.device_data(), batch_, kvh * hd,
           H);
    if (g.qk_norm) {
      rmsnorm(q, w(l, "self_attn.q_norm.weight"), q, batch_ * qh, hd);
      rmsnorm(k_.device_data(), w(l, "self_attn.k_norm.weight"), k_.device_data(), batch_ * kvh,
              hd);
    }
    rope(q, qh, hd, 0, hd);
    rope(k_.device_data(), kvh, hd, 0, hd);
  }
  workload_queries(l);
  {
    GpuPhaseClock::Scope t(clock_, "attention");
    kernels::BlendQueriesArgs bq;
    bq.workload = workload_q_.device_data();
    bq.q = q;
    bq.rows = batch_ * qh;
    bq.n = hd;
    bq.share = model_query_share_;
    kernels::launch_blend_queries(bq, s());
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(query_record_[zu(l)].device_data(), q,
                                        zu(batch_) * zu(qh) * zu(hd) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s()));
    query_floats_[zu(l)] = std::int64_t{batch_} * qh * hd;
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    GpuPhaseClock::Scope t(clock_, "append");
    // k_ and v_ are rounded to bf16 in place by the first store: what every reader sees.
    // Into the cache at each stream's position (read on the GPU), or packed (no positions).
    auto store = [&](float* src, std::uint16_t* dst, std::int64_t dst_stride, bool at_position) {
      kernels::StoreBf16RowsArgs st;
      st.src = src;
      st.dst = dst;
      st.rows = batch_ * kvh;
      st.width = hd;
      st.dst_stride = dst_stride;
      st.dst_positions = at_position ? stream_positions() : nullptr;
      kernels::launch_store_bf16_rows(st, s());
    };
    if (keys_on_gpu(l))
      store(k_.device_data(), k_cache_[zu(l)].device_data(), capacity_ * hd, true);
    if (values_on_gpu(l))
      store(v_.device_data(), v_cache_[zu(l)].device_data(), capacity_ * hd, true);
    if (hot_rows_) {  // [K | V] rows of every stream, then into the pool and the newest slot
      store(k_.device_data(), new_rows_.device_data(), 2 * hd, false);
      store(v_.device_data(), new_rows_.device_data() + hd, 2 * hd, false);
      hot_rows_->append_device(l, pos + 1, new_rows_.device_data(), stream_positions(), stream_);
    }
    if (fathom_index_) {
      fathom_k_host_.resize(zu(streams_) * zu(hd));
      HISPARSE_CUDA_CHECK(cudaMemcpyAsync(fathom_k_host_.data(), k_.device_data(),
                                          fathom_k_host_.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, s()));
      stream_.synchronize();
      fathom_index_->append(l, fathom_k_host_.data());
    }
  }
  kernels::DecodeAttentionArgs a;
  a.q = q;
  a.k_bf16 = k_cache_[zu(l)].device_data();  // replaced by the hot rows in the hisparse modes
  a.v_bf16 = v_cache_[zu(l)].device_data();
  a.seq_lens = lens();
  a.batch = batch_;
  a.q_heads = qh;
  a.kv_heads = kvh;
  a.qk_dim = hd;
  a.v_dim = hd;
  a.capacity = capacity_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (sparse_) {
    {
      HISPARSE_RANGE("exact_scores", Phase::indexer);
      GpuPhaseClock::Scope t(clock_, "indexer");
      kernels::GroupAttentionMassArgs m;
      m.q = q;
      m.k_bf16 = a.k_bf16;
      m.seq_lens = lens();
      m.mass = mass_.device_data();
      m.batch = batch_;
      m.q_heads = qh;
      m.kv_heads = kvh;
      m.qk_dim = hd;
      m.capacity = capacity_;
      m.scale = a.scale;
      kernels::launch_group_attention_mass(m, s());
    }
    HISPARSE_RANGE("topk", Phase::topk);
    GpuPhaseClock::Scope t(clock_, "topk");
    kernels::TopkArgs tk;
    tk.scores = mass_.device_data();
    tk.lengths = stream_lens();
    tk.out = indices_.device_data();
    tk.rows = batch_ * kvh;
    tk.stride = capacity_;
    tk.k = top_k_;
    kernels::launch_topk(tk, s());
    a.indices = indices_.device_data();
    a.top_k = top_k_;
    a.index_groups = kvh;
  } else if (fathom_) {
    HISPARSE_RANGE("fathom_select", Phase::scan);
    const auto t0 = Clock::now();
    fathom_q_host_.resize(zu(batch_) * zu(qh) * zu(hd));
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(fathom_q_host_.data(), q,
                                        fathom_q_host_.size() * sizeof(float),
                                        cudaMemcpyDeviceToHost, s()));
    stream_.synchronize();
    fathom_indices_host_.assign(zu(streams_) * zu(width_), -1);
    const FathomSelectStats fs =
        fathom_index_->select(l, fathom_q_host_.data(), fathom_indices_host_.data());
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(indices_.device_data(), fathom_indices_host_.data(),
                                        fathom_indices_host_.size() * sizeof(std::int32_t),
                                        cudaMemcpyHostToDevice, s()));
    stream_.synchronize();
    // The selector runs on its own stream and waits for it: its time is the host's.
    stats.phase_ms["scan"] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    stats.bytes_scanned += fs.bytes_scanned;
    stats.plans += fs.plans;
    stats.plan_bits += fs.plan_bits;
    stats.plan_active_channels += fs.active_channels;
    if (!hot_rows_)
      stats.bytes_h2d += fs.rows_selected * static_cast<std::int64_t>(deployed_row_bytes_);
    a.indices = indices_.device_data();
    a.top_k = width_;
    a.index_groups = kvh;
  }
  if (hot_rows_) {
    swap_in(l, a.indices);
    read_hot_rows(l, a);
  }
  {
    HISPARSE_RANGE("attention", Phase::attention);
    GpuPhaseClock::Scope t(clock_, "attention");
    a.out = attention_out_[zu(l)].device_data();
    kernels::launch_decode_attention(a, s());
  }
  attention_floats_[zu(l)] = std::int64_t{batch_} * qh * hd;
  measure_quality(l, a, kvh, stats);
  HISPARSE_RANGE("o_proj", Phase::gemm);
  GpuPhaseClock::Scope t(clock_, "attention");
  linear(a.out, wl(l, "self_attn.o_proj.weight"), x_.device_data(), batch_, H, qh * hd, 1.0f);
}

void CudaDecodeEngine::attention_mla(int l, StepStats& stats) {
  const MlaShape& m = model_.mla;
  const int H = model_.hidden, heads = m.heads, nope = m.qk_nope_head_dim,
            rope_dim = m.qk_rope_head_dim;
  const int lora = m.kv_lora_rank, vd = m.v_head_dim, qk = nope + rope_dim, row = lora + rope_dim;
  const std::int64_t pos = seq_len_;
  const std::string kv_b =
      layer_tensor_name(model_, l, "self_attn.kv_b_proj.weight", config_.share_layer_weights);
  float* q = q_.device_data();
  float* q_abs = q_model_.device_data();
  {
    HISPARSE_RANGE("q_a", Phase::gemm);
    GpuPhaseClock::Scope t(clock_, "attention");
    linear(h_.device_data(), wl(l, "self_attn.q_a_proj.weight"), q_a_.device_data(), batch_,
           m.q_lora_rank, H);
    rmsnorm(q_a_.device_data(), w(l, "self_attn.q_a_layernorm.weight"), q_a_.device_data(), batch_,
            m.q_lora_rank);
  }
  workload_queries(l);
  // The rows attention reads (indexer, top-k, swap-in) need only h and q_a: with
  // overlap_selection they are chosen on the selection stream while this stream projects the
  // queries and the new KV row, and attention waits for both.
  const bool indexes = model_.has_indexer() && indexer_layer(l) == l;
  auto select_rows = [&] {
    if (indexes) select_dsa(l);
    if (hot_rows_) swap_in(l, indices_.device_data());
  };
  const bool overlap = config_.overlap_selection && (indexes || hot_rows_);
  if (overlap) {
    SelectionLane lane(*this);
    select_rows();
  }
  {
    HISPARSE_RANGE("q_kv", Phase::gemm);
    GpuPhaseClock::Scope t(clock_, "attention");
    linear(q_a_.device_data(), wl(l, "self_attn.q_b_proj.weight"), q, batch_, heads * qk,
           m.q_lora_rank);
    linear(h_.device_data(), wl(l, "self_attn.kv_a_proj_with_mqa.weight"), kv_.device_data(),
           batch_, row, H);
    rmsnorm(kv_.device_data(), w(l, "self_attn.kv_a_layernorm.weight"), kv_.device_data(), batch_,
            lora, row);
    rope(q, heads, qk, nope, rope_dim);
    rope(kv_.device_data(), 1, row, lora, rope_dim, row);
    kernels::MlaAbsorbArgs ab;
    ab.q = q;
    if (mla_tensor_cores_)
      ab.uk_t_bf16 = linear_weight(kv_b + kUkTransposed).bf16;
    else
      ab.kv_b = weight(kv_b);
    ab.out = q_abs;
    ab.batch = batch_;
    ab.heads = heads;
    ab.nope = nope;
    ab.rope = rope_dim;
    ab.lora = lora;
    ab.v_dim = vd;
    kernels::launch_mla_absorb(ab, s());
  }
  {
    GpuPhaseClock::Scope t(clock_, "attention");
    kernels::BlendQueriesArgs bq;
    bq.workload = workload_q_.device_data();
    bq.q = q_abs;
    bq.rows = batch_ * heads;
    bq.n = row;
    bq.share = model_query_share_;
    kernels::launch_blend_queries(bq, s());
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(query_record_[zu(l)].device_data(), q_abs,
                                        zu(batch_) * zu(heads) * zu(row) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s()));
    query_floats_[zu(l)] = std::int64_t{batch_} * heads * row;
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    GpuPhaseClock::Scope t(clock_, "append");
    // kv_ is rounded to bf16 in place by the first store: what every reader sees.
    kernels::StoreBf16RowsArgs st;
    st.src = kv_.device_data();
    st.rows = batch_;
    st.width = row;
    if (keys_on_gpu(l)) {
      st.dst = k_cache_[zu(l)].device_data();
      st.dst_stride = capacity_ * row;
      st.dst_positions = positions();  // read on the GPU: a graph replays at every position
      kernels::launch_store_bf16_rows(st, s());
    }
    if (hot_rows_) {
      st.dst = new_rows_.device_data();
      st.dst_stride = row;
      st.dst_positions = nullptr;
      kernels::launch_store_bf16_rows(st, s());
      hot_rows_->append_device(l, pos + 1, new_rows_.device_data(), stream_positions(), stream_);
    }
  }
  if (overlap)
    join_selection();
  else
    select_rows();
  kernels::DecodeAttentionArgs a;
  a.q = q_abs;
  a.k_bf16 = k_cache_[zu(l)].device_data();  // replaced by the hot rows in the hisparse modes
  a.v_bf16 = a.k_bf16;
  a.seq_lens = lens();
  a.out = attention_out_[zu(l)].device_data();
  a.batch = batch_;
  a.q_heads = heads;
  a.kv_heads = 1;
  a.qk_dim = row;
  a.v_dim = lora;
  a.capacity = capacity_;
  a.k_row_stride = row;
  a.v_row_stride = row;
  a.scale = 1.0f / std::sqrt(static_cast<float>(qk));
  if (sparse_) {
    a.indices = indices_.device_data();
    a.top_k = top_k_;
    a.index_groups = 1;
  }
  if (hot_rows_) read_hot_rows(l, a);
  {
    HISPARSE_RANGE("attention", Phase::attention);
    GpuPhaseClock::Scope t(clock_, "attention");
    if (kernels::mla_decode_attention_supports(a)) {  // tensor cores, one tile for all heads
      const auto plan = kernels::plan_mla_decode_attention(
          batch_, heads, a.indices != nullptr ? a.top_k : a.capacity, kernels::multiprocessors());
      kernels::launch_mla_decode_attention(a, plan, mla_workspace_.device_data(),
                                           mla_workspace_.size(), s());
    } else {
      kernels::launch_decode_attention(a, s());
    }
  }
  attention_floats_[zu(l)] = std::int64_t{batch_} * heads * lora;
  measure_quality(l, a, 1, stats);
  HISPARSE_RANGE("o_proj", Phase::gemm);
  GpuPhaseClock::Scope t(clock_, "attention");
  kernels::MlaUpProjectArgs up;
  up.latent = a.out;
  if (mla_tensor_cores_)
    up.kv_b_bf16 = linear_weight(kv_b).bf16;
  else
    up.kv_b = weight(kv_b);
  up.out = o_.device_data();
  up.batch = batch_;
  up.heads = heads;
  up.nope = nope;
  up.lora = lora;
  up.v_dim = vd;
  kernels::launch_mla_up_project(up, s());
  linear(o_.device_data(), wl(l, "self_attn.o_proj.weight"), x_.device_data(), batch_, H,
         heads * vd, 1.0f);
}

void CudaDecodeEngine::select_dsa(int l) {
  const IndexerShape& ix = model_.indexer;
  const int H = model_.hidden;
  {
    HISPARSE_RANGE("indexer_proj", Phase::indexer);
    GpuPhaseClock::Scope t(clock_, "indexer");
    linear(h_.device_data(), wl(l, "self_attn.indexer.wk.weight"), ix_k_.device_data(), batch_,
           ix.head_dim, H);
    rmsnorm(ix_k_.device_data(), w(l, "self_attn.indexer.k_norm.weight"), ix_k_.device_data(),
            batch_, ix.head_dim);
    kernels::AddBiasArgs bias;
    bias.x = ix_k_.device_data();
    bias.bias = w(l, "self_attn.indexer.k_norm.bias");
    bias.rows = batch_;
    bias.width = ix.head_dim;
    kernels::launch_add_bias(bias, s());
  }
  {
    HISPARSE_RANGE("append", Phase::append);
    GpuPhaseClock::Scope t(clock_, "append");
    kernels::QuantizeIndexKeysArgs qk;
    qk.keys = ix_k_.device_data();
    qk.codes = index_keys_[zu(l)].device_data();
    qk.scales = index_scales_[zu(l)].device_data();
    qk.rows = batch_;
    qk.dim = ix.head_dim;
    qk.key_stride = ix.head_dim;
    qk.dest_row_stride = capacity_;
    qk.dest_positions = positions();
    kernels::launch_quantize_index_keys(qk, s());
  }
  if (!sparse_) return;
  workload_index_queries(l);
  {
    HISPARSE_RANGE("indexer", Phase::indexer);
    GpuPhaseClock::Scope t(clock_, "indexer");
    linear(q_a_.device_data(), wl(l, "self_attn.indexer.wq_b.weight"), ix_q_.device_data(), batch_,
           ix.heads * ix.head_dim, model_.mla.q_lora_rank);
    linear(h_.device_data(), wl(l, "self_attn.indexer.weights_proj.weight"), ix_w_.device_data(),
           batch_, ix.heads, H);
    kernels::BlendQueriesArgs bq;
    bq.workload = ix_workload_q_.device_data();
    bq.q = ix_q_.device_data();
    bq.rows = batch_ * ix.heads;
    bq.n = ix.head_dim;
    bq.share = model_query_share_;
    kernels::launch_blend_queries(bq, s());
    kernels::IndexerHeadWeightsArgs hw;
    hw.w = ix_w_.device_data();
    hw.rows = batch_;
    hw.heads = ix.heads;
    hw.share = model_query_share_;
    kernels::launch_indexer_head_weights(hw, s());
    kernels::IndexerArgs a;
    a.q = ix_q_.device_data();
    a.weights = ix_w_.device_data();
    a.keys = index_keys_[zu(l)].device_data();
    a.key_scales = index_scales_[zu(l)].device_data();
    a.seq_lens = lens();
    a.scores = scores_.device_data();
    a.batch = batch_;
    a.heads = ix.heads;
    a.dim = ix.head_dim;
    a.capacity = capacity_;
    kernels::launch_indexer(a, s());  // its bytes: CudaDecodeEngine::selection_bytes()
  }
  HISPARSE_RANGE("topk", Phase::topk);
  GpuPhaseClock::Scope t(clock_, "topk");
  kernels::TopkArgs tk;
  tk.scores = scores_.device_data();
  tk.lengths = lens();
  tk.out = indices_.device_data();
  tk.rows = batch_;
  tk.stride = capacity_;
  tk.k = top_k_;
  kernels::launch_topk(tk, s());
}

void CudaDecodeEngine::swap_in(int l, const std::int32_t* selected) {
  HISPARSE_RANGE("swap_in", Phase::swap_in);
  GpuPhaseClock::Scope t(clock_, "swap_in");
  // Asynchronous: the step's hits and misses are read once it has finished (CudaDecodeEngine::step).
  // Independent of this layer's append_device: the new token is a hit in the reserved slot, which
  // the swap-in never writes, and the pool rows it copies were written by earlier steps.
  hot_rows_->swap_in_device(l, selected, seq_len_ + 1, stream_lens(), slots_.device_data(), *lane_);
}

void CudaDecodeEngine::read_hot_rows(int l, kernels::DecodeAttentionArgs& a) const {
  const auto* rows = reinterpret_cast<const std::uint16_t*>(hot_rows_->layer_rows_bytes(l));
  a.k_bf16 = rows;
  a.v_bf16 = model_.is_mla() ? rows : rows + key_dim_;
  a.kv_heads = model_.is_mla() ? 1 : kv_heads_;
  a.capacity = hot_slots_ + 1;
  a.k_row_stride = hot_rows_->shape().row_elements;
  a.v_row_stride = hot_rows_->shape().row_elements;
  a.indices = slots_.device_data();
}

// As the CPU engine: recall of the selection and the error of the attention output against dense
// attention over the whole cache, on the first and last layers. Dense attention runs on the GPU;
// the recall's exact top-k per head runs on the host over the layer's keys (not timed in the step).
void CudaDecodeEngine::measure_quality(int l, const kernels::DecodeAttentionArgs& sparse,
                                       int groups, StepStats& stats) {
  if (!samples_quality(l)) return;
  stream_.synchronize();  // the step's work so far counts in the step, not in quality_ms
  const auto t0 = Clock::now();
  const std::uint16_t* k = k_cache_[zu(l)].device_data();
  kernels::DecodeAttentionArgs d = dense_twin(sparse, nullptr, nullptr, capacity_, lens());
  d.k_bf16 = k;
  d.v_bf16 = model_.is_mla() ? k : v_cache_[zu(l)].device_data();
  const size_t out_floats = zu(batch_) * zu(d.q_heads) * zu(d.v_dim);
  auto dense_dev = Buffer<float>::device(out_floats, Backend::cuda, "quality: dense attention");
  d.out = dense_dev.device_data();
  kernels::launch_decode_attention(d, s());
  // The recall's exact top-k and the error run on the host, over copies of the layer's inputs.
  std::vector<float> dense(out_floats), sparse_out(out_floats);
  std::vector<float> q(zu(batch_) * zu(d.q_heads) * zu(d.qk_dim));
  std::vector<float> keys(zu(batch_) * zu(d.kv_heads) * zu(capacity_) * zu(key_dim_));
  std::vector<std::int32_t> selected(zu(batch_) * zu(groups) * zu(std::max(width_, 1)));
  stream_.synchronize();
  copy_bytes(dense.data(), d.out, out_floats * sizeof(float), Backend::cuda);
  copy_bytes(sparse_out.data(), sparse.out, out_floats * sizeof(float), Backend::cuda);
  copy_bytes(q.data(), sparse.q, q.size() * sizeof(float), Backend::cuda);
  std::vector<std::uint16_t> keys_bf16(keys.size());
  copy_bytes(keys_bf16.data(), k, keys_bf16.size() * sizeof(std::uint16_t), Backend::cuda);
  std::transform(keys_bf16.begin(), keys_bf16.end(), keys.begin(), bf16_to_float);
  copy_bytes(selected.data(), indices_.device_data(), selected.size() * sizeof(std::int32_t),
             Backend::cuda);
  d.k = keys.data();
  d.k_bf16 = d.v_bf16 = nullptr;
  add_quality_sample(d, q.data(), keys.data(), selected.data(), groups, sparse_out.data(),
                     dense.data());
  stats.quality_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// gate/up of `prefix` over the whole batch into gate_up_, then SwiGLU into act_.
void CudaDecodeEngine::swiglu_block(int l, const std::string& prefix, int width) {
  const int H = model_.hidden;
  linear(h_.device_data(), wl(l, prefix + "gate_proj.weight"), gate_up_.device_data(), batch_,
         width, H, 0.0f, 2 * width);
  linear(h_.device_data(), wl(l, prefix + "up_proj.weight"), gate_up_.device_data() + width, batch_,
         width, H, 0.0f, 2 * width);
  kernels::SwigluArgs sw;
  sw.gate_up = gate_up_.device_data();
  sw.out = act_.device_data();
  sw.rows = batch_;
  sw.width = width;
  kernels::launch_swiglu(sw, s());
}

// The FFN, added to x_. MoE: the router's weights per token and expert (0 where not routed), then
// the routed experts: fused (kernels/moe: only routed (expert, token) pairs, 2 launches) for
// decode batches, else every expert over the whole batch as GEMMs with its rows scaled by their
// weights (exact in value, wasteful in work).
void CudaDecodeEngine::ffn(int l) {
  const int H = model_.hidden;
  const FfnShape& f = model_.ffn;
  if (f.kind == FfnKind::dense || l < f.first_dense_layers) {
    swiglu_block(l, "mlp.", f.dense_width);
    linear(act_.device_data(), wl(l, "mlp.down_proj.weight"), x_.device_data(), batch_, H,
           f.dense_width, 1.0f);
    return;
  }
  linear(h_.device_data(), wl(l, "mlp.gate.weight"), router_logits_.device_data(), batch_,
         f.experts_held, H);
  kernels::MoeRouteArgs route;
  route.logits = router_logits_.device_data();
  route.weights = route_weights_.device_data();
  route.tokens = batch_;
  route.experts = f.experts_held;
  route.active = f.active_experts;
  kernels::launch_moe_route(route, s());
  if (fused_experts_) {
    const void* const* table = expert_tables_[zu(l - f.first_dense_layers)].device_data();
    kernels::MoeExpertsArgs m;
    m.h = h_.device_data();
    m.route_weights = route_weights_.device_data();
    m.gate = table;
    m.up = table + f.experts_held;
    m.down = table + 2 * f.experts_held;
    m.bf16 = config_.bf16_gemm;
    m.act = expert_act_.size() > 0 ? expert_act_.device_data() : nullptr;
    m.workspace = expert_workspace_.size() > 0 ? expert_workspace_.device_data() : nullptr;
    m.workspace_bytes = expert_workspace_.size();
    m.x = x_.device_data();
    m.tokens = batch_;
    m.experts = f.experts_held;
    m.hidden = H;
    m.width = f.expert_width;
    kernels::launch_moe_experts(m, s());
  }
  for (int e = 0; !fused_experts_ && e < f.experts_held; ++e) {
    const std::string prefix = fmt::format("mlp.experts.{}.", e);
    swiglu_block(l, prefix, f.expert_width);
    kernels::ScaleRowsArgs sc;
    sc.x = act_.device_data();
    sc.factors = route_weights_.device_data() + e;
    sc.rows = batch_;
    sc.width = f.expert_width;
    sc.factor_stride = f.experts_held;
    kernels::launch_scale_rows(sc, s());
    linear(act_.device_data(), wl(l, prefix + "down_proj.weight"), x_.device_data(), batch_, H,
           f.expert_width, 1.0f);
  }
  if (f.shared_experts > 0) {
    const int width = f.shared_experts * f.expert_width;
    swiglu_block(l, "mlp.shared_experts.", width);
    linear(act_.device_data(), wl(l, "mlp.shared_experts.down_proj.weight"), x_.device_data(),
           batch_, H, width, 1.0f);
  }
}

}  // namespace hisparse::detail
