#include "model/capacity_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {

using Size = std::size_t;

[[nodiscard]] Size sz(int v) {
  return static_cast<Size>(v);
}
[[nodiscard]] Size sz(std::int64_t v) {
  return static_cast<Size>(v);
}

// Linear-layer weights are stored in weight_dtype; fp8 checkpoints add one fp32 scale per
// 128 x 128 block. Embeddings, LM head, norms and the router stay bf16 in fp8 checkpoints too.
struct WeightCounter {
  bool fp8 = false;
  Size bytes = 0;
  void linear(Size rows, Size cols) {
    if (fp8) {
      bytes += rows * cols + ((rows + 127) / 128) * ((cols + 127) / 128) * 4;
    } else {
      bytes += rows * cols * 2;
    }
  }
  void bf16(Size elements) { bytes += elements * 2; }
};

[[nodiscard]] int top_k_of(const ModelSpec& m, const CapacityQuery& q) {
  if (q.top_k > 0) return q.top_k;
  return m.has_indexer() ? m.indexer.top_k : 2048;
}

}  // namespace

int indexer_layer_count(const ModelSpec& m) noexcept {
  if (!m.has_indexer()) return 0;
  return (m.layers + m.indexer.every_n_layers - 1) / m.indexer.every_n_layers;
}

bool mode_supported(const ModelSpec& m, Mode mode, std::string* why) {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  switch (mode) {
    case Mode::dense:
    case Mode::sparse_gpu:
      return true;
    case Mode::hisparse:
      // MLA: the DSA indexer picks the rows. GQA: the exact top-k over GPU-resident keys does.
      if (m.is_mla() && !m.has_indexer())
        return no(fmt::format(
            "mode hisparse on an MLA model needs a DSA indexer to pick the rows ({} has none)",
            m.name));
      return true;
    case Mode::fathom:
    case Mode::hisparse_fathom:
      if (m.is_mla())
        return no(fmt::format("mode {} needs a GQA model ({} uses MLA)", name_of(mode), m.name));
      return true;
  }
  return no("unknown mode");
}

std::size_t CapacityModel::weight_bytes() const {
  const ModelSpec& m = model_;
  WeightCounter w{m.weight_dtype == "fp8_e4m3", 0};
  const Size hidden = sz(m.hidden);
  for (int layer = 0; layer < m.layers; ++layer) {
    w.bf16(2 * hidden);  // input and post-attention RMSNorm
    if (m.is_mla()) {
      const MlaShape& a = m.mla;
      const Size qk = sz(a.qk_nope_head_dim + a.qk_rope_head_dim);
      w.linear(sz(a.q_lora_rank), hidden);                        // q_a
      w.bf16(sz(a.q_lora_rank));                                  // q_a norm
      w.linear(sz(a.heads) * qk, sz(a.q_lora_rank));              // q_b
      w.linear(sz(a.kv_lora_rank + a.qk_rope_head_dim), hidden);  // kv_a
      w.bf16(sz(a.kv_lora_rank));                                 // kv_a norm
      w.linear(sz(a.heads) * sz(a.qk_nope_head_dim + a.v_head_dim), sz(a.kv_lora_rank));  // kv_b
      w.linear(hidden, sz(a.heads) * sz(a.v_head_dim));                                   // o
    } else {
      const GqaShape& a = m.gqa;
      w.linear(sz(a.q_heads) * sz(a.head_dim), hidden);
      w.linear(2 * sz(a.kv_heads) * sz(a.head_dim), hidden);
      w.linear(hidden, sz(a.q_heads) * sz(a.head_dim));
      if (a.qk_norm) w.bf16(2 * sz(a.head_dim));
    }
    if (m.has_indexer() && layer % m.indexer.every_n_layers == 0) {
      const IndexerShape& ix = m.indexer;
      w.linear(sz(ix.heads) * sz(ix.head_dim), sz(m.mla.q_lora_rank));  // indexer q
      w.linear(sz(ix.head_dim), hidden);                                // indexer k
      w.bf16(2 * sz(ix.head_dim));                                      // k norm weight + bias
      w.bf16(sz(ix.heads) * hidden);                                    // head weights
    }
    const bool dense_layer = m.ffn.kind == FfnKind::dense || layer < m.ffn.first_dense_layers;
    if (dense_layer) {
      w.linear(3 * sz(m.ffn.dense_width), hidden);
    } else {
      w.bf16(sz(m.ffn.experts) * hidden);  // router over all experts
      for (int e = 0; e < m.ffn.experts_held + m.ffn.shared_experts; ++e)
        w.linear(3 * sz(m.ffn.expert_width), hidden);
    }
  }
  w.bf16(2 * sz(m.vocab) * hidden + hidden);  // embeddings, LM head, final norm
  return w.bytes;
}

