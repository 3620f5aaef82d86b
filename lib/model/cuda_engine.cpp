// The CUDA decode engine: the CPU engine's decode step (decode_engine.cpp) with every phase on the
// GPU, in all five modes, checked against that twin on the tiny models (tests/gpu). Stage one of
// issue 42: plain fp32 kernels where speed is not yet the point, weights and caches in the CPU
// engine's float layout so both backends compute the same numbers.
//
// What is on the GPU: the embedding gather, RMSNorm, every linear layer (cuBLASLt), RoPE, the MLA
// absorption and up-projection, the KV append, the DSA indexer and its fp8 index keys, the exact
// top-k, the GQA baseline's group attention mass, attention over all rows or a selection, the
// HiSparse swap-in (the existing kernel), the Fathom plane scan (the existing selector), the
// MoE router, experts and shared expert, the LM head and the greedy argmax.
// A synthetic workload is made on the GPU (kernels/workload: the context's KV rows and index keys
// at construction, each step's queries per layer), bit for bit KvWorkload's values; a replayed
// capture is read on the host and copied up.
// What still crosses to the host inside a step, for now: a replayed capture's queries, the Fathom
// selector's queries and selections, the swap-in's hit counts and traces, and the next tokens at
// the end of the step. Each is a synchronisation that a CUDA graph of the whole step cannot hold.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/moe/moe_experts.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/topk/topk.hpp"
#include "kernels/workload/workload_synth.hpp"
#include "model/capacity_model.hpp"
#include "model/detail/engine_impl.hpp"
#include "model/engine_fathom_index.hpp"
#include "model/engine_hot_rows.hpp"
#include "model/kv_workload.hpp"
#include "model/selection_quality.hpp"
#include "model/weights.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::size_t;

[[nodiscard]] size_t zu(std::int64_t v) {
  return static_cast<size_t>(v);
}

// GPU time per phase name: a start and a stop event around each enqueued piece of a phase, summed
// after the step's final synchronisation. The events are made on the first step and reused.
class GpuPhaseClock {
 public:
  explicit GpuPhaseClock(cudaStream_t stream) : stream_(stream) {}
  GpuPhaseClock(const GpuPhaseClock&) = delete;
  GpuPhaseClock& operator=(const GpuPhaseClock&) = delete;
  ~GpuPhaseClock() {
    for (const Mark& m : marks_) {
      cudaEventDestroy(m.start);
      cudaEventDestroy(m.stop);
    }
  }

  class Scope {
   public:
    Scope(GpuPhaseClock& clock, const char* name) : clock_(clock), index_(clock.open(name)) {}
    ~Scope() { clock_.close(index_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GpuPhaseClock& clock_;
    size_t index_;
  };

  void begin_step() noexcept { used_ = 0; }
  /// Adds each phase's GPU milliseconds to `phase_ms` (the stream must have finished).
  void collect(std::map<std::string, double>& phase_ms) const {
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0.0f;
      HISPARSE_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].start, marks_[i].stop));
      phase_ms[marks_[i].name] += ms;
    }
  }

 private:
  struct Mark {
    const char* name;
    cudaEvent_t start, stop;
  };
  size_t open(const char* name) {
    if (used_ == marks_.size()) {
      Mark m{name, nullptr, nullptr};
      HISPARSE_CUDA_CHECK(cudaEventCreate(&m.start));
      HISPARSE_CUDA_CHECK(cudaEventCreate(&m.stop));
      marks_.push_back(m);
    }
    marks_[used_].name = name;
    HISPARSE_CUDA_CHECK(cudaEventRecord(marks_[used_].start, stream_));
    return used_++;
  }
  void close(size_t index) { HISPARSE_CUDA_CHECK(cudaEventRecord(marks_[index].stop, stream_)); }

  cudaStream_t stream_;
  std::vector<Mark> marks_;
  size_t used_ = 0;
};

template <class T>
[[nodiscard]] Buffer<T> upload(const std::vector<T>& host, const char* label) {
  auto buf = Buffer<T>::device(std::max<size_t>(host.size(), 1), Backend::cuda, label);
  if (!host.empty())
    copy_bytes(buf.device_data(), host.data(), host.size() * sizeof(T), Backend::cuda);
  return buf;
}

