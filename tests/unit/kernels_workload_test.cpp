// kernels/workload's CPU twins make exactly KvWorkload's values: keys, values, DSA index keys and
// the query walk over several steps, on both tiny models (the GPU test then holds the kernels to
// these twins).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/workload/workload_synth.hpp"
#include "model/kv_workload.hpp"
#include "model/model_spec.hpp"
#include "support/workload_tables.hpp"

namespace hisparse {
namespace {

TEST(KernelsWorkload, SynthesisedRowsAreTheWorkloadsKeysValuesAndIndexKeys) {
  for (const char* name : {"tiny-gqa", "tiny-dsa"}) {
    SCOPED_TRACE(name);
    const ModelSpec model = load_model(name);
    WorkloadSpec spec;
    spec.seed = 7;
    const KvWorkload w(model, spec, 3, 300);
    const int layer = model.layers - 1, g = w.kv_heads() - 1, dim = w.key_dim();
    const test::WorkloadTables t(w, layer, g);
    const std::int64_t first = 250, count = 70;  // the end of the context and beyond it
    kernels::SynthRowsArgs a;
    a.seeds = t.key_seeds.data();
    a.scale = t.scale.data();
    a.anchor = t.anchor.data();
    a.boost = t.boost;
    a.streams = w.requests();
    a.dim = dim;
    a.first = first;
    a.count = count;
    a.stream_stride = count * dim;
    std::vector<float> got(static_cast<std::size_t>(a.streams * count * dim));
    a.out = got.data();
    kernels::synth_rows_ref(a);
    std::vector<float> want(static_cast<std::size_t>(count * dim));
    for (int r = 0; r < w.requests(); ++r) {
      w.keys(r, layer, g, first, count, want.data());
      EXPECT_EQ(
          std::vector<float>(got.begin() + r * count * dim, got.begin() + (r + 1) * count * dim),
          want);
    }
    if (w.index_dim() == 0) {  // GQA: values
      a.seeds = t.value_seeds.data();
      a.scale = a.anchor = nullptr;
      a.dim = w.value_dim();
      kernels::synth_rows_ref(a);
      w.values(1, layer, g, first, count, want.data());
      EXPECT_EQ(std::vector<float>(got.begin() + count * dim, got.begin() + 2 * count * dim), want);
      continue;
    }
    const int ix = w.index_dim();
    a.channels = t.channels.data();
    a.out_dim = ix;
    a.stream_stride = count * ix;
    got.assign(static_cast<std::size_t>(a.streams * count * ix), 0.0f);
    kernels::synth_rows_ref(a);
    want.resize(static_cast<std::size_t>(count * ix));
    w.index_keys(2, layer, first, count, want.data());
    EXPECT_EQ(std::vector<float>(got.begin() + 2 * count * ix, got.end()), want);
  }
}

TEST(KernelsWorkload, QueryWalkAndIndexQueriesAreTheWorkloadsStepByStep) {
  for (const char* name : {"tiny-gqa", "tiny-dsa"}) {
    SCOPED_TRACE(name);
    const ModelSpec model = load_model(name);
    WorkloadSpec spec;
    spec.query_drift = 0.2;
    const KvWorkload w(model, spec, 2, 64);
    const int layer = 1;
    const test::WorkloadTables t(w, layer, 0);
    const std::int64_t n = std::int64_t{w.q_heads()} * w.key_dim();
    std::vector<float> state(static_cast<std::size_t>(2 * n)), out(state.size()), want(n);
    kernels::SynthQueriesArgs q = t.query_args(w, 2);
    q.state = state.data();
    q.out = out.data();
    for (std::int64_t step = 0; step < 4; ++step) {
      q.step = step;
      kernels::synth_queries_ref(q);
      w.queries(1, layer, step, want.data());
      EXPECT_EQ(std::vector<float>(out.begin() + n, out.end()), want) << "step " << step;
      if (w.index_dim() == 0) continue;
      const int ix = w.index_dim(), heads = w.index_heads();
      std::vector<float> iq(static_cast<std::size_t>(2 * heads * ix)), iwant(heads * ix);
      kernels::GatherIndexQueriesArgs gq;
      gq.q = out.data();
      gq.channels = t.channels.data();
      gq.out = iq.data();
      gq.requests = 2;
      gq.q_heads = w.q_heads();
      gq.q_dim = w.key_dim();
      gq.heads = heads;
      gq.dim = ix;
      kernels::gather_index_queries_ref(gq);
      w.index_queries(1, layer, step, iwant.data());
      EXPECT_EQ(std::vector<float>(iq.begin() + heads * ix, iq.end()), iwant) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace hisparse
