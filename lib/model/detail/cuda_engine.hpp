// The CUDA decode engine's class, shared by its two source files: cuda_engine.cpp (construction,
// weights, the context, the step) and cuda_engine_layers.cpp (attention, row selection, FFN).
// CUDA builds only.
#pragma once

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
#include "core/cuda_graph.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "kernels/attention/decode_attention.hpp"
#include "kernels/attention/mla_decode_attention.hpp"
#include "kernels/attention/rope.hpp"
#include "kernels/common/device_cache.hpp"
#include "kernels/decode/decode_ops.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/rmsnorm.hpp"
#include "kernels/gemm/swiglu.hpp"
#include "kernels/indexer/indexer.hpp"
#include "kernels/moe/moe_experts.hpp"
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
#include "trace/trace_session.hpp"

namespace hisparse::detail {

using Clock = std::chrono::steady_clock;
using std::size_t;

[[nodiscard]] inline size_t zu(std::int64_t v) {
  return static_cast<size_t>(v);
}

// GPU time per phase name: a start and a stop event around each enqueued piece of a phase, summed
// after the step's final synchronisation. The events are made on the first step and reused. Both
// events of a piece go to the stream that was current when it opened (set_stream), so a phase on
// the selection stream is timed there; phases on two streams overlap, and their sum can exceed
// the step. While a CUDA graph of the step is captured the events become event-record nodes of
// the graph (cudaEventRecordExternal), so each replay times its phases with the same events.
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
  /// A replay of a graph captured with `marks` pieces: collect() reads their events.
  void replayed(size_t marks) noexcept { used_ = marks; }
  [[nodiscard]] size_t marks() const noexcept { return used_; }
  void set_stream(cudaStream_t stream) noexcept { stream_ = stream; }
  void set_capturing(bool capturing) noexcept { capturing_ = capturing; }
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
    cudaStream_t stream;
  };
  size_t open(const char* name) {
    if (used_ == marks_.size()) {
      Mark m{name, nullptr, nullptr, nullptr};
      HISPARSE_CUDA_CHECK(cudaEventCreate(&m.start));
      HISPARSE_CUDA_CHECK(cudaEventCreate(&m.stop));
      marks_.push_back(m);
    }
    marks_[used_].name = name;
    marks_[used_].stream = stream_;
    record(marks_[used_].start, stream_);
    return used_++;
  }
  void close(size_t index) { record(marks_[index].stop, marks_[index].stream); }
  void record(cudaEvent_t event, cudaStream_t stream) const {
    HISPARSE_CUDA_CHECK(cudaEventRecordWithFlags(
        event, stream, capturing_ ? cudaEventRecordExternal : cudaEventRecordDefault));
  }

  cudaStream_t stream_;
  bool capturing_ = false;
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
  /// The stream work is enqueued on: stream_, or selection_stream_ inside a SelectionLane.
  [[nodiscard]] cudaStream_t s() const noexcept { return lane_->native(); }
  void switch_lane(const Stream& lane) noexcept {
    lane_ = &lane;
    clock_.set_stream(lane.native());
  }
  /// While one is alive, work goes to the selection stream, after all the work enqueued on
  /// stream_ before it (EngineConfig::overlap_selection); join_selection() then makes stream_
  /// wait for that work.
  class SelectionLane {
   public:
    explicit SelectionLane(CudaDecodeEngine& engine) : engine_(engine) {
      engine.selection_fork_.record(engine.stream_);
      engine.selection_stream_.wait(engine.selection_fork_);
      engine.switch_lane(engine.selection_stream_);
    }
    ~SelectionLane() { engine_.switch_lane(engine_.stream_); }
    SelectionLane(const SelectionLane&) = delete;
    SelectionLane& operator=(const SelectionLane&) = delete;

   private:
    CudaDecodeEngine& engine_;
  };
  void join_selection() {
    selection_done_.record(selection_stream_);
    stream_.wait(selection_done_);
  }
  [[nodiscard]] const float* w(int layer, std::string_view suffix) const {
    return weight(layer_tensor_name(model_, layer, suffix, config_.share_layer_weights));
  }
  [[nodiscard]] const float* weight(const std::string& name) const;
  /// A linear layer's weights: fp32, or bf16 with EngineConfig::bf16_gemm (every linear tensor
  /// but the embedding, and kv_b_proj unless mla_tensor_cores_).
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

  // The step's positions and lengths, in device memory: every kernel reads them when it runs, so
  // one CUDA graph of the step replays at every length. Written from pinned memory by the
  // step's first copy: [positions B][lengths B][positions S][lengths S][step], S = KV streams
  // (streams_), positions those of the new token, lengths after appending it.
  [[nodiscard]] std::int64_t* step_state(std::int64_t at) const {
    return step_state_.device_data() + at;
  }
  [[nodiscard]] const std::int64_t* positions() const { return step_state(0); }
  [[nodiscard]] const std::int64_t* lens() const { return step_state(batch_); }
  [[nodiscard]] const std::int64_t* stream_positions() const { return step_state(2 * batch_); }
  [[nodiscard]] const std::int64_t* stream_lens() const {
    return step_state(2 * batch_ + streams_);
  }
  [[nodiscard]] const std::int64_t* step_index() const {
    return step_state(2 * std::int64_t{batch_} + 2 * streams_);
  }
  void write_step_state();
  /// Everything a step runs on the GPU, enqueued on stream_ (and the selection stream) without
  /// a host synchronisation where replays_graph(); `stats` gets what the host learns on the way
  /// (Fathom's selection, quality samples).
  void enqueue_step(StepStats& stats);
  /// Whether this step replays the captured graph: EngineConfig::cuda_graph, a GPU-made workload
  /// (a replayed capture's queries come from the host), no host-side selection (Fathom) or quality
  /// sample in the step, and no timeline being traced (a traced step runs eagerly so that its NVTX
  /// ranges enclose each phase's kernels). The first step always runs eagerly (it configures the
  /// kernels and allocates the GEMM workspaces a capture must not).
  [[nodiscard]] bool replays_graph() const;
  /// Bytes the step's selection reads (StepStats::bytes_scanned) in the sparse-gpu selections.
  [[nodiscard]] std::int64_t selection_bytes() const;
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
  void select_dsa(int layer);
  /// The hot buffer's swap-in of layer `layer`'s selection (slots into slots_), on s().
  void swap_in(int layer, const std::int32_t* selected);
  /// Points attention's rows and index list at the hot buffer's rows and slots_.
  void read_hot_rows(int layer, kernels::DecodeAttentionArgs& a) const;
  void measure_quality(int layer, const kernels::DecodeAttentionArgs& sparse, int groups,
                       StepStats& stats);
  void ffn(int layer);
  void swiglu_block(int layer, const std::string& prefix, int width);
  /// EngineConfig::check_finite: marks `site` in first_non_finite_ when x holds a NaN or Inf.
  void check_finite(const Buffer<float>& x, std::int64_t n, int site);

  Stream stream_{Backend::cuda};
  Stream selection_stream_{Backend::cuda};
  GpuPhaseClock clock_{stream_.native()};
  const Stream* lane_ = &stream_;
  Event selection_fork_{Backend::cuda}, selection_done_{Backend::cuda};
  KvWorkload workload_;
  std::int64_t capacity_ = 0;  ///< rows per (request, KV head): context + max_decode_steps
  std::map<std::string, Buffer<float>, std::less<>> weights_;
  std::map<std::string, Buffer<std::uint16_t>, std::less<>> weights_bf16_;
  Buffer<std::uint16_t> gemm_x_;  ///< a GEMM's activations rounded to bf16 [batch x widest k]
  Buffer<std::uint16_t> gemm_x_selection_;  ///< the same for GEMMs on the selection stream
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
  /// activations (CUDA-core path) or workspace (tensor-core path); larger batches run every
  /// expert as GEMMs.
  bool fused_experts_ = false;
  /// bf16_gemm on an MLA model whose shape the tensor-core absorb and up-projection take
  /// (kernels/decode/mla_projections): kv_b_proj is held in bf16 only, with W_uk transposed per
  /// head beside it under its name + kUkTransposed.
  bool mla_tensor_cores_ = false;
  static constexpr const char* kUkTransposed = ":uk_t";
  std::vector<Buffer<const void*>> expert_tables_;
  Buffer<float> expert_act_;
  Buffer<std::uint8_t> expert_workspace_;
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
  Buffer<std::int64_t> step_state_, step_state_host_;
  std::unique_ptr<CudaGraph> graph_;       ///< the step, captured on its first replays_graph() step
  std::vector<int> graph_swap_in_layers_;  ///< the layers whose swap-in the graph holds
  size_t graph_marks_ = 0;                 ///< GpuPhaseClock pieces the graph records
  std::vector<Buffer<float>> attention_out_, query_record_;    ///< per layer, last step
  std::vector<std::int64_t> attention_floats_, query_floats_;  ///< per layer, last step
  Buffer<float> mla_workspace_;  ///< the MLA attention's partial sums, for its largest plan
  // Host staging: pinned copies for the workload's queries, the next tokens and the Fathom path.
  Buffer<float> workload_host_;
  Buffer<std::int32_t> tokens_host_;
  // EngineConfig::check_finite: the step's first non-finite site on the GPU and its pinned copy.
  Buffer<std::int32_t> first_non_finite_, first_non_finite_host_;
  std::vector<float> fathom_q_host_, fathom_k_host_;
  std::vector<std::int32_t> fathom_indices_host_;
};

}  // namespace hisparse::detail