class CudaDecodeEngine final : public EngineImpl {
 public:
  CudaDecodeEngine(const ModelSpec& model, const EngineConfig& config);
  StepStats step() override;
  [[nodiscard]] const std::vector<std::string>& workload_notes() const noexcept override {
    return workload_.notes();
  }
  [[nodiscard]] std::vector<SelectionTrace> selection_traces() const override {
    return hot_rows_ ? hot_rows_->traces() : std::vector<SelectionTrace>{};
  }
  [[nodiscard]] std::vector<float> last_attention(int layer) const override {
    return download(attention_out_, attention_floats_, layer, "last_attention");
  }
  [[nodiscard]] std::vector<float> last_queries(int layer) const override {
    return download(query_record_, query_floats_, layer, "last_queries");
  }

 private:
  // Device buffers of the step, allocated once.
  template <class T>
  [[nodiscard]] static Buffer<T> gpu(std::int64_t n, const char* label) {
    return Buffer<T>::device(zu(std::max<std::int64_t>(n, 1)), Backend::cuda, label);
  }
  [[nodiscard]] cudaStream_t s() const noexcept { return stream_.native(); }
  [[nodiscard]] const float* w(int layer, std::string_view suffix) const {
    return weight(layer_tensor_name(model_, layer, suffix, config_.share_layer_weights));
  }
  [[nodiscard]] const float* weight(const std::string& name) const;
  /// A linear layer's weights: fp32, or bf16 with EngineConfig::bf16_gemm (every linear tensor
  /// but the embedding and kv_b_proj, which non-GEMM kernels read as floats).
  struct LinearWeight {
    const float* f32 = nullptr;
    const std::uint16_t* bf16 = nullptr;
  };
  [[nodiscard]] LinearWeight wl(int layer, std::string_view suffix) const {
    return linear_weight(layer_tensor_name(model_, layer, suffix, config_.share_layer_weights));
  }
  [[nodiscard]] LinearWeight linear_weight(const std::string& name) const;
  [[nodiscard]] int indexer_layer(int layer) const {
    return layer - layer % model_.indexer.every_n_layers;
  }
  /// The first floats[layer] floats of buffers[layer] (empty before the first step).
  [[nodiscard]] std::vector<float> download(const std::vector<Buffer<float>>& buffers,
                                            const std::vector<std::int64_t>& floats, int layer,
                                            const char* what) const;

  void upload_weights(const ModelWeights& host);
  void fill_context();
  /// The workload's tables in device memory (synthetic workloads).
  void upload_workload_tables();
  /// Keys (and values) of layer l's context into k / v (bf16, the layout of k_cache_), and its
  /// index keys.
  void synthesise_context(int l, std::uint16_t* k, std::uint16_t* v);
  void read_context(int l, std::uint16_t* k, std::uint16_t* v);
  /// Whether layer l keeps its context's keys (values) on the GPU: always outside the hisparse
  /// modes; in them the layers whose quality is sampled (their dense twin reads them) and, for
  /// the exact top-k of GQA models, every layer's keys (what CapacityModel plans).
  [[nodiscard]] bool keys_on_gpu(int l) const {
    return !hot_rows_ || samples_quality(l) || (sparse_ && !model_.is_mla());
  }
  [[nodiscard]] bool values_on_gpu(int l) const {
    return !model_.is_mla() && (!hot_rows_ || samples_quality(l));
  }
  void linear(const float* x, LinearWeight wt, float* y, int m, int n, int k, float beta = 0.0f,
              int ldy = 0, int ldx = 0) const;
  void rmsnorm(const float* x, const float* weight, float* y, int rows, int n, int ld = 0) const;
  void rope(float* x, int heads, int head_stride, int offset, int dim, int row_stride = 0) const;
  /// The workload's queries of `layer` for this step into workload_q_ (its index queries into
  /// ix_workload_q_): made on the GPU, or a capture's copied up.
  void workload_queries(int layer);
  void workload_index_queries(int layer);
  void upload_workload_queries(int layer, bool index, float* out);
  void attention_gqa(int layer, StepStats& stats);
  void attention_mla(int layer, StepStats& stats);
  void select_dsa(int layer, StepStats& stats);
  void place_hot(int layer, kernels::DecodeAttentionArgs& a, StepStats& stats);
  void measure_quality(int layer, const kernels::DecodeAttentionArgs& sparse, int groups,
                       StepStats& stats);
  void ffn(int layer);
  void swiglu_block(int layer, const std::string& prefix, int width);
  /// EngineConfig::check_finite: marks `site` in first_non_finite_ when x holds a NaN or Inf.
  void check_finite(const Buffer<float>& x, std::int64_t n, int site);

