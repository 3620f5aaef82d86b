// The CUDA decode engine: the CPU engine's decode step (cpu_engine.cpp) with every phase on the
// GPU, in all five modes, checked against that twin on the tiny models (tests/gpu) and, on any
// scenario, by `run --verify`. KV rows are bf16 in both engines; GEMMs fp32 (the default, within
// float rounding of the twin) or bf16 (deployment.gemm_dtype).
//
// What is on the GPU: the embedding gather, RMSNorm, every linear layer (cuBLASLt), RoPE, the MLA
// absorption and up-projection, the KV append, the DSA indexer and its fp8 index keys, the exact
// top-k, the GQA baseline's group attention mass, attention over all rows or a selection, the
// HiSparse swap-in (the existing kernel), the Fathom plane scan (the existing selector), the
// MoE router, experts (fused for decode batches, kernels/moe) and shared expert, the LM head and the
// greedy argmax.
// A synthetic workload is made on the GPU (kernels/workload: the context's KV rows and index keys
// at construction, each step's queries per layer), bit for bit KvWorkload's values; a replayed
// capture is read on the host and copied up.
// Steps from the second on replay one CUDA graph of the whole step (EngineConfig::cuda_graph):
// every per-step value (positions, lengths, the workload's step) is read by the kernels from
// device memory that the graph's first copy fills from pinned memory. What crosses to the host
// inside a step, and so runs eagerly: a replayed capture's queries, the Fathom selector's queries
// and selections, and the quality samples. The swap-in's counts and selections land in pinned
// memory and are read with the next tokens once the step has finished.
#include "model/detail/cuda_engine.hpp"

