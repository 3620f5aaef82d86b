#include "fathom/plane_store.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/fathom/quantize_pack.hpp"
#include "trace/nvtx.hpp"

namespace hisparse::fathom {
namespace kf = kernels::fathom;

PlaneStore::PlaneStore(Backend backend, PlaneLayoutKind kind, std::int32_t streams, int channels,
                       std::int64_t capacity_tokens, std::string label)
    : backend_(backend), streams_(streams), label_(std::move(label)) {
  HISPARSE_FUNC_RANGE();
  if (streams < 1)
    throw Error(label_, fmt::format("{} streams", streams), "use at least one stream");
  if (channels < 1 || channels > kf::kMaxChannels)
    throw Error(label_, fmt::format("head_dim {}", channels),
                fmt::format("use 1..{}", kf::kMaxChannels));
  if (capacity_tokens < 1)
    throw Error(label_, fmt::format("capacity {} tokens", capacity_tokens),
                "use a positive capacity");
  layout_.kind = kind;
  layout_.channels = channels;
  const std::int64_t blocks = (capacity_tokens + kf::kBlockTokens - 1) / kf::kBlockTokens;
  layout_.capacity_blocks =
      (blocks + kf::kSuperblockBlocks - 1) / kf::kSuperblockBlocks * kf::kSuperblockBlocks;
  const auto word_count = static_cast<std::size_t>(layout_.words_per_stream() * streams);
  const auto scale_count = static_cast<std::size_t>(layout_.scales_per_stream() * streams);
  if (kind == PlaneLayoutKind::host) {
    words_ = Buffer<std::uint64_t>::pinned(word_count, backend, label_ + " (host planes)");
    scales_ = Buffer<std::uint16_t>::pinned(scale_count, backend, label_ + " (host scales)");
  } else {
    words_ = Buffer<std::uint64_t>::device(word_count, backend, label_ + " (HBM planes)");
    scales_ = Buffer<std::uint16_t>::device(scale_count, backend, label_ + " (HBM scales)");
  }
  tail_ =
      Buffer<std::uint16_t>::device(static_cast<std::size_t>(streams) * kf::kBlockTokens * channels,
                                    backend, label_ + " (tail keys)");
  lengths_ = Buffer<std::int64_t>::device(static_cast<std::size_t>(streams), backend,
                                          label_ + " (lengths)");
  lengths_host_.assign(static_cast<std::size_t>(streams), 0);
  copy_bytes(lengths_.device_data(), lengths_host_.data(), lengths_.bytes(), backend);
}

std::int64_t PlaneStore::max_length() const noexcept {
  return lengths_host_.empty() ? 0 : *std::max_element(lengths_host_.begin(), lengths_host_.end());
}

void PlaneStore::copy_rows(std::uint16_t* dst, std::int64_t dst_stride, const std::uint16_t* src,
                           std::int64_t src_stride, std::int64_t rows, NativeStream stream) {
  const std::size_t row_bytes = static_cast<std::size_t>(layout_.channels) * 2;
  if (rows <= 0) return;
  if (backend_ == Backend::cpu) {
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_stride, src + r * src_stride, row_bytes);
    return;
  }
#if HISPARSE_WITH_CUDA
  HISPARSE_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<std::size_t>(dst_stride) * 2, src,
                                        static_cast<std::size_t>(src_stride) * 2, row_bytes,
                                        static_cast<std::size_t>(rows), cudaMemcpyDefault, stream));
#else
  (void)stream;
#endif
}

void PlaneStore::quantize(std::int32_t first_stream, std::int32_t stream_count,
                          const std::uint16_t* keys, std::int64_t token_stride,
                          std::int64_t stream_stride, std::int64_t tokens, std::int64_t first_block,
                          NativeStream stream) {
  kf::QuantizePackArgs args;
  args.keys = keys;
  args.token_stride = token_stride;
  args.stream_stride = stream_stride;
  args.streams = stream_count;
  args.tokens = tokens;
  args.first_block = first_block;
  args.layout = layout_;
  args.words = words_.device_data() + first_stream * layout_.words_per_stream();
  args.scales = scales_.device_data() + first_stream * layout_.scales_per_stream();
  if (backend_ == Backend::cpu) {
    kf::quantize_pack_ref(args);
    return;
  }
#if HISPARSE_WITH_CUDA
  kf::launch_quantize_pack(args, stream);
#else
  (void)stream;
#endif
}

void PlaneStore::append(std::int32_t first_stream, std::int32_t stream_count,
                        const std::uint16_t* keys, std::int64_t token_stride,
                        std::int64_t stream_stride, std::int64_t count, NativeStream stream) {
  HISPARSE_FUNC_RANGE();
  if (first_stream < 0 || stream_count < 1 || first_stream + stream_count > streams_)
    throw Error(label_,
                fmt::format("streams [{}, {}) outside the store's {} streams", first_stream,
                            first_stream + stream_count, streams_),
                "append to existing streams");
  const std::int64_t n0 = lengths_host_[first_stream];
  for (std::int32_t s = first_stream; s < first_stream + stream_count; ++s)
    if (lengths_host_[s] != n0)
      throw Error(label_,
                  fmt::format("stream {} holds {} tokens, stream {} holds {}", first_stream, n0, s,
                              lengths_host_[s]),
                  "append to streams of equal length in one call");
  if (count < 0 || n0 + count > capacity_tokens())
    throw Error(label_,
                fmt::format("appending {} tokens to {} exceeds the capacity of {} tokens", count,
                            n0, capacity_tokens()),
                "create the store with a larger capacity");
  if (count == 0) return;
  const int d = layout_.channels;
  const std::int64_t tail_stream_stride = static_cast<std::int64_t>(kf::kBlockTokens) * d;
  std::uint16_t* tail = tail_.device_data() + first_stream * tail_stream_stride;
  std::int64_t done = 0;
  std::int64_t n = n0;
  auto fill_tail = [&](std::int64_t take) {  // tokens [done, done + take) into the open block
    const std::int64_t pos = n % kf::kBlockTokens;
    for (std::int32_t s = 0; s < stream_count; ++s)
      copy_rows(tail + s * tail_stream_stride + pos * d, d,
                keys + s * stream_stride + done * token_stride, token_stride, take, stream);
    quantize(first_stream, stream_count, tail, d, tail_stream_stride, pos + take,
             n / kf::kBlockTokens, stream);
    n += take;
    done += take;
  };
  if (n % kf::kBlockTokens != 0)
    fill_tail(std::min(count, kf::kBlockTokens - n % kf::kBlockTokens));
  const std::int64_t whole = (count - done) / kf::kBlockTokens * kf::kBlockTokens;
  if (whole > 0) {
    quantize(first_stream, stream_count, keys + done * token_stride, token_stride, stream_stride,
             whole, n / kf::kBlockTokens, stream);
    n += whole;
    done += whole;
  }
  if (done < count) fill_tail(count - done);
  for (std::int32_t s = first_stream; s < first_stream + stream_count; ++s) lengths_host_[s] = n;
  if (backend_ == Backend::cpu) {
    std::copy(lengths_host_.begin(), lengths_host_.end(), lengths_.device_data());
    return;
  }
#if HISPARSE_WITH_CUDA
  // lengths_host_ may change before an asynchronous copy from it runs: wait for these few bytes.
  HISPARSE_CUDA_CHECK(
      cudaMemcpyAsync(lengths_.device_data() + first_stream, lengths_host_.data() + first_stream,
                      sizeof(std::int64_t) * stream_count, cudaMemcpyHostToDevice, stream));
  HISPARSE_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

}  // namespace hisparse::fathom
