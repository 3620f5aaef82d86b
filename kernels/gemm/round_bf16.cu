// launch_round_to_bf16: the activations of a bf16-weight GEMM, rounded as the CPU twin rounds them
// (float_to_bf16: to nearest, ties to even). One thread per element.
#include <algorithm>

#include "core/cuda_check.hpp"
#include "core/dtypes.hpp"
#include "kernels/gemm/gemm.hpp"

namespace hisparse::kernels {
namespace {

__global__ void round_to_bf16_kernel(const float* x, int rows, int cols, int ldx,
                                     std::uint16_t* out) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    out[i] = float_to_bf16(x[r * ldx + c]);
  }
}

}  // namespace

void launch_round_to_bf16(const float* x, int rows, int cols, int ldx, std::uint16_t* out,
                          cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
  round_to_bf16_kernel<<<blocks, kThreads, 0, stream>>>(x, rows, cols, ldx, out);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