namespace hisparse::detail {

CudaDecodeEngine::CudaDecodeEngine(const ModelSpec& model, const EngineConfig& config)
    : EngineImpl(model, config),
      workload_(model, config.workload, config.concurrency, config.context_length) {
  HISPARSE_FUNC_RANGE();
  derive_sizes(workload_);
  const int steps = config.max_decode_steps > 0 ? config.max_decode_steps : kDefaultDecodeSteps;
  capacity_ = seq_len_ + steps;
  const bool mla = model.is_mla();
  mla_tensor_cores_ = mla && config.bf16_gemm &&
                      kernels::mla_projections_use_tensor_cores(
                          model.mla.qk_nope_head_dim, model.mla.qk_rope_head_dim,
                          model.mla.kv_lora_rank, model.mla.v_head_dim);

  upload_weights(
      ModelWeights(model, config.share_layer_weights));  // the config was validated by DecodeEngine

  // Activations, sized for the largest use of each.
  const int H = model.hidden, B = batch_;
  const std::int64_t q_floats =
      mla ? std::int64_t{B} * model.mla.heads *
                std::max(model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim,
                         model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)
          : std::int64_t{B} * model.gqa.q_heads * model.gqa.head_dim;
  x_ = gpu<float>(std::int64_t{B} * H, "activations");
  h_ = gpu<float>(std::int64_t{B} * H, "activations (normed)");
  q_ = gpu<float>(q_floats, "queries");
  q_model_ = gpu<float>(q_floats, "absorbed queries");
  workload_q_ = gpu<float>(q_floats, "workload queries");
  workload_host_ = Buffer<float>::pinned(zu(q_floats), Backend::cuda, "workload queries (host)");
  if (mla) {
    const MlaShape& m = model.mla;
    q_a_ = gpu<float>(std::int64_t{B} * m.q_lora_rank, "MLA q_a");
    kv_ = gpu<float>(std::int64_t{B} * (m.kv_lora_rank + m.qk_rope_head_dim), "MLA latent");
    lat_ = gpu<float>(std::int64_t{B} * m.heads * m.kv_lora_rank, "MLA attended latent");
    o_ = gpu<float>(std::int64_t{B} * m.heads * m.v_head_dim, "MLA values");
  } else {
    k_ = gpu<float>(std::int64_t{B} * kv_heads_ * model.gqa.head_dim, "new keys");
    v_ = gpu<float>(std::int64_t{B} * kv_heads_ * model.gqa.head_dim, "new values");
    mass_ = gpu<float>(std::int64_t{B} * kv_heads_ * capacity_, "exact top-k scores");
  }
  if (model.has_indexer()) {
    const IndexerShape& ix = model.indexer;
    ix_q_ = gpu<float>(std::int64_t{B} * ix.heads * ix.head_dim, "indexer queries");
    ix_k_ = gpu<float>(std::int64_t{B} * ix.head_dim, "indexer new keys");
    ix_w_ = gpu<float>(std::int64_t{B} * ix.heads, "indexer head weights");
    ix_workload_q_ =
        gpu<float>(std::int64_t{B} * ix.heads * ix.head_dim, "indexer workload queries");
    scores_ = gpu<float>(std::int64_t{B} * capacity_, "indexer scores");
    if (ix.heads * ix.head_dim > q_floats)
      throw Error(fmt::format("model {}", model.name), "indexer queries outgrow the query buffer",
                  "report this: the engine sizes its workload staging by the attention queries");
  }
  const FfnShape& f = model.ffn;
  const int widest = std::max({f.dense_width, f.expert_width, f.shared_experts * f.expert_width});
  gate_up_ = gpu<float>(std::int64_t{B} * 2 * widest, "FFN gate/up");
  act_ = gpu<float>(std::int64_t{B} * widest, "FFN activation");
  if (f.kind == FfnKind::moe) {
    router_logits_ = gpu<float>(std::int64_t{B} * f.experts_held, "router logits");
    route_weights_ = gpu<float>(std::int64_t{B} * f.experts_held, "routing weights");
    fused_experts_ =
        B <= kernels::kMoeExpertsMaxTokens && model.hidden % 8 == 0 && f.expert_width % 8 == 0;
    if (fused_experts_) {
      kernels::MoeExpertsArgs shape;
      shape.bf16 = config_.bf16_gemm;
      shape.tokens = B;
      shape.experts = f.experts_held;
      shape.hidden = model.hidden;
      shape.width = f.expert_width;
      // The tensor-core path keeps its activations in its workspace; the CUDA-core one in act.
      if (kernels::moe_experts_use_tensor_cores(shape))
        expert_workspace_ = gpu<std::uint8_t>(
            static_cast<std::int64_t>(kernels::moe_experts_workspace_bytes(shape)),
            "MoE expert workspace");
      else
        expert_act_ =
            gpu<float>(std::int64_t{f.experts_held} * B * f.expert_width, "MoE expert activations");
      for (int l = f.first_dense_layers; l < model.layers; ++l) {
        std::vector<const void*> table;
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
          for (int e = 0; e < f.experts_held; ++e) {
            const LinearWeight lw = wl(l, fmt::format("mlp.experts.{}.{}.weight", e, proj));
            table.push_back(lw.bf16 != nullptr ? static_cast<const void*>(lw.bf16)
                                               : static_cast<const void*>(lw.f32));
          }
        expert_tables_.push_back(upload(table, "MoE expert weight table"));
      }
    }
  }
  logits_ = gpu<float>(std::int64_t{B} * model.vocab, "LM head logits");
  tokens_ = gpu<std::int32_t>(B, "tokens");
  tokens_host_ = Buffer<std::int32_t>::pinned(zu(B), Backend::cuda, "tokens (host)");
  if (config_.check_finite) {
    first_non_finite_ = gpu<std::int32_t>(1, "non-finite check");
    first_non_finite_host_ = Buffer<std::int32_t>::pinned(1, Backend::cuda, "non-finite check");
  }
  const std::int64_t state = 2 * std::int64_t{B} + 2 * std::int64_t{streams_} + 1;
  step_state_ = gpu<std::int64_t>(state, "step positions and lengths");
  step_state_host_ =
      Buffer<std::int64_t>::pinned(zu(state), Backend::cuda, "step positions and lengths (host)");
  const std::vector<std::int32_t> first = first_tokens();
  std::copy(first.begin(), first.end(), tokens_host_.host_data());
  copy_bytes(tokens_.device_data(), tokens_host_.host_data(), zu(B) * sizeof(std::int32_t),
             Backend::cuda);
  const int heads = mla ? model.mla.heads : model.gqa.q_heads;
  const int attn_dim = mla ? model.mla.kv_lora_rank : model.gqa.head_dim;
  const int q_dim = mla ? model.mla.kv_lora_rank + model.mla.qk_rope_head_dim : model.gqa.head_dim;
  for (int l = 0; l < model.layers; ++l) {
    attention_out_.push_back(gpu<float>(std::int64_t{B} * heads * attn_dim, "attention outputs"));
    query_record_.push_back(gpu<float>(std::int64_t{B} * heads * q_dim, "attention queries"));
  }
  attention_floats_.assign(zu(model.layers), 0);
  if (mla) {
    const int splits = kernels::mla_decode_max_splits(B, heads, kernels::multiprocessors());
    mla_workspace_ = gpu<float>(
        static_cast<std::int64_t>(kernels::mla_decode_workspace_floats(B, heads, attn_dim, splits)),
        "MLA attention partial sums");
  }
  query_floats_.assign(zu(model.layers), 0);
  new_rows_ = gpu<std::uint16_t>(std::int64_t{B} * kv_heads_ * (key_dim_ + (mla ? 0 : value_dim_)),
                                 "new KV rows (bf16)");
  fill_context();
  // Selections: [streams][width] (fathom) or [batch][groups][top_k].
  const std::int64_t selection = std::int64_t{streams_} * std::max(width_, 1);
  indices_ = gpu<std::int32_t>(
      std::max<std::int64_t>(selection, std::int64_t{B} * kv_heads_ * top_k_), "selections");
  slots_ = gpu<std::int32_t>(std::max<std::int64_t>(selection, std::int64_t{B} * top_k_),
                             "hot-buffer slots");
}

const float* CudaDecodeEngine::weight(const std::string& name) const {
  const auto it = weights_.find(name);
  if (it == weights_.end())
    throw Error(fmt::format("model {}", model_.name), fmt::format("no tensor {}", name),
                "report this: the CUDA engine reads only the tensors expected_tensors() lists");
  return it->second.device_data();
}

CudaDecodeEngine::LinearWeight CudaDecodeEngine::linear_weight(const std::string& name) const {
  if (!config_.bf16_gemm) return {weight(name), nullptr};
  const auto it = weights_bf16_.find(name);
  if (it == weights_bf16_.end())
    throw Error(fmt::format("model {}", model_.name), fmt::format("no bf16 tensor {}", name),
                "report this: with bf16_gemm the CUDA engine holds every linear tensor but the "
                "embedding (and kv_b_proj where the MLA projections run on CUDA cores) in bf16");
  return {nullptr, it->second.device_data()};
}

// With bf16_gemm, linear tensors go up as bf16 (ModelWeights holds bf16 values, so the conversion
// is exact); the rest, and everything without it, as floats. The widest k of a linear layer sizes the GEMMs' bf16 activation scratch.
void CudaDecodeEngine::upload_weights(const ModelWeights& host) {
  HISPARSE_FUNC_RANGE();
  std::int64_t widest_k = 1;
  std::vector<std::uint16_t> bf16;
  for (const TensorSpec& t : expected_tensors(model_, config_.share_layer_weights)) {
    const float* values = host.get(t.name);
    const bool kv_b = t.name.ends_with("kv_b_proj.weight");
    const bool gemm = config_.bf16_gemm && t.init == TensorSpec::Init::linear &&
                      t.name != "model.embed_tokens.weight" && (!kv_b || mla_tensor_cores_);
    if (!gemm) {
      auto buf = Buffer<float>::device(zu(t.elements()), Backend::cuda, "model weights");
      copy_bytes(buf.device_data(), values, zu(t.elements()) * sizeof(float), Backend::cuda);
      weights_.emplace(t.name, std::move(buf));
      continue;
    }
    widest_k = std::max(widest_k, t.shape.back());
    bf16.resize(zu(t.elements()));
    std::transform(values, values + t.elements(), bf16.begin(), float_to_bf16);
    auto buf = Buffer<std::uint16_t>::device(bf16.size(), Backend::cuda, "model weights (bf16)");
    copy_bytes(buf.device_data(), bf16.data(), bf16.size() * sizeof(std::uint16_t), Backend::cuda);
    weights_bf16_.emplace(t.name, std::move(buf));
    if (kv_b) {  // the absorb reads W_uk transposed per head (MlaAbsorbArgs::uk_t_bf16)
      const MlaShape& m = model_.mla;
      std::vector<float> uk_t(zu(m.heads) * zu(m.kv_lora_rank) * zu(m.qk_nope_head_dim));
      kernels::mla_transpose_uk_ref(values, m.heads, m.qk_nope_head_dim, m.kv_lora_rank,
                                    m.v_head_dim, uk_t.data());
      bf16.resize(uk_t.size());
      std::transform(uk_t.begin(), uk_t.end(), bf16.begin(), float_to_bf16);
      auto uk = Buffer<std::uint16_t>::device(bf16.size(), Backend::cuda, "model weights (bf16)");
      copy_bytes(uk.device_data(), bf16.data(), bf16.size() * sizeof(std::uint16_t), Backend::cuda);
      weights_bf16_.emplace(t.name + kUkTransposed, std::move(uk));
    }
  }
  if (config_.bf16_gemm) {
    gemm_x_ = gpu<std::uint16_t>(std::int64_t{batch_} * widest_k, "GEMM activations (bf16)");
    if (config_.overlap_selection && model_.is_mla())  // only MLA layers open a SelectionLane
      gemm_x_selection_ = gpu<std::uint16_t>(std::int64_t{batch_} * widest_k,
                                             "GEMM activations on the selection stream (bf16)");
  }
}

void CudaDecodeEngine::upload_workload_tables() {
  const int L = model_.layers, G = kv_heads_, B = batch_;
  std::vector<float> scale, anchor;
  std::vector<std::uint64_t> key_seeds, value_seeds, query_seeds;
  std::vector<std::int32_t> channels;
  for (int l = 0; l < L; ++l) {
    for (int g = 0; g < G; ++g) {
      const auto& d = workload_.key_scale(l, g);
      const auto& a = workload_.key_anchor(l, g);
      scale.insert(scale.end(), d.begin(), d.end());
      anchor.insert(anchor.end(), a.begin(), a.end());
      for (int b = 0; b < B; ++b) {
        key_seeds.push_back(workload_.key_seed(b, l, g));
        value_seeds.push_back(workload_.value_seed(b, l, g));
      }
    }
    for (int b = 0; b < B; ++b) query_seeds.push_back(workload_.query_seed(b, l));
    if (workload_.index_dim() > 0)
      for (int c : workload_.index_channels(l)) channels.push_back(c);
    wl_query_state_.push_back(
        gpu<float>(std::int64_t{B} * workload_.q_heads() * key_dim_, "workload query walk"));
  }
  wl_scale_ = upload(scale, "workload channel scales");
  wl_anchor_ = upload(anchor, "workload anchors");
  wl_key_seeds_ = upload(key_seeds, "workload key seeds");
  wl_value_seeds_ = upload(value_seeds, "workload value seeds");
  wl_query_seeds_ = upload(query_seeds, "workload query seeds");
  wl_index_channels_ = upload(channels, "workload index channels");
}

// The context of every request on the GPU, the values KvWorkload gives: keys (and GQA values)
// straight into the layer's cache, DSA index keys through a float scratch into fp8.
void CudaDecodeEngine::synthesise_context(int l, std::uint16_t* k, std::uint16_t* v) {
  const int G = kv_heads_, B = batch_, D = key_dim_;
  const std::int64_t table = std::int64_t{l} * G;
  for (int g = 0; g < G; ++g) {
    kernels::SynthRowsArgs a;
    a.seeds = wl_key_seeds_.device_data() + (table + g) * B;
    a.scale = wl_scale_.device_data() + (table + g) * D;
    a.anchor = wl_anchor_.device_data() + (table + g) * D;
    a.boost = workload_.key_boost_params(l, g);
    a.out_bf16 = k + std::int64_t{g} * capacity_ * D;
    a.streams = B;
    a.dim = D;
    a.count = seq_len_;
    a.stream_stride = std::int64_t{G} * capacity_ * D;
    kernels::launch_synth_rows(a, s());
    if (model_.is_mla()) continue;
    a.seeds = wl_value_seeds_.device_data() + (table + g) * B;
    a.scale = a.anchor = nullptr;
    a.dim = value_dim_;
    a.out_bf16 = v + std::int64_t{g} * capacity_ * value_dim_;
    a.stream_stride = std::int64_t{G} * capacity_ * value_dim_;
    kernels::launch_synth_rows(a, s());
  }
  const int ix_dim = workload_.index_dim();
  if (ix_dim == 0 || indexer_layer(l) != l) return;
  auto scratch = gpu<float>(seq_len_ * ix_dim, "index keys (float, context)");
  for (int b = 0; b < B; ++b) {
    kernels::SynthRowsArgs a;
    a.seeds = wl_key_seeds_.device_data() + table * B + b;
    a.scale = wl_scale_.device_data() + table * D;
    a.anchor = wl_anchor_.device_data() + table * D;
    a.channels = wl_index_channels_.device_data() + std::int64_t{l} * ix_dim;
    a.boost = workload_.key_boost_params(l, 0);
    a.out = scratch.device_data();
    a.streams = 1;
    a.dim = D;
    a.out_dim = ix_dim;
    a.count = seq_len_;
    a.stream_stride = seq_len_ * ix_dim;
    kernels::launch_synth_rows(a, s());
    kernels::QuantizeIndexKeysArgs q;
    q.keys = scratch.device_data();
    q.codes = index_keys_[zu(l)].device_data();
    q.scales = index_scales_[zu(l)].device_data();
    q.rows = static_cast<int>(seq_len_);
    q.dim = ix_dim;
    q.key_stride = ix_dim;
    q.dest_row_stride = 1;
    q.dest_offset = std::int64_t{b} * capacity_;
    kernels::launch_quantize_index_keys(q, s());
  }
  stream_.synchronize();  // the scratch goes out of scope
}

// A replayed capture's context, read on the host by the workload as the CPU engine reads it.
void CudaDecodeEngine::read_context(int l, std::uint16_t* k, std::uint16_t* v) {
  const bool mla = model_.is_mla();
  const size_t groups = zu(batch_) * zu(kv_heads_), n = zu(seq_len_);
  std::vector<float> keys(groups * n * zu(key_dim_)), values(mla ? 0 : groups * n * zu(value_dim_));
  for (size_t g = 0; g < groups; ++g) {
    const int b = static_cast<int>(g / zu(kv_heads_)), kh = static_cast<int>(g % zu(kv_heads_));
    workload_.keys(b, l, kh, 0, seq_len_, keys.data() + g * n * zu(key_dim_));
    if (!mla) workload_.values(b, l, kh, 0, seq_len_, values.data() + g * n * zu(value_dim_));
  }
  auto put = [&](const std::vector<float>& src, int dim, std::uint16_t* dst) {
    std::vector<std::uint16_t> rows(src.size());
    std::transform(src.begin(), src.end(), rows.begin(), float_to_bf16);
    const size_t bytes = n * zu(dim) * sizeof(std::uint16_t);
    HISPARSE_CUDA_CHECK(cudaMemcpy2D(dst, zu(capacity_) * zu(dim) * sizeof(std::uint16_t),
                                     rows.data(), bytes, bytes, groups, cudaMemcpyHostToDevice));
    // Pageable uploads may return before they land; stream_ does not wait for the legacy stream.
    HISPARSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  };
  put(keys, key_dim_, k);
  if (!mla) put(values, value_dim_, v);
  const int ix_dim = workload_.index_dim();
  if (ix_dim == 0 || indexer_layer(l) != l) return;
  std::vector<float> ik(n * zu(ix_dim));
  std::vector<std::uint8_t> codes(zu(batch_) * zu(capacity_) * zu(ix_dim), 0);
  std::vector<float> scales(zu(batch_) * zu(capacity_), 0.0f);
  for (int b = 0; b < batch_; ++b) {
    workload_.index_keys(b, l, 0, seq_len_, ik.data());
    for (size_t t = 0; t < n; ++t) {
      const size_t row = zu(b) * zu(capacity_) + t;
      kernels::quantize_index_key(ik.data() + t * zu(ix_dim), ix_dim,
                                  codes.data() + row * zu(ix_dim), scales.data() + row);
    }
  }
  copy_bytes(index_keys_[zu(l)].device_data(), codes.data(), codes.size(), Backend::cuda);
  copy_bytes(index_scales_[zu(l)].device_data(), scales.data(), scales.size() * sizeof(float),
             Backend::cuda);
}

// Every layer's context made on the GPU (or a capture's copied up) as bf16 rows: into the layer's
// cache where it stays on the GPU, else into a one-layer scratch; from there into the host pool
// and the plane stores of the offloading modes.
void CudaDecodeEngine::fill_context() {
  HISPARSE_FUNC_RANGE();
  const bool mla = model_.is_mla();
  const int ix_dim = workload_.index_dim();
  const size_t groups = zu(batch_) * zu(kv_heads_);
  const std::int64_t k_elems = static_cast<std::int64_t>(groups) * capacity_ * key_dim_;
  const std::int64_t v_elems = mla ? 0 : static_cast<std::int64_t>(groups) * capacity_ * value_dim_;
  gpu_workload_ = !workload_.replay();
  if (gpu_workload_) upload_workload_tables();
  if (fathom_) {
    fathom_index_ = make_fathom_index(capacity_, Backend::cuda);
    width_ = fathom_index_->width();
  }
  hot_rows_ = make_hot_rows(capacity_, Backend::cuda, sizeof(std::uint16_t));
  auto zeroed = [](std::int64_t n, const char* label) {
    auto buf = gpu<std::uint16_t>(n, label);
    zero_bytes(buf.device_data(), buf.size() * sizeof(std::uint16_t), Backend::cuda);
    return buf;
  };
  Buffer<std::uint16_t> scratch_k, scratch_v;  // layers whose rows live in the host pool only
  std::vector<float> keys_host;
  std::vector<std::uint16_t> keys_bf16;
  for (int l = 0; l < model_.layers; ++l) {
    // One layer's keys or values, in its cache or in the scratch shared by the layers without.
    auto layer_rows = [&](bool on_gpu, std::int64_t n, std::vector<Buffer<std::uint16_t>>& cache,
                          Buffer<std::uint16_t>& scratch, const char* label) {
      cache.push_back(on_gpu ? zeroed(n, label) : Buffer<std::uint16_t>{});
      if (on_gpu) return cache.back().device_data();
      if (scratch.size() == 0) scratch = zeroed(n, "context rows (one layer, to the host pool)");
      return scratch.device_data();
    };
    std::uint16_t* k = layer_rows(keys_on_gpu(l), k_elems, k_cache_, scratch_k, "KV cache (keys)");
    std::uint16_t* v =
        mla ? nullptr
            : layer_rows(values_on_gpu(l), v_elems, v_cache_, scratch_v, "KV cache (values)");
    if (mla) v_cache_.emplace_back();
    if (ix_dim > 0 && indexer_layer(l) == l) {
      const std::int64_t rows = std::int64_t{batch_} * capacity_;
      auto codes = Buffer<std::uint8_t>::device(zu(rows * ix_dim), Backend::cuda, "index keys");
      auto sc = gpu<float>(rows, "index key scales");
      zero_bytes(codes.device_data(), codes.size(), Backend::cuda);
      zero_bytes(sc.device_data(), sc.size() * sizeof(float), Backend::cuda);
      index_keys_.push_back(std::move(codes));
      index_scales_.push_back(std::move(sc));
    } else {
      index_keys_.emplace_back();
      index_scales_.emplace_back();
    }
    if (gpu_workload_)
      synthesise_context(l, k, v);
    else
      read_context(l, k, v);
    stream_.synchronize();  // the copies below run on the default stream
    const size_t key_row = zu(key_dim_) * sizeof(std::uint16_t);
    const size_t value_row = zu(value_dim_) * sizeof(std::uint16_t);
    if (fathom_index_) {
      keys_bf16.resize(static_cast<size_t>(k_elems));
      keys_host.resize(keys_bf16.size());
      copy_bytes(keys_bf16.data(), k, keys_bf16.size() * sizeof(std::uint16_t), Backend::cuda);
      std::transform(keys_bf16.begin(), keys_bf16.end(), keys_host.begin(), bf16_to_float);
      fathom_index_->load_context(l, keys_host.data(), capacity_ * key_dim_, seq_len_);
    }
    if (!hot_rows_ || seq_len_ == 0) continue;
    const size_t pitch = hot_rows_->pool_row_stride();
    for (int st = 0; st < streams_; ++st) {
      std::uint8_t* row = hot_rows_->pool_row_bytes(st, l, 0);
      const std::uint16_t* ks = k + zu(st) * zu(capacity_) * zu(key_dim_);
      HISPARSE_CUDA_CHECK(
          cudaMemcpy2D(row, pitch, ks, key_row, key_row, zu(seq_len_), cudaMemcpyDeviceToHost));
      if (mla) continue;
      const std::uint16_t* vs = v + zu(st) * zu(capacity_) * zu(value_dim_);
      HISPARSE_CUDA_CHECK(cudaMemcpy2D(row + key_row, pitch, vs, value_row, value_row, zu(seq_len_),
                                       cudaMemcpyDeviceToHost));  // [K | V] rows
    }
  }
  if (hot_rows_) hot_rows_->admit_all(seq_len_);
}

std::vector<float> CudaDecodeEngine::download(const std::vector<Buffer<float>>& buffers,
                                              const std::vector<std::int64_t>& floats, int layer,
                                              const char* what) const {
  if (layer < 0 || layer >= model_.layers)
    throw Error(what, fmt::format("layer {} is outside 0..{}", layer, model_.layers - 1),
                "pass a layer of the model");
  std::vector<float> out(zu(floats[zu(layer)]));
  if (out.empty()) return out;
  stream_.synchronize();
  copy_bytes(out.data(), buffers[zu(layer)].device_data(), out.size() * sizeof(float),
             Backend::cuda);
  return out;
}

void CudaDecodeEngine::linear(const float* x, LinearWeight wt, float* y, int m, int n, int k,
                              float beta, int ldy, int ldx) const {
  kernels::GemmArgs a;
  a.x = x;
  a.w = wt.f32;
  a.w_bf16 = wt.bf16;
  const auto& scratch = lane_ == &selection_stream_ ? gemm_x_selection_ : gemm_x_;
  a.x_bf16 = wt.bf16 ? scratch.device_data() : nullptr;
  a.y = y;
  a.m = m;
  a.n = n;
  a.k = k;
  a.ldx = ldx;
  a.ldy = ldy;
  a.beta = beta;
  kernels::launch_gemm(a, s());
}

void CudaDecodeEngine::rmsnorm(const float* x, const float* weight, float* y, int rows, int n,
                               int ld) const {
  kernels::RmsNormArgs a;
  a.x = x;
  a.weight = weight;
  a.y = y;
  a.rows = rows;
  a.n = n;
  a.ldx = ld;
  a.ldy = ld;
  a.eps = model_.norm_eps;
  kernels::launch_rmsnorm(a, s());
}

void CudaDecodeEngine::rope(float* x, int heads, int head_stride, int offset, int dim,
                            int row_stride) const {
  kernels::RopeArgs r;
  r.x = x;
  r.positions = positions();
  r.rows = batch_;
  r.heads = heads;
  r.head_stride = head_stride;
  r.row_stride = row_stride;
  r.offset = offset;
  r.dim = dim;
  r.theta = model_.rope_theta;
  kernels::launch_rope(r, s());
}

void CudaDecodeEngine::workload_queries(int layer) {
  if (!gpu_workload_) return upload_workload_queries(layer, false, workload_q_.device_data());
  kernels::SynthQueriesArgs q;
  q.seeds = wl_query_seeds_.device_data() + std::int64_t{layer} * batch_;
  q.anchors = wl_anchor_.device_data() + std::int64_t{layer} * kv_heads_ * key_dim_;
  q.state = wl_query_state_[zu(layer)].device_data();
  q.out = workload_q_.device_data();
  q.requests = batch_;
  q.q_heads = workload_.q_heads();
  q.kv_heads = kv_heads_;
  q.dim = key_dim_;
  q.step = step_;
  q.step_device = step_index();
  q.rho = workload_.query_rho();
  q.fresh = workload_.query_fresh();
  q.c_q = workload_.query_anchor_gain();
  kernels::launch_synth_queries(q, s());
}

// The index queries are channels of the attention queries workload_queries() made for the layer.
void CudaDecodeEngine::workload_index_queries(int layer) {
  if (!gpu_workload_) return upload_workload_queries(layer, true, ix_workload_q_.device_data());
  kernels::GatherIndexQueriesArgs g;
  g.q = workload_q_.device_data();
  g.channels = wl_index_channels_.device_data() + std::int64_t{layer} * workload_.index_dim();
  g.out = ix_workload_q_.device_data();
  g.requests = batch_;
  g.q_heads = workload_.q_heads();
  g.q_dim = key_dim_;
  g.heads = workload_.index_heads();
  g.dim = workload_.index_dim();
  kernels::launch_gather_index_queries(g, s());
}

void CudaDecodeEngine::upload_workload_queries(int layer, bool index, float* out) {
  const bool mla = model_.is_mla();
  const int per_request =
      index ? model_.indexer.heads * model_.indexer.head_dim
            : (mla ? model_.mla.heads * (model_.mla.kv_lora_rank + model_.mla.qk_rope_head_dim)
                   : model_.gqa.q_heads * model_.gqa.head_dim);
  // The pinned staging is reused by the next upload: the previous copy must have landed.
  stream_.synchronize();
  float* host = workload_host_.host_data();
  for (int b = 0; b < batch_; ++b) {
    float* dst = host + zu(b) * zu(per_request);
    if (index)
      workload_.index_queries(b, layer, step_, dst);
    else
      workload_.queries(b, layer, step_, dst);
  }
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(out, host, zu(batch_) * zu(per_request) * sizeof(float),
                                      cudaMemcpyHostToDevice, s()));
}

