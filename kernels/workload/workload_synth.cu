#include "core/cuda_check.hpp"
#include "kernels/workload/workload_synth.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void synth_rows_kernel(SynthRowsArgs a, int out_dim, std::int64_t row_stride) {
  const std::int64_t per_stream = a.count * out_dim;
  const std::int64_t total = per_stream * a.streams;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const int s = static_cast<int>(e / per_stream);
    const std::int64_t rest = e % per_stream;
    const std::int64_t i = rest / out_dim;
    const int c = static_cast<int>(rest % out_dim);
    synth_row_store(a, s, i, c, row_stride);
  }
}

__global__ void synth_queries_kernel(SynthQueriesArgs a) {
  const std::int64_t n = std::int64_t{a.q_heads} * a.dim;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n * a.requests;
       e += std::int64_t{gridDim.x} * blockDim.x)
    synth_query_value(a, static_cast<int>(e / n), e % n);
}

__global__ void gather_index_queries_kernel(GatherIndexQueriesArgs a) {
  const std::int64_t total = std::int64_t{a.requests} * a.heads * a.dim;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(e % a.dim);
    const std::int64_t rh = e / a.dim;
    const int h = static_cast<int>(rh % a.heads), r = static_cast<int>(rh / a.heads);
    a.out[e] = a.q[(std::int64_t{r} * a.q_heads + h % a.q_heads) * a.q_dim + a.channels[c]];
  }
}

[[nodiscard]] unsigned grid_for(std::int64_t elements) {
  const std::int64_t blocks = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 65535));
}

}  // namespace

void launch_synth_rows(const SynthRowsArgs& a, cudaStream_t stream) {
  const int out_dim = a.out_dim > 0 ? a.out_dim : a.dim;
  const std::int64_t row_stride = a.row_stride > 0 ? a.row_stride : out_dim;
  const std::int64_t total = a.count * out_dim * a.streams;
  if (total <= 0) return;
  synth_rows_kernel<<<grid_for(total), kThreads, 0, stream>>>(a, out_dim, row_stride);
  HISPARSE_CUDA_CHECK(cudaGetLastError());
}

void launch_synth_queries(const SynthQueriesArgs& a, cudaStream_t stream) {
  const std::int64_t total = std::int64_t{a.requests} * a.q_heads * a.dim;
  if (total <= 0) return;
  synth_queries_kernel<<<grid_for(total), kThreads, 0, stream>>>(a);
  HISPARSE_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_index_queries(const GatherIndexQueriesArgs& a, cudaStream_t stream) {
  const std::int64_t total = std::int64_t{a.requests} * a.heads * a.dim;
  if (total <= 0) return;
  gather_index_queries_kernel<<<grid_for(total), kThreads, 0, stream>>>(a);
  HISPARSE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hisparse::kernels