  Stream stream_{Backend::cuda};
  GpuPhaseClock clock_{stream_.native()};
  KvWorkload workload_;
  std::int64_t capacity_ = 0;  ///< rows per (request, KV head): context + max_decode_steps
  std::int64_t step_ = 0;
  std::map<std::string, Buffer<float>, std::less<>> weights_;
  std::map<std::string, Buffer<std::uint16_t>, std::less<>> weights_bf16_;
  Buffer<std::uint16_t> gemm_x_;  ///< a GEMM's activations rounded to bf16 [batch x widest k]
  /// per layer [batch][kv_heads][capacity][dim], bf16 (empty where !rows_on_gpu)
  std::vector<Buffer<std::uint16_t>> k_cache_, v_cache_;
  std::vector<Buffer<std::uint8_t>> index_keys_;  ///< per indexer layer [batch][capacity][dim]
  std::vector<Buffer<float>> index_scales_;       ///< per indexer layer [batch][capacity]
  std::unique_ptr<HotRowCache> hot_rows_;
  std::unique_ptr<FathomKeyIndex> fathom_index_;
  // Activations and step state.
  Buffer<float> x_, h_, q_, k_, v_, q_a_, kv_, q_model_, lat_, o_, mass_, scores_, gate_up_, act_,
      logits_, router_logits_, route_weights_, ix_q_, ix_k_, ix_w_, workload_q_;
  Buffer<float> ix_workload_q_;
  /// MoE decode batches up to kMoeExpertsMaxTokens: the fused experts (kernels/moe), with each
  /// MoE layer's table of expert weights (gate, up, down; experts_held each) and the scratch
  /// activations; larger batches run every expert as GEMMs.
  bool fused_experts_ = false;
  std::vector<Buffer<const void*>> expert_tables_;
  Buffer<float> expert_act_;
  Buffer<std::uint16_t> new_rows_;  ///< the step's new KV rows as the hot rows hold them (bf16)
  Buffer<std::int32_t> tokens_, indices_, slots_;
  // The synthetic workload on the GPU: D and a per (layer, KV head), key / value seeds per
  // (layer, KV head, request), query seeds per (layer, request), index channels per layer, and
  // the query walk's state per layer.
  bool gpu_workload_ = false;
  Buffer<float> wl_scale_, wl_anchor_;
  Buffer<std::uint64_t> wl_key_seeds_, wl_value_seeds_, wl_query_seeds_;
  Buffer<std::int32_t> wl_index_channels_;
  std::vector<Buffer<float>> wl_query_state_;
  Buffer<std::int64_t> positions_, lens_, group_lens_;
  std::vector<Buffer<float>> attention_out_, query_record_;    ///< per layer, last step
  std::vector<std::int64_t> attention_floats_, query_floats_;  ///< per layer, last step
  // Host staging: pinned copies for the workload's queries, the next tokens and the Fathom path.
  Buffer<float> workload_host_;
  Buffer<std::int32_t> tokens_host_;
  // EngineConfig::check_finite: the step's first non-finite site on the GPU and its pinned copy.
  Buffer<std::int32_t> first_non_finite_, first_non_finite_host_;
  std::vector<float> fathom_q_host_, fathom_k_host_;
  std::vector<std::int32_t> fathom_indices_host_;
};

CudaDecodeEngine::CudaDecodeEngine(const ModelSpec& model, const EngineConfig& config)
    : EngineImpl(model, config),
      workload_(model, config.workload, config.concurrency, config.context_length) {
  HISPARSE_FUNC_RANGE();
  derive_sizes(workload_);
  const int steps = config.max_decode_steps > 0 ? config.max_decode_steps : kDefaultDecodeSteps;
  capacity_ = seq_len_ + steps;
  const bool mla = model.is_mla();

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
    fused_experts_ = B <= kernels::kMoeExpertsMaxTokens && model.hidden % 8 == 0 &&
                     f.expert_width % 8 == 0;
    if (fused_experts_) {
      expert_act_ = gpu<float>(std::int64_t{f.experts_held} * B * f.expert_width,
                               "MoE expert activations");
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
  positions_ = gpu<std::int64_t>(B, "positions");
  lens_ = gpu<std::int64_t>(B, "sequence lengths");
  group_lens_ = gpu<std::int64_t>(std::int64_t{B} * kv_heads_, "sequence lengths per KV head");
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
                "embedding and kv_b_proj in bf16");
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
    const bool gemm = config_.bf16_gemm && t.init == TensorSpec::Init::linear &&
                      t.name != "model.embed_tokens.weight" &&
                      !t.name.ends_with("kv_b_proj.weight");
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
  }
  if (config_.bf16_gemm)
    gemm_x_ = gpu<std::uint16_t>(std::int64_t{batch_} * widest_k, "GEMM activations (bf16)");
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
    HISPARSE_CUDA_CHECK(cudaMemset(buf.device_data(), 0, buf.size() * sizeof(std::uint16_t)));
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
      HISPARSE_CUDA_CHECK(cudaMemset(codes.device_data(), 0, codes.size()));
      HISPARSE_CUDA_CHECK(cudaMemset(sc.device_data(), 0, sc.size() * sizeof(float)));
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
  a.x_bf16 = wt.bf16 ? gemm_x_.device_data() : nullptr;
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
  r.positions = positions_.device_data();
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