void CudaDecodeEngine::check_finite(const Buffer<float>& x, std::int64_t n, int site) {
  if (!config_.check_finite) return;
  kernels::MarkNonFiniteArgs a;
  a.x = x.device_data();
  a.n = n;
  a.site = site;
  a.first_site = first_non_finite_.device_data();
  kernels::launch_mark_non_finite(a, s());
}

void CudaDecodeEngine::write_step_state() {
  std::int64_t* host = step_state_host_.host_data();
  const std::int64_t B = batch_, S = streams_;
  std::fill(host, host + B, seq_len_);
  std::fill(host + B, host + 2 * B, seq_len_ + 1);
  std::fill(host + 2 * B, host + 2 * B + S, seq_len_);
  std::fill(host + 2 * B + S, host + 2 * B + 2 * S, seq_len_ + 1);
  host[2 * B + 2 * S] = step_;
}

bool CudaDecodeEngine::replays_graph() const {
  const bool quality = config_.quality_metrics && config_.mode != Mode::dense;
  return config_.cuda_graph && step_ > 0 && gpu_workload_ && !fathom_ && !quality &&
         !trace::TraceSession::collecting();
}

std::int64_t CudaDecodeEngine::selection_bytes() const {
  if (!sparse_) return 0;
  const std::int64_t tokens = std::int64_t{batch_} * (seq_len_ + 1);
  if (!model_.is_mla())  // the exact top-k reads the K half of every row of every layer
    return static_cast<std::int64_t>(model_.kv_row_bytes() / 2) * tokens * model_.layers;
  if (!model_.has_indexer()) return 0;
  std::int64_t indexer_layers = 0;
  for (int l = 0; l < model_.layers; ++l) indexer_layers += indexer_layer(l) == l ? 1 : 0;
  return static_cast<std::int64_t>(model_.index_key_bytes()) * tokens * indexer_layers;
}

