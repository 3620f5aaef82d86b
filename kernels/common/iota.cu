#include "kernels/common/iota.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels {
namespace {
__global__ void iota_kernel(IotaArgs args) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < args.n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    args.out[i] = args.start + static_cast<float>(i) * args.step;
}
}  // namespace

void launch_iota(const IotaArgs& args, cudaStream_t stream) {
  if (args.n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((args.n + 255) / 256, 4096));
  iota_kernel<<<blocks, 256, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}
}  // namespace hisparse::kernels
