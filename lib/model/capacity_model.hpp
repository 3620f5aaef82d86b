// CapacityModel: bytes per request per mode and the largest concurrency a GPU memory budget
// admits. Pure arithmetic over the ModelSpec (no allocation), checked against hand figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/mode.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

struct RequestFootprint {
  Mode mode = Mode::dense;
  std::size_t gpu_bytes = 0;   ///< per request, all layers (sum of gpu_breakdown)
  std::size_t host_bytes = 0;  ///< per request in pinned host memory, all layers
  /// "kv_rows", "index_keys", "hot_buffer", "planes", ...
  std::map<std::string, std::size_t> gpu_breakdown;
  std::map<std::string, std::size_t> host_breakdown;
};

struct CapacityRow {
  RequestFootprint footprint;
  std::int64_t max_concurrency = 0;  ///< admitted by the GPU budget (and the host budget if given)
  std::string limited_by;            ///< "gpu" or "host"
};

struct CapacityQuery {
  std::int64_t context_length = 131072;
  int top_k = 0;       ///< 0: model default
  int hot_buffer = 0;  ///< 0: 2 * top_k
  int budget_bits = 48;
  double gpu_mem_bytes = 141e9;           ///< total GPU memory
  double host_mem_bytes = 0;              ///< pinned host memory budget, 0 = unlimited
  double activation_reserve_bytes = 4e9;  ///< kept free for activations and workspace
  /// The CPU backend: a request's GPU and host bytes both come out of gpu_mem_bytes (its RAM).
  bool one_memory = false;
};

/// The bytes of one request that count against CapacityQuery::gpu_mem_bytes.
[[nodiscard]] std::size_t budgeted_bytes(const RequestFootprint& f,
                                         const CapacityQuery& q) noexcept;

/// Whether `mode` applies to `model`: hisparse needs a DSA indexer, fathom modes need GQA.
/// When not, `why` (if given) says why.
[[nodiscard]] bool mode_supported(const ModelSpec& model, Mode mode, std::string* why = nullptr);
/// Layers that hold an indexer (and index keys): ceil(layers / indexer.every_n_layers), 0 without.
[[nodiscard]] int indexer_layer_count(const ModelSpec& model) noexcept;

class CapacityModel {
 public:
  explicit CapacityModel(ModelSpec model) : model_(std::move(model)) {}
  /// Weight bytes held by one GPU (attention of all layers, experts this rank holds, embeddings).
  [[nodiscard]] std::size_t weight_bytes() const;
  [[nodiscard]] RequestFootprint footprint(Mode mode, const CapacityQuery& q) const;
  /// One row per mode that applies to the model (fathom modes need GQA, sparse modes need an indexer
  /// or an exact top-k).
  [[nodiscard]] std::vector<CapacityRow> plan(const CapacityQuery& q) const;
  /// The longest context_length, at most q.context_length, at which `requests` requests of
  /// `mode` fit the query's budgets (what plan() checks); 0 when not even one-token requests fit.
  [[nodiscard]] std::int64_t longest_context(Mode mode, const CapacityQuery& q,
                                             std::int64_t requests = 1) const;

 private:
  /// One mode's footprint and the concurrency the query's budgets admit.
  [[nodiscard]] CapacityRow row(Mode mode, const CapacityQuery& q) const;

  ModelSpec model_;
};

}  // namespace hisparse