RequestFootprint CapacityModel::footprint(Mode mode, const CapacityQuery& q) const {
  const ModelSpec& m = model_;
  std::string why;
  if (!mode_supported(m, mode, &why))
    throw Error(fmt::format("mode {}", name_of(mode)), why,
                m.is_mla() ? "use dense, sparse-gpu or hisparse for MLA models"
                           : "use dense, sparse-gpu, hisparse, fathom or hisparse+fathom for GQA "
                             "models");
  if (q.context_length <= 0)
    throw Error("context_length", fmt::format("must be positive, got {}", q.context_length),
                "give the tokens per request, e.g. 131072");
  const Size L = sz(q.context_length);
  const Size layers = sz(m.layers);
  const Size row = m.kv_row_bytes();
  const Size top_k = sz(top_k_of(m, q));
  const Size hot = q.hot_buffer > 0 ? sz(q.hot_buffer) : 2 * top_k;
  const Size kv_rows = row * layers * L;
  const Size index_keys = m.index_key_bytes() * sz(indexer_layer_count(m)) * L;
  const Size hot_rows = row * (hot + 1) * layers;  // + the reserved newest-token slot
  // Per layer, HotBuffer's tables: slot -> token and LRU order (4 B per slot each) and the
  // residency bitmap (one bit per token, in 32-bit words).
  const Size hot_tables = (8 * hot + 4 * ((L + 31) / 32)) * layers;
  // Fathom store: 4 bit planes per channel (head_dim / 2 B) + an fp16 scale per 64-token block
  // and channel (head_dim / 32 B): 68 B per token per KV head at head_dim 128.
  const Size plane_bytes = m.is_mla() ? 0
                                      : (sz(m.gqa.head_dim) / 2 + sz(m.gqa.head_dim) * 2 / 64) *
                                            sz(m.gqa.kv_heads) * layers * L;

  RequestFootprint f;
  f.mode = mode;
  switch (mode) {
    case Mode::dense:
    case Mode::sparse_gpu:
      f.gpu_breakdown["kv_rows"] = kv_rows;
      if (index_keys) f.gpu_breakdown["index_keys"] = index_keys;
      break;
    case Mode::hisparse:
      // What picks the rows stays on the GPU: the indexer's keys (MLA) or, for the exact top-k
      // of a GQA model, the K half of every row.
      if (m.is_mla())
        f.gpu_breakdown["index_keys"] = index_keys;
      else
        f.gpu_breakdown["keys"] = kv_rows / 2;
      f.gpu_breakdown["hot_buffer"] = hot_rows;
      f.gpu_breakdown["hot_tables"] = hot_tables;
      f.host_breakdown["kv_rows"] = kv_rows;
      break;
    case Mode::fathom:
      f.gpu_breakdown["planes"] = plane_bytes;
      f.gpu_breakdown["staging"] = top_k * row;  // one layer's fetched rows at a time
      f.host_breakdown["kv_rows"] = kv_rows;
      break;
    case Mode::hisparse_fathom:
      f.gpu_breakdown["planes"] = plane_bytes;
      f.gpu_breakdown["hot_buffer"] = hot_rows;
      f.gpu_breakdown["hot_tables"] = hot_tables;
      f.host_breakdown["kv_rows"] = kv_rows;
      break;
  }
  for (const auto& [k, v] : f.gpu_breakdown) f.gpu_bytes += v;
  for (const auto& [k, v] : f.host_breakdown) f.host_bytes += v;
  return f;
}

std::size_t budgeted_bytes(const RequestFootprint& f, const CapacityQuery& q) noexcept {
  return f.gpu_bytes + (q.one_memory ? f.host_bytes : 0);
}

CapacityRow CapacityModel::row(Mode mode, const CapacityQuery& q) const {
  const double gpu_free =
      q.gpu_mem_bytes - static_cast<double>(weight_bytes()) - q.activation_reserve_bytes;
  CapacityRow r;
  r.footprint = footprint(mode, q);
  const auto per_gpu = static_cast<double>(budgeted_bytes(r.footprint, q));
  r.max_concurrency = gpu_free <= 0 ? 0 : static_cast<std::int64_t>(std::floor(gpu_free / per_gpu));
  r.limited_by = "gpu";
  if (q.host_mem_bytes > 0 && r.footprint.host_bytes > 0) {
    const auto by_host = static_cast<std::int64_t>(
        std::floor(q.host_mem_bytes / static_cast<double>(r.footprint.host_bytes)));
    if (by_host < r.max_concurrency) {
      r.max_concurrency = by_host;
      r.limited_by = "host";
    }
  }
  return r;
}

std::vector<CapacityRow> CapacityModel::plan(const CapacityQuery& q) const {
  HISPARSE_FUNC_RANGE();
  std::vector<CapacityRow> rows;
  for (Mode mode :
       {Mode::dense, Mode::sparse_gpu, Mode::hisparse, Mode::fathom, Mode::hisparse_fathom})
    if (mode_supported(model_, mode, nullptr)) rows.push_back(row(mode, q));
  return rows;
}

std::int64_t CapacityModel::longest_context(Mode mode, const CapacityQuery& q,
                                            std::int64_t requests) const {
  HISPARSE_FUNC_RANGE();
  // A request's bytes never shrink as its context grows, so the contexts that fit are a prefix.
  const auto fits = [&](std::int64_t context) {
    CapacityQuery at = q;
    at.context_length = context;
    return row(mode, at).max_concurrency >= requests;
  };
  if (q.context_length < 1 || !fits(1)) return 0;
  std::int64_t lo = 1, hi = q.context_length;  // fits(lo); the answer is in [lo, hi]
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace hisparse
