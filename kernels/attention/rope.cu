// launch_rope: one thread per (row, head, pair). Angles in double, as the twin computes them, so
// results match within float rounding of the final rotation.
#include "core/cuda_check.hpp"
#include "kernels/attention/rope.hpp"

namespace hisparse::kernels {
namespace {

__global__ void rope_kernel(RopeArgs a) {
  const int half = a.dim / 2;
  const int row_stride = a.row_stride ? a.row_stride : a.heads * a.head_stride;
  const std::int64_t n = static_cast<std::int64_t>(a.rows) * a.heads * half;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int h = static_cast<int>((t / half) % a.heads);
    const int r = static_cast<int>(t / (static_cast<std::int64_t>(half) * a.heads));
    const double inv_freq =
        pow(static_cast<double>(a.theta), -2.0 * i / static_cast<double>(a.dim));
    const double angle = static_cast<double>(a.positions[r]) * inv_freq;
    const auto c = static_cast<float>(cos(angle));
    const auto s = static_cast<float>(sin(angle));
    float* v = a.x + static_cast<std::ptrdiff_t>(r) * row_stride +
               static_cast<std::ptrdiff_t>(h) * a.head_stride + a.offset;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace

void launch_rope(const RopeArgs& args, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(args.rows) * args.heads * (args.dim / 2);
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + 127) / 128, 65535));
  rope_kernel<<<blocks, 128, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