StepStats CudaDecodeEngine::step() {
  HISPARSE_RANGE("step", Phase::step);
  StepStats stats = begin_step_stats();
  if (seq_len_ >= capacity_)
    throw Error(fmt::format("mode {}", name_of(config_.mode)),
                fmt::format("step {} needs room for token {}, the GPU cache holds {} tokens per "
                            "request (context {} + max_decode_steps)",
                            step_, seq_len_, capacity_, config_.context_length),
                "raise EngineConfig::max_decode_steps to the number of steps the run takes");
  const auto start = Clock::now();
  write_step_state();
  stats.graph_replay = replays_graph();
  if (!stats.graph_replay) {
    clock_.begin_step();
    enqueue_step(stats);
  } else {
    if (!graph_) {  // capture once; nothing runs until the launch below
      HISPARSE_RANGE("capture", Phase::step);
      StepStats captured;  // the host learns nothing while capturing
      clock_.begin_step();
      {
        // Whether or not the capture succeeds, nothing it enqueued ran.
        struct EndCapture {
          CudaDecodeEngine& e;
          ~EndCapture() {
            e.clock_.set_capturing(false);
            if (e.hot_rows_) e.graph_swap_in_layers_ = e.hot_rows_->forget_pending();
          }
        } end{*this};
        clock_.set_capturing(true);
        graph_ = std::make_unique<CudaGraph>(
            stream_, [&] { enqueue_step(captured); },
            fmt::format("the CUDA engine's decode step ({} at concurrency {})",
                        name_of(config_.mode), batch_)
                .c_str());
      }
      graph_marks_ = clock_.marks();
    }
    clock_.replayed(graph_marks_);
    if (hot_rows_) hot_rows_->replayed(graph_swap_in_layers_, seq_len_ + 1);
    graph_->launch(stream_);
  }
  stats.bytes_scanned += selection_bytes();
  stream_.synchronize();
  if (hot_rows_) {
    const SwapInStats st = hot_rows_->finish_step_device();
    stats.hits += st.hits;
    stats.misses += st.misses;
    stats.bytes_h2d += st.misses * static_cast<std::int64_t>(deployed_row_bytes_);
  }
  if (config_.check_finite && first_non_finite_host_.host_data()[0] != kNoSite)
    throw non_finite_error(model_, config_, step_, first_non_finite_host_.host_data()[0]);
  stats.next_tokens.assign(tokens_host_.host_data(), tokens_host_.host_data() + batch_);
  clock_.collect(stats.phase_ms);
  end_step(stats, start);
  return stats;
}

