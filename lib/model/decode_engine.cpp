// DecodeEngine: the backend's engine behind one interface (detail::EngineImpl), and what both
// engines share: configuration checks, sizes, first tokens, the quality samples, the offloading
// modes' stores and the non-finite check's message.
#include "model/decode_engine.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "model/capacity_model.hpp"
#include "model/detail/engine_impl.hpp"
#include "model/engine_fathom_index.hpp"
#include "model/engine_hot_rows.hpp"
#include "model/kv_workload.hpp"
#include "model/selection_quality.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {
[[nodiscard]] std::size_t zu(std::int64_t v) {
  return static_cast<std::size_t>(v);
}
}  // namespace

namespace detail {
Error non_finite_error(const ModelSpec& model, const EngineConfig& config, std::int64_t step,
                       int site) {
  std::string at;
  if (site == 0)
    at = "the embedding";
  else if (site == logits_site(model.layers))
    at = "the logits (lm_head)";
  else
    at = fmt::format("layer {}'s {}", (site - 1) / 2, site % 2 == 1 ? "attention" : "ffn");
  return Error(fmt::format("{} {} decode step {} ({} backend)", model.name, name_of(config.mode),
                           step, name_of(config.backend)),
               fmt::format("a NaN or Inf first appeared in {} (the residual stream after it)", at),
               "rerun the point with --backend cpu: if the CPU engine stays finite, that phase's "
               "CUDA kernels are at fault (run the GPU tests under compute-sanitizer: "
               ".ci/device-check sanitize); if it does not, the weights or the workload overflow "
               "there");
}

void validate_config(const ModelSpec& model, const EngineConfig& c) {
  if (c.backend == Backend::cuda && !HISPARSE_WITH_CUDA)
    throw Error("--backend cuda",
                "this build has no CUDA backend (nvcc was not found at configure time)",
                "install the CUDA toolkit and reconfigure, or use --backend cpu");
  if (std::string gpu_missing; c.backend == Backend::cuda && !cuda_available(&gpu_missing))
    throw Error("--backend cuda", fmt::format("no usable GPU ({})", gpu_missing),
                "use --backend cpu or --backend auto");
  std::string why;
  if (!mode_supported(model, c.mode, &why))
    throw Error(fmt::format("mode {}", name_of(c.mode)), why, "pick a mode the model supports");
  if (c.mode == Mode::sparse_gpu && model.is_mla() && !model.has_indexer())
    throw Error(fmt::format("mode {}", name_of(c.mode)),
                fmt::format("model {} uses MLA without a DSA indexer, so nothing selects its top-k",
                            model.name),
                "add `indexer:` to the model or use mode dense");
  if (c.concurrency < 1)
    throw Error("concurrency", fmt::format("must be at least 1, got {}", c.concurrency),
                "run one or more requests");
  if (c.context_length < 1)
    throw Error("context_length", fmt::format("must be at least 1, got {}", c.context_length),
                "give the tokens already cached per request, e.g. 2048");
  if (c.top_k < 0)
    throw Error("top_k", fmt::format("must not be negative, got {}", c.top_k),
                "use 0 for the model's default or a positive count");
  if (c.hot_buffer < 0 || c.hot_buffer > kMaxHotSlots)
    throw Error("hot_buffer", fmt::format("{} slots is outside 0..{}", c.hot_buffer, kMaxHotSlots),
                "use 0 (2 x top_k) or a slot count from top_k to 32768");
  if (c.max_decode_steps < 0)
    throw Error("max_decode_steps", fmt::format("must not be negative, got {}", c.max_decode_steps),
                "use 0 for the default or the number of steps the run takes");
}

void EngineImpl::derive_sizes(const KvWorkload& workload) {
  const EngineConfig& c = config_;
  batch_ = c.concurrency;
  sparse_ = c.mode == Mode::sparse_gpu || c.mode == Mode::hisparse;
  fathom_ = c.mode == Mode::fathom || c.mode == Mode::hisparse_fathom;
  top_k_ = c.top_k > 0 ? c.top_k : (model_.has_indexer() ? model_.indexer.top_k : 2048);
  kv_heads_ = workload.kv_heads();
  key_dim_ = workload.key_dim();
  value_dim_ = workload.value_dim();
  CapacityQuery q;
  q.context_length = c.context_length;
  q.top_k = top_k_;
  q.hot_buffer = c.hot_buffer;
  q.budget_bits = c.budget_bits;
  gpu_bytes_per_request_ = CapacityModel(model_).footprint(c.mode, q).gpu_bytes;
  seq_len_ = c.context_length;
  model_query_share_ = workload.replay() ? 0.0f : kModelQueryShare;
  const bool mla = model_.is_mla();
  streams_ = mla ? batch_ : batch_ * kv_heads_;
  deployed_row_bytes_ = mla ? model_.kv_row_bytes() : model_.kv_row_bytes() / zu(kv_heads_);
  width_ = c.mode == Mode::dense ? 0 : top_k_;
}

std::vector<std::int32_t> EngineImpl::first_tokens() const {
  std::vector<std::int32_t> tokens(zu(batch_));
  for (int b = 0; b < batch_; ++b)
    tokens[zu(b)] = static_cast<std::int32_t>(
        random_bits(config_.workload.seed ^ 0x70c0ull, static_cast<std::uint64_t>(b)) %
        static_cast<std::uint64_t>(model_.vocab));
  return tokens;
}

kernels::DecodeAttentionArgs EngineImpl::dense_twin(const kernels::DecodeAttentionArgs& sparse,
                                                    const float* k, const float* v,
                                                    std::int64_t capacity,
                                                    const std::int64_t* seq_lens) const {
  const bool mla = model_.is_mla();
  kernels::DecodeAttentionArgs d = sparse;
  d.k = k;
  d.v = v;
  d.kv_heads = mla ? 1 : kv_heads_;
  d.capacity = capacity;
  d.k_row_stride = mla ? key_dim_ : 0;
  d.v_row_stride = mla ? key_dim_ : 0;
  d.indices = nullptr;
  d.seq_lens = seq_lens;
  return d;
}

void EngineImpl::add_quality_sample(const kernels::DecodeAttentionArgs& dense, const float* q,
                                    const float* k, const std::int32_t* selected, int groups,
                                    const float* sparse_out, const float* dense_out) {
  SelectionRecallArgs r;
  r.q = q;
  r.k = k;
  r.batch = batch_;
  r.q_heads = dense.q_heads;
  r.kv_heads = dense.kv_heads;
  r.dim = dense.qk_dim;
  r.capacity = dense.capacity;
  r.k_row_stride = dense.k_row_stride;
  r.seq_len = seq_len_ + 1;
  r.selected = selected;
  r.groups = groups;
  r.width = width_;
  r.top_k = top_k_;
  recall_sum_ += selection_recall(r);
  error_sum_ += mean_relative_l2_error(sparse_out, dense_out, batch_ * dense.q_heads, dense.v_dim);
  ++quality_samples_;
}

StepStats EngineImpl::begin_step_stats() const {
  StepStats stats;
  for (const char* p : {"embed", "indexer", "topk", "attention", "ffn", "lm_head", "append"})
    stats.phase_ms[p] = 0.0;
  if (config_.mode == Mode::hisparse || config_.mode == Mode::hisparse_fathom)
    stats.phase_ms["swap_in"] = 0.0;
  if (fathom_) stats.phase_ms["scan"] = 0.0;
  return stats;
}

void EngineImpl::end_step(StepStats& stats, std::chrono::steady_clock::time_point start) {
  if (quality_samples_ > 0) {
    stats.recall = recall_sum_ / quality_samples_;
    stats.attention_rel_error = error_sum_ / quality_samples_;
  }
  quality_samples_ = 0;
  recall_sum_ = error_sum_ = 0;
  ++seq_len_;
  ++step_;
  stats.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() -
      stats.quality_ms;
}

std::unique_ptr<FathomKeyIndex> EngineImpl::make_fathom_index(std::int64_t capacity,
                                                              Backend backend) const {
  FathomIndexShape shape;
  shape.layers = model_.layers;
  shape.streams = streams_;
  shape.head_dim = key_dim_;
  shape.group = model_.gqa.q_heads / kv_heads_;
  shape.capacity = capacity;
  shape.klt = config_.fathom_klt;
  shape.centre_keys = config_.fathom_centre_keys;
  shape.head_budgets = config_.fathom_head_budgets;
  shape.kv_heads = kv_heads_;
  fathom::SelectorConfig selector{top_k_, kFathomSinks, kFathomRecent, config_.budget_bits};
  selector.rule = config_.fathom_rule;
  return std::make_unique<FathomKeyIndex>(shape, selector, backend);
}

// Null outside the hisparse modes; sets hot_slots_ (and needs width_ final: after the Fathom index).
std::unique_ptr<HotRowCache> EngineImpl::make_hot_rows(std::int64_t capacity, Backend backend,
                                                       int element_bytes) {
  if (config_.mode != Mode::hisparse && config_.mode != Mode::hisparse_fathom) return nullptr;
  hot_slots_ = hot_slots_for(model_, config_, top_k_, width_, kv_heads_);
  HotRowShape shape;
  shape.streams = streams_;
  shape.layers = model_.layers;
  shape.capacity = capacity;
  shape.row_elements = model_.is_mla() ? key_dim_ : 2 * key_dim_;
  shape.element_bytes = element_bytes;
  shape.hot = hot_slots_;
  shape.width = width_;
  return std::make_unique<HotRowCache>(shape, backend);
}

int hot_slots_for(const ModelSpec& model, const EngineConfig& config, int top_k, int width,
                  int kv_heads) {
  const int slots = config.hot_buffer > 0 ? config.hot_buffer : 2 * top_k;
  if (slots < width)
    throw Error(
        "hot_buffer",
        config.mode == Mode::hisparse
            ? fmt::format("hot_buffer {} is smaller than top_k {}", slots, width)
            : fmt::format("hot_buffer {} cannot hold one Fathom selection of up to {} rows "
                          "({} sinks + {} recent + {} query heads x (top_k {} - {}))",
                          slots, width, kFathomSinks, kFathomRecent, model.gqa.q_heads / kv_heads,
                          top_k, kFathomSinks + kFathomRecent),
        fmt::format("use hot_buffer >= {}", width));
  return slots;
}

}  // namespace detail

