#include "kernels/fathom/quantize_pack.hpp"

#include <algorithm>

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

// One thread per (stream, block, channel); adjacent threads read adjacent channels of a key row.
__global__ void quantize_pack_kernel(QuantizePackArgs args, std::int64_t blocks) {
  const std::int64_t channels = args.layout.channels;
  const std::int64_t total = static_cast<std::int64_t>(args.streams) * blocks * channels;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>(idx % channels);
    const std::int64_t b = (idx / channels) % blocks;
    const std::int64_t s = idx / (channels * blocks);
    const std::uint16_t* keys =
        args.keys + s * args.stream_stride + b * kBlockTokens * args.token_stride + ch;
    const std::int64_t left = args.tokens - b * kBlockTokens;
    const int count = static_cast<int>(left < kBlockTokens ? left : kBlockTokens);
    float absmax = 0.0f;
    for (int i = 0; i < count; ++i)
      absmax = fmaxf(absmax, fabsf(bf16_to_float(keys[i * args.token_stride])));
    const std::uint16_t scale_bits = block_scale_f16(absmax);
    const float scale = f16_to_float(scale_bits);
    std::uint64_t plane[kPlanes] = {0, 0, 0, 0};
    for (int i = 0; i < count; ++i) {
      const std::uint32_t code = quantize_code(bf16_to_float(keys[i * args.token_stride]), scale);
#pragma unroll
      for (int p = 0; p < kPlanes; ++p)
        plane[p] |= static_cast<std::uint64_t>((code >> (kPlanes - 1 - p)) & 1u) << i;
    }
    const std::int64_t block = args.first_block + b;
    std::uint64_t* words = args.words + s * args.layout.words_per_stream();
#pragma unroll
    for (int p = 0; p < kPlanes; ++p) words[args.layout.word_index(block, ch, p)] = plane[p];
    args.scales[s * args.layout.scales_per_stream() + args.layout.scale_index(block, ch)] =
        scale_bits;
  }
}

}  // namespace

void launch_quantize_pack(const QuantizePackArgs& args, cudaStream_t stream) {
  const std::int64_t blocks = (args.tokens + kBlockTokens - 1) / kBlockTokens;
  const std::int64_t total =
      static_cast<std::int64_t>(args.streams) * blocks * args.layout.channels;
  if (total == 0) return;
  const int threads = 128;
  const auto grid =
      static_cast<unsigned>(std::min<std::int64_t>((total + threads - 1) / threads, 65536));
  quantize_pack_kernel<<<grid, threads, 0, stream>>>(args, blocks);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
