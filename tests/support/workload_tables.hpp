// The host tables kernels/workload reads, taken from a KvWorkload for one (layer, KV head): the
// unit test checks the CPU twins against KvWorkload with them, the GPU test the kernels against
// the twins.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/workload/workload_synth.hpp"
#include "model/kv_workload.hpp"

namespace hisparse::test {

struct WorkloadTables {
  std::vector<float> scale, anchor, anchors;  ///< anchors: every KV head of the layer
  std::vector<std::uint64_t> key_seeds, value_seeds, query_seeds;  ///< one per request
  std::vector<std::int32_t> channels;
  kernels::KeyBoost boost;

  WorkloadTables(const KvWorkload& w, int layer, int kv_head)
      : scale(w.key_scale(layer, kv_head)),
        anchor(w.key_anchor(layer, kv_head)),
        boost(w.key_boost_params(layer, kv_head)) {
    for (int g = 0; g < w.kv_heads(); ++g) {
      const auto& a = w.key_anchor(layer, g);
      anchors.insert(anchors.end(), a.begin(), a.end());
    }
    for (int r = 0; r < w.requests(); ++r) {
      key_seeds.push_back(w.key_seed(r, layer, kv_head));
      value_seeds.push_back(w.value_seed(r, layer, kv_head));
      query_seeds.push_back(w.query_seed(r, layer));
    }
    if (w.index_dim() > 0)
      for (int c : w.index_channels(layer)) channels.push_back(c);
  }

  /// The query walk's arguments for `requests` requests, reading this table's seeds and anchors
  /// (state and out left to the caller).
  [[nodiscard]] kernels::SynthQueriesArgs query_args(const KvWorkload& w, int requests) const {
    kernels::SynthQueriesArgs q;
    q.seeds = query_seeds.data();
    q.anchors = anchors.data();
    q.requests = requests;
    q.q_heads = w.q_heads();
    q.kv_heads = w.kv_heads();
    q.dim = w.key_dim();
    q.rho = w.query_rho();
    q.fresh = w.query_fresh();
    q.c_q = w.query_anchor_gain();
    return q;
  }
};

}  // namespace hisparse::test