void CudaDecodeEngine::enqueue_step(StepStats& stats) {
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(step_state_.device_data(), step_state_host_.host_data(),
                                      step_state_.size() * sizeof(std::int64_t),
                                      cudaMemcpyHostToDevice, s()));
  const int H = model_.hidden;
  const std::int64_t residual = static_cast<std::int64_t>(batch_) * H;
  if (config_.check_finite)
    HISPARSE_CUDA_CHECK(
        cudaMemsetAsync(first_non_finite_.device_data(), 0x7f, sizeof(std::int32_t), s()));
  {
    HISPARSE_RANGE("embed", Phase::embed);
    GpuPhaseClock::Scope t(clock_, "embed");
    kernels::GatherRowsArgs g;
    g.table = weight("model.embed_tokens.weight");
    g.ids = tokens_.device_data();
    g.out = x_.device_data();
    g.rows = batch_;
    g.width = H;
    kernels::launch_gather_rows(g, s());
    check_finite(x_, residual, 0);
  }
  for (int l = 0; l < model_.layers; ++l) {
    HISPARSE_RANGE_PAYLOAD("layer", Phase::layer, l);
    {
      GpuPhaseClock::Scope t(clock_, "attention");
      rmsnorm(x_.device_data(), w(l, "input_layernorm.weight"), h_.device_data(), batch_, H);
    }
    if (model_.is_mla())
      attention_mla(l, stats);
    else
      attention_gqa(l, stats);
    check_finite(x_, residual, finite_site(l, false));
    HISPARSE_RANGE("ffn", Phase::ffn);
    GpuPhaseClock::Scope t(clock_, "ffn");
    rmsnorm(x_.device_data(), w(l, "post_attention_layernorm.weight"), h_.device_data(), batch_, H);
    ffn(l);
    check_finite(x_, residual, finite_site(l, true));
  }
  HISPARSE_RANGE("lm_head", Phase::lm_head);
  GpuPhaseClock::Scope t(clock_, "lm_head");
  rmsnorm(x_.device_data(), weight("model.norm.weight"), h_.device_data(), batch_, H);
  linear(h_.device_data(), linear_weight("lm_head.weight"), logits_.device_data(), batch_,
         model_.vocab, H);
  kernels::ArgmaxArgs am;
  am.x = logits_.device_data();
  am.out = tokens_.device_data();
  am.rows = batch_;
  am.n = model_.vocab;
  kernels::launch_argmax(am, s());
  HISPARSE_CUDA_CHECK(cudaMemcpyAsync(tokens_host_.host_data(), tokens_.device_data(),
                                      zu(batch_) * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                      s()));
  check_finite(logits_, static_cast<std::int64_t>(batch_) * model_.vocab,
               logits_site(model_.layers));
  if (config_.check_finite)
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(first_non_finite_host_.host_data(),
                                        first_non_finite_.device_data(), sizeof(std::int32_t),
                                        cudaMemcpyDeviceToHost, s()));
}

std::unique_ptr<EngineImpl> make_cuda_engine(const ModelSpec& model, const EngineConfig& config) {
  return std::make_unique<CudaDecodeEngine>(model, config);
}

}  // namespace hisparse::detail