StepStats CudaDecodeEngine::step() {
  HISPARSE_RANGE("step", Phase::step);
  StepStats stats;
  for (const char* p : {"embed", "indexer", "topk", "attention", "ffn", "lm_head", "append"})
    stats.phase_ms[p] = 0.0;
  if (hot_rows_) stats.phase_ms["swap_in"] = 0.0;
  if (fathom_) stats.phase_ms["scan"] = 0.0;
  if (seq_len_ >= capacity_)
    throw Error(fmt::format("mode {}", name_of(config_.mode)),
                fmt::format("step {} needs room for token {}, the GPU cache holds {} tokens per "
                            "request (context {} + max_decode_steps)",
                            step_, seq_len_, capacity_, config_.context_length),
                "raise EngineConfig::max_decode_steps to the number of steps the run takes");
  const auto start = Clock::now();
  clock_.begin_step();
  {
    // Positions of the new tokens and the lengths after appending them.
    std::vector<std::int64_t> pos(zu(batch_) * zu(kv_heads_), seq_len_);
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(positions_.device_data(), pos.data(),
                                        zu(batch_) * sizeof(std::int64_t), cudaMemcpyHostToDevice,
                                        s()));
    std::fill(pos.begin(), pos.end(), seq_len_ + 1);
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(lens_.device_data(), pos.data(),
                                        zu(batch_) * sizeof(std::int64_t), cudaMemcpyHostToDevice,
                                        s()));
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(group_lens_.device_data(), pos.data(),
                                        pos.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice,
                                        s()));
  }
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
  {
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
  stream_.synchronize();
  if (config_.check_finite && first_non_finite_host_.host_data()[0] != kNoSite)
    throw non_finite_error(model_, config_, step_, first_non_finite_host_.host_data()[0]);
  stats.next_tokens.assign(tokens_host_.host_data(), tokens_host_.host_data() + batch_);
  clock_.collect(stats.phase_ms);
  ++seq_len_;
  ++step_;
  finish_quality(stats);
  stats.step_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() - stats.quality_ms;
  return stats;
}

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
    auto store = [&](float* src, std::uint16_t* dst, std::int64_t dst_stride) {
      kernels::StoreBf16RowsArgs st;
      st.src = src;
      st.dst = dst;
      st.rows = batch_ * kvh;
      st.width = hd;
      st.dst_stride = dst_stride;
      kernels::launch_store_bf16_rows(st, s());
    };
    if (keys_on_gpu(l))
      store(k_.device_data(), k_cache_[zu(l)].device_data() + zu(pos) * zu(hd), capacity_ * hd);
    if (values_on_gpu(l))
      store(v_.device_data(), v_cache_[zu(l)].device_data() + zu(pos) * zu(hd), capacity_ * hd);
    if (hot_rows_) {  // [K | V] rows of every stream, then into the pool and the newest slot
      store(k_.device_data(), new_rows_.device_data(), 2 * hd);
      store(v_.device_data(), new_rows_.device_data() + hd, 2 * hd);
      hot_rows_->append_device(l, pos + 1, new_rows_.device_data(), stream_);
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
  a.seq_lens = lens_.device_data();
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
      m.seq_lens = lens_.device_data();
      m.mass = mass_.device_data();
      m.batch = batch_;
      m.q_heads = qh;
      m.kv_heads = kvh;
      m.qk_dim = hd;
      m.capacity = capacity_;
      m.scale = a.scale;
      kernels::launch_group_attention_mass(m, s());
    }
    stats.bytes_scanned +=
        static_cast<std::int64_t>(model_.kv_row_bytes() / 2) * batch_ * (pos + 1);
    HISPARSE_RANGE("topk", Phase::topk);
    GpuPhaseClock::Scope t(clock_, "topk");
    kernels::TopkArgs tk;
    tk.scores = mass_.device_data();
    tk.lengths = group_lens_.device_data();
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
  if (hot_rows_) place_hot(l, a, stats);
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
  const float* kv_b = w(l, "self_attn.kv_b_proj.weight");
  float* q = q_.device_data();
  float* q_abs = q_model_.device_data();
  {
    HISPARSE_RANGE("q_kv", Phase::gemm);
    GpuPhaseClock::Scope t(clock_, "attention");
    linear(h_.device_data(), wl(l, "self_attn.q_a_proj.weight"), q_a_.device_data(), batch_,
           m.q_lora_rank, H);
    rmsnorm(q_a_.device_data(), w(l, "self_attn.q_a_layernorm.weight"), q_a_.device_data(), batch_,
            m.q_lora_rank);
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
    ab.kv_b = kv_b;
    ab.out = q_abs;
    ab.batch = batch_;
    ab.heads = heads;
    ab.nope = nope;
    ab.rope = rope_dim;
    ab.lora = lora;
    ab.v_dim = vd;
    kernels::launch_mla_absorb(ab, s());
  }
  workload_queries(l);
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
      st.dst = k_cache_[zu(l)].device_data() + zu(pos) * zu(row);
      st.dst_stride = capacity_ * row;
      kernels::launch_store_bf16_rows(st, s());
    }
    if (hot_rows_) {
      st.dst = new_rows_.device_data();
      st.dst_stride = row;
      kernels::launch_store_bf16_rows(st, s());
      hot_rows_->append_device(l, pos + 1, new_rows_.device_data(), stream_);
    }
  }
  if (model_.has_indexer() && indexer_layer(l) == l) select_dsa(l, stats);
  kernels::DecodeAttentionArgs a;
  a.q = q_abs;
  a.k_bf16 = k_cache_[zu(l)].device_data();  // replaced by the hot rows in the hisparse modes
  a.v_bf16 = a.k_bf16;
  a.seq_lens = lens_.device_data();
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
  if (hot_rows_) place_hot(l, a, stats);
  {
    HISPARSE_RANGE("attention", Phase::attention);
    GpuPhaseClock::Scope t(clock_, "attention");
    kernels::launch_decode_attention(a, s());
  }
  attention_floats_[zu(l)] = std::int64_t{batch_} * heads * lora;
  measure_quality(l, a, 1, stats);
  HISPARSE_RANGE("o_proj", Phase::gemm);
  GpuPhaseClock::Scope t(clock_, "attention");
  kernels::MlaUpProjectArgs up;
  up.latent = a.out;
  up.kv_b = kv_b;
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

