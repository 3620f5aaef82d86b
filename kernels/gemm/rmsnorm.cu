// launch_rmsnorm: one block per row; the sum of squares is a block reduction (fp32), so the
// result matches the CPU twin within float rounding, not bit for bit.
#include "core/cuda_check.hpp"
#include "kernels/common/block_reduce.cuh"
#include "kernels/gemm/rmsnorm.hpp"

namespace hisparse::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(RmsNormArgs a) {
  const int ldx = a.ldx ? a.ldx : a.n, ldy = a.ldy ? a.ldy : a.n;
  const float* x = a.x + static_cast<std::ptrdiff_t>(blockIdx.x) * ldx;
  float* y = a.y + static_cast<std::ptrdiff_t>(blockIdx.x) * ldy;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < a.n; i += blockDim.x) sum_sq += x[i] * x[i];
  __shared__ float scratch[32];
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = rsqrtf(sum_sq / static_cast<float>(a.n) + a.eps);
  for (int i = threadIdx.x; i < a.n; i += blockDim.x)
    y[i] = x[i] * inv * (a.weight ? a.weight[i] : 1.0f);
}

}  // namespace

void launch_rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.rows <= 0) return;
  rmsnorm_kernel<<<args.rows, kThreads, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