DecodeEngine::DecodeEngine(const ModelSpec& model, const EngineConfig& config) {
#if HISPARSE_WITH_CUDA
  if (config.backend == Backend::cuda) {
    detail::validate_config(model, config);
    impl_ = detail::make_cuda_engine(model, config);
    return;
  }
#endif
  impl_ = detail::make_cpu_engine(model, config);
}
DecodeEngine::~DecodeEngine() = default;

StepStats DecodeEngine::step() {
  HISPARSE_FUNC_RANGE();
  return impl_->step();
}

const EngineConfig& DecodeEngine::config() const noexcept {
  return impl_->config_;
}
const ModelSpec& DecodeEngine::model() const noexcept {
  return impl_->model_;
}
std::size_t DecodeEngine::gpu_bytes_per_request() const noexcept {
  return impl_->gpu_bytes_per_request_;
}
std::int64_t DecodeEngine::sequence_length() const noexcept {
  return impl_->seq_len_;
}
const std::vector<std::string>& DecodeEngine::workload_notes() const noexcept {
  return impl_->workload_notes();
}
int DecodeEngine::hot_slots() const noexcept {
  return impl_->hot_slots_;
}
int DecodeEngine::selection_width() const noexcept {
  return impl_->width_;
}
int DecodeEngine::kv_streams() const noexcept {
  return impl_->streams_;
}
std::vector<SelectionTrace> DecodeEngine::selection_traces() const {
  return impl_->selection_traces();
}
std::vector<float> DecodeEngine::last_attention(int layer) const {
  return impl_->last_attention(layer);
}
std::vector<float> DecodeEngine::last_queries(int layer) const {
  return impl_->last_queries(layer);
}
bool DecodeEngine::is_quality_layer(int layer) const noexcept {
  return layer == 0 || layer == impl_->model_.layers - 1;
}

namespace detail {
const std::vector<float>& layer_record(const std::vector<std::vector<float>>& records, int layer,
                                       const char* what) {
  if (layer < 0 || layer >= static_cast<int>(records.size()))
    throw Error(
        what, fmt::format("layer {} is outside 0..{}", layer, static_cast<int>(records.size()) - 1),
        "pass a layer of the model");
  return records[zu(layer)];
}
}  // namespace detail

}  // namespace hisparse