void CudaDecodeEngine::select_dsa(int l, StepStats& stats) {
  const IndexerShape& ix = model_.indexer;
  const int H = model_.hidden;
  const std::int64_t pos = seq_len_;
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
    qk.dest_offset = pos;
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
    a.seq_lens = lens_.device_data();
    a.scores = scores_.device_data();
    a.batch = batch_;
    a.heads = ix.heads;
    a.dim = ix.head_dim;
    a.capacity = capacity_;
    kernels::launch_indexer(a, s());
    stats.bytes_scanned += static_cast<std::int64_t>(model_.index_key_bytes()) * batch_ * (pos + 1);
  }
  HISPARSE_RANGE("topk", Phase::topk);
  GpuPhaseClock::Scope t(clock_, "topk");
  kernels::TopkArgs tk;
  tk.scores = scores_.device_data();
  tk.lengths = lens_.device_data();
  tk.out = indices_.device_data();
  tk.rows = batch_;
  tk.stride = capacity_;
  tk.k = top_k_;
  kernels::launch_topk(tk, s());
}

void CudaDecodeEngine::place_hot(int l, kernels::DecodeAttentionArgs& a, StepStats& stats) {
  HISPARSE_RANGE("swap_in", Phase::swap_in);
  GpuPhaseClock::Scope t(clock_, "swap_in");
  const SwapInStats st =
      hot_rows_->swap_in_device(l, a.indices, seq_len_ + 1, slots_.device_data(), stream_);
  stats.hits += st.hits;
  stats.misses += st.misses;
  stats.bytes_h2d += st.misses * static_cast<std::int64_t>(deployed_row_bytes_);
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
  kernels::DecodeAttentionArgs d =
      dense_twin(sparse, nullptr, nullptr, capacity_, lens_.device_data());
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
    m.act = expert_act_.device_data();
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

}  // namespace

std::unique_ptr<EngineImpl> make_cuda_engine(const ModelSpec& model, const EngineConfig& config) {
  return std::make_unique<CudaDecodeEngine>(model, config);
}

}  // namespace hisparse::detail
