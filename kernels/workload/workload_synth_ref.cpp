#include "kernels/workload/workload_synth.hpp"

namespace hisparse::kernels {

void synth_rows_ref(const SynthRowsArgs& a) {
  const int out_dim = a.out_dim > 0 ? a.out_dim : a.dim;
  const std::int64_t row_stride = a.row_stride > 0 ? a.row_stride : out_dim;
  for (int s = 0; s < a.streams; ++s)
    for (std::int64_t i = 0; i < a.count; ++i)
      for (int c = 0; c < out_dim; ++c) synth_row_store(a, s, i, c, row_stride);
}

void synth_queries_ref(const SynthQueriesArgs& a) {
  const std::int64_t n = std::int64_t{a.q_heads} * a.dim;
  for (int r = 0; r < a.requests; ++r)
    for (std::int64_t i = 0; i < n; ++i) synth_query_value(a, r, i);
}

void gather_index_queries_ref(const GatherIndexQueriesArgs& a) {
  for (int r = 0; r < a.requests; ++r)
    for (int h = 0; h < a.heads; ++h)
      for (int c = 0; c < a.dim; ++c)
        a.out[(std::int64_t{r} * a.heads + h) * a.dim + c] =
            a.q[(std::int64_t{r} * a.q_heads + h % a.q_heads) * a.q_dim + a.channels[c]];
}

}  // namespace hisparse::kernels
