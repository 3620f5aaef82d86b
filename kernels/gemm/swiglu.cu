// launch_swiglu: one thread per output element.
#include "core/cuda_check.hpp"
#include "kernels/gemm/swiglu.hpp"

namespace hisparse::kernels {
namespace {

__global__ void swiglu_kernel(SwigluArgs a) {
  const std::int64_t n = static_cast<std::int64_t>(a.rows) * a.width;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / a.width, c = i % a.width;
    const float g = a.gate_up[r * 2 * a.width + c], u = a.gate_up[r * 2 * a.width + a.width + c];
    a.out[i] = g / (1.0f + expf(-g)) * u;
  }
}

}  // namespace

void launch_swiglu(const SwigluArgs& args, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(args.rows) * args.width;
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + 255) / 256, 65535));
  swiglu_kernel<<<blocks, 256, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
