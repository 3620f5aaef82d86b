// FathomKeyIndex: the DecodeEngine's Fathom selection on GQA models. Per layer one
// fathom::PlaneStore in the host (offloaded) layout whose streams are the engine's KV streams
// (request * kv_heads + kv_head), the calibration variance of each stream over its context keys,
// and a FathomSelector (sinks, recent window, per-head top (k - sinks - recent), union over the
// GQA group). Keys enter as floats and are stored as bf16 before quantisation, as a deployment
// stores them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/device.hpp"
#include "core/memory.hpp"
#include "fathom/key_centre.hpp"
#include "fathom/klt.hpp"
#include "fathom/plane_store.hpp"
#include "fathom/selector.hpp"

namespace hisparse {

struct FathomIndexShape {
  int layers = 1;
  int streams = 1;
  int head_dim = 0;
  int group = 1;              ///< query heads per KV head
  std::int64_t capacity = 0;  ///< tokens per stream
  /// Plan and scan in each stream's calibration eigenbasis (fathom::KltBasis of its context keys):
  /// keys are rotated before quantisation and queries before planning, and the planner's
  /// variances are the eigenvalues. For models without QK-norm. Exact attention is unaffected.
  bool klt = false;
  /// Quantise each stream's keys minus their calibration mean (fathom::KeyCentre, the same
  /// tokens as the variances), before any KLT rotation. Selections see the same rankings.
  bool centre_keys = false;
  /// Optional per-(layer, KV head) budget table, layer by layer (fathom::head_budgets): each
  /// stream plans the selector's budget times its KV head's share of the table's mean.
  /// Streams are request-major: stream s is KV head s % kv_heads.
  std::vector<int> head_budgets;
  int kv_heads = 1;
};

/// What one select() read and chose.
struct FathomSelectStats {
  std::int64_t bytes_scanned = 0;  ///< plane words and fp16 scales the scan read
  std::int64_t rows_selected = 0;  ///< selected positions over all streams
  std::int64_t plans = 0;          ///< depth plans made: one per stream
  /// Sums over the plans of their bits per token (planes + 0.25 per channel that reads its
  /// scales: fathom::plan_bits) and of their active channels (fathom::active_channels).
  double plan_bits = 0;
  std::int64_t active_channels = 0;
};

class FathomKeyIndex {
 public:
  FathomKeyIndex(const FathomIndexShape& shape, const fathom::SelectorConfig& selector,
                 Backend backend);

  /// Entries per stream of a selection: sinks + recent + group x (top_k - sinks - recent).
  [[nodiscard]] int width() const noexcept { return width_; }
  [[nodiscard]] const FathomIndexShape& shape() const noexcept { return shape_; }
  /// The planes of `layer` (keys as stored: centred and/or rotated when the shape says so).
  [[nodiscard]] const fathom::PlaneStore& store(int layer) const {
    return *stores_.at(static_cast<std::size_t>(layer));
  }

  /// Quantises `tokens` context keys of every stream of `layer` (key of stream s, token t at
  /// keys + s * stream_stride + t * head_dim) and measures the calibration variances
  /// (fathom::calibration_variance, first 16 tokens skipped); with the selector's
  /// PlanRule::measured also the plane reads (fathom::calibrate_plane_reads, the same tokens, the
  /// rotated keys with klt).
  void load_context(int layer, const float* keys, std::int64_t stream_stride, std::int64_t tokens);
  /// Appends one token per stream: keys [streams][head_dim].
  void append(int layer, const float* keys);
  /// Plans, scans and selects for every stream of `layer` with queries [streams][group][head_dim]:
  /// out [streams][width()] ascending positions, then -1.
  FathomSelectStats select(int layer, const float* queries, std::int32_t* out);

 private:
  FathomIndexShape shape_;
  int width_ = 0;
  fathom::FathomSelector selector_;
  std::vector<std::unique_ptr<fathom::PlaneStore>> stores_;
  std::vector<std::vector<float>> variances_;            ///< per layer [streams][head_dim]
  std::vector<std::vector<fathom::KltBasis>> bases_;     ///< klt: per layer, per stream
  std::vector<std::vector<fathom::KeyCentre>> centres_;  ///< centre_keys: per layer, per stream
  /// measured: per layer, the packed read calibrations of its streams (built by load_context)
  std::vector<std::optional<fathom::ReadTables>> reads_;
  /// head_budgets: per layer, the budget of every stream; empty without a table
  std::vector<std::vector<std::int32_t>> budgets_;
  std::vector<float> rotated_queries_;                 ///< klt: [streams][group][head_dim]
  std::vector<std::uint16_t> key_bf16_, key_rotated_;  ///< append(): [streams][head_dim]
  Backend backend_;
  Buffer<std::uint16_t> staging_;  ///< CUDA: the keys being appended, in device memory
  [[nodiscard]] const std::uint16_t* readable(const std::uint16_t* host, std::size_t n);
};

}  // namespace hisparse
