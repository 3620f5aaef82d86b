#include "hotcache/hot_cache.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "kernels/hotcache/swap_in_config.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {
HotCacheConfig checked(HotCacheConfig c) {
  if (c.max_batch == 0) c.max_batch = c.requests;
  if (c.top_k < 1 || c.top_k > c.hot)
    throw Error("hot cache: top_k",
                fmt::format("top_k {} with a hot buffer of {} slots", c.top_k, c.hot),
                "use 1 <= top_k <= hot (the hot buffer must hold one step's selection)");
  if (c.hot > 32768)
    throw Error("hot cache: hot", fmt::format("hot buffer of {} slots", c.hot),
                "use at most 32768 slots");
  if (c.max_batch < 1 || c.max_batch > kernels::swap_in_config::kMaxBatch)
    throw Error("hot cache: max_batch", fmt::format("max_batch {}", c.max_batch),
                fmt::format("use 1..{} batch rows per call", kernels::swap_in_config::kMaxBatch));
  if (c.backend == Backend::cuda) {
    const auto props = Device::cuda().properties();
    const std::size_t need = kernels::swap_in_shared_bytes(c.top_k, c.hot);
    if (need > props.max_shared_per_block_optin)
      throw Error(
          "hot cache: top_k",
          fmt::format(
              "the swap-in needs {} B of shared memory for top_k {} and hot {}; {} allows {} B",
              need, c.top_k, c.hot, props.name, props.max_shared_per_block_optin),
          "lower top_k (the selection hash takes 8 B x 2 x top_k) or the hot-buffer size");
  }
  return c;
}
}  // namespace

HotCache::HotCache(const HotCacheConfig& config)
    : config_(checked(config)),
      pool_(
          {config_.requests, config_.layers, config_.capacity, config_.row_bytes, config_.padding},
          config_.backend),
      // The residency bitmap only serves the speculative gather.
      hot_({config_.requests, config_.layers, config_.hot, pool_.row_stride(),
            config_.speculative_gather ? config_.capacity : 0},
           config_.backend) {
  HISPARSE_FUNC_RANGE();
  const auto rows = static_cast<std::size_t>(config_.max_batch);
  const auto plan = rows * static_cast<std::size_t>(config_.top_k);
  plan_count_ = Buffer<std::int32_t>::device(rows, config_.backend, "swap-in miss plan");
  plan_slot_ = Buffer<std::int32_t>::device(plan, config_.backend, "swap-in miss plan");
  plan_token_ = Buffer<std::int32_t>::device(plan, config_.backend, "swap-in miss plan");
  plan_fetched_ = Buffer<std::int32_t>::device(rows, config_.backend, "swap-in miss plan");
  plan_ready_ = Buffer<std::int32_t>::device(rows + 1, config_.backend, "swap-in miss plan");
  zero_bytes(plan_ready_.device_data(), plan_ready_.bytes(), config_.backend);
  if (config_.speculative_gather)
    plan_entry_slot_ = Buffer<std::int32_t>::device(plan, config_.backend, "swap-in miss plan");
  stats_ = Buffer<std::int32_t>::pinned(2 * rows, config_.backend, "swap-in statistics");
  std::fill_n(stats_.host_data(), 2 * rows, 0);
#if HISPARSE_WITH_CUDA
  if (config_.backend == Backend::cuda) kernels::configure_swap_in(config_.top_k, config_.hot);
#endif
}

void HotCache::admit(int request, std::int64_t seq_len) {
  HISPARSE_FUNC_RANGE();
  if (seq_len < 0 || seq_len > config_.capacity)
    throw Error(
        "hot cache: admit",
        fmt::format("sequence of {} tokens with a pool capacity of {}", seq_len, config_.capacity),
        "raise the pool capacity to the longest sequence served");
  hot_.reset(request);
  const std::int64_t resident = std::min<std::int64_t>(seq_len, config_.hot);
  const std::size_t stride = pool_.row_stride();
  for (int l = 0; l < config_.layers; ++l) {
    std::uint8_t* rows =
        hot_.layer_rows(l) + static_cast<std::size_t>(hot_.physical_row(request, 0)) * stride;
    if (resident > 0)
      copy_bytes(rows, pool_.row(request, l, 0), static_cast<std::size_t>(resident) * stride,
                 config_.backend);
    if (seq_len > config_.hot)
      copy_bytes(rows + static_cast<std::size_t>(config_.hot) * stride,
                 pool_.row(request, l, seq_len - 1), stride, config_.backend);
  }
}

kernels::SwapInArgs HotCache::kernel_args(int layer, const SwapInStep& step) const {
  if (layer < 0 || layer >= config_.layers)
    throw Error("hot cache: swap_in",
                fmt::format("layer {} is outside 0..{}", layer, config_.layers - 1),
                "pass a layer index below the model's layer count");
  if (step.batch < 0 || step.batch > config_.max_batch)
    throw Error("hot cache: swap_in",
                fmt::format("batch {} exceeds max_batch {}", step.batch, config_.max_batch),
                "raise HotCacheConfig::max_batch");
  if (!step.selected || !step.seq_lens || !step.num_real || !step.physical_rows)
    throw Error("hot cache: swap_in",
                "selected, seq_lens, num_real and physical_rows must all be set",
                "pass the step's device buffers");
  kernels::SwapInArgs a;
  a.selected = step.selected;
  a.seq_lens = step.seq_lens;
  a.seq_lens_int64 = step.seq_lens_int64;
  a.num_real = step.num_real;
  a.request_of_row = step.request_of_row;
  a.hot_buffer = hot_.layer_view(layer);
  a.host_pool = pool_.layer_view(layer);
  a.copy_bytes = pool_.copy_bytes();
  a.physical_rows = step.physical_rows;
  a.stats = step.stats != nullptr ? step.stats : stats_.device_data();
  a.plan = {plan_count_.device_data(),
            plan_slot_.device_data(),
            plan_token_.device_data(),
            config_.fetch_in_resolve ? plan_fetched_.device_data() : nullptr,
            config_.early_handoff ? plan_ready_.device_data() : nullptr,
            config_.speculative_gather ? plan_entry_slot_.device_data() : nullptr};
  a.batch = step.batch;
  a.top_k = config_.top_k;
  a.hot = config_.hot;
  a.resolve = config_.resolve;
  a.max_seq_len = config_.capacity;  // admit() refuses longer sequences
  return a;
}

SwapInStats HotCache::swap_in(int layer, const SwapInStep& step, const Stream& stream,
                              StatsMode stats) {
  HISPARSE_RANGE_PAYLOAD("swap_in", Phase::swap_in, layer);
  const kernels::SwapInArgs args = kernel_args(layer, step);
  if (config_.backend == Backend::cpu) {
    kernels::swap_in_ref(args);
  } else {
#if HISPARSE_WITH_CUDA
    kernels::launch_swap_in(args, stream.native());
#endif
  }
  return stats == StatsMode::read ? last_stats(step.batch, stream) : SwapInStats{};
}

SwapInStats HotCache::last_stats(int batch, const Stream& stream) const {
  stream.synchronize();
  SwapInStats s;
  const std::int32_t* rows = stats_.host_data();
  for (int b = 0; b < batch; ++b) {
    s.hits += rows[2 * b];
    s.misses += rows[2 * b + 1];
  }
  s.bytes = s.misses * static_cast<std::int64_t>(pool_.copy_bytes());
  return s;
}

}  // namespace hisparse
