#include "kernels/fathom/plane_scan.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/fathom/plane_scan_config.hpp"

namespace hisparse::kernels::fathom {

void plane_scores_ref(const PlaneScanArgs& args, std::int32_t s, std::int64_t n, float* out) {
  const int channels = args.layout.channels;
  const std::uint64_t* words = args.words + s * args.layout.words_per_stream();
  const std::uint16_t* scales = args.scales + s * args.layout.scales_per_stream();
  const float* q = args.queries + static_cast<std::int64_t>(s) * args.heads * channels;
  const std::uint8_t* depths = args.depths + static_cast<std::int64_t>(s) * channels;
  float acc[kMaxGroupHeads];
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t block = i / kBlockTokens;
    const int bit = static_cast<int>(i % kBlockTokens);
    for (int h = 0; h < args.heads; ++h) acc[h] = 0.0f;
    for (int j = 0; j < channels; ++j) {
      const int t = depths[j];
      if (t == 0) continue;
      std::uint32_t code = 0;
      for (int p = 0; p < t; ++p)
        code = (code << 1) |
               static_cast<std::uint32_t>((words[args.layout.word_index(block, j, p)] >> bit) & 1u);
      const float v =
          f16_to_float(scales[args.layout.scale_index(block, j)]) * partial_multiplier(code, t);
      for (int h = 0; h < args.heads; ++h)
        acc[h] = fused_multiply_add(q[h * channels + j], v, acc[h]);
    }
    for (int h = 0; h < args.heads; ++h) out[h * n + i] = acc[h];
  }
}

std::int64_t select_from_scores_ref(const float* scores, std::int32_t heads, std::int64_t n,
                                    std::int32_t keep, std::int32_t sinks, std::int32_t recent,
                                    std::int32_t* out) {
  std::vector<std::int32_t> chosen;
  const std::int64_t first_eligible = std::min<std::int64_t>(sinks, n);
  const std::int64_t end_eligible = std::max<std::int64_t>(first_eligible, n - recent);
  for (std::int64_t i = 0; i < first_eligible; ++i) chosen.push_back(static_cast<std::int32_t>(i));
  for (std::int64_t i = end_eligible; i < n; ++i) chosen.push_back(static_cast<std::int32_t>(i));
  std::vector<std::uint64_t> keys;
  for (int h = 0; h < heads; ++h) {
    keys.clear();
    for (std::int64_t i = first_eligible; i < end_eligible; ++i)
      keys.push_back(selection_key(scores[h * n + i], static_cast<std::uint32_t>(i)));
    const std::size_t take = std::min<std::size_t>(keys.size(), static_cast<std::size_t>(keep));
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(take), keys.end(),
                     std::greater<>());
    for (std::size_t r = 0; r < take; ++r)
      chosen.push_back(static_cast<std::int32_t>(selection_key_position(keys[r])));
  }
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  std::copy(chosen.begin(), chosen.end(), out);
  return static_cast<std::int64_t>(chosen.size());
}

void plane_scan_select_ref(const PlaneScanArgs& args) {
  std::vector<float> scores;
  for (std::int32_t s = 0; s < args.streams; ++s) {
    const std::int64_t n = args.lengths[s];
    scores.assign(static_cast<std::size_t>(n) * args.heads, 0.0f);
    plane_scores_ref(args, s, n, scores.data());
    if (args.scores) {
      for (int h = 0; h < args.heads; ++h)
        std::copy_n(
            scores.data() + h * n, n,
            args.scores + (static_cast<std::int64_t>(s) * args.heads + h) * args.max_tokens);
    }
    args.selected_count[s] = static_cast<std::int32_t>(
        select_from_scores_ref(scores.data(), args.heads, n, args.keep, args.sinks, args.recent,
                               args.selected + s * args.max_selected()));
  }
}

PlaneScanWorkspace plan_scan_workspace(const PlaneScanArgs& args, int budget, int multiprocessors) {
  PlaneScanWorkspace ws;
  if (args.heads < 1 || args.heads > kMaxGroupHeads)
    throw Error("fathom scan: heads", fmt::format("{} query heads per KV head", args.heads),
                fmt::format("use 1..{}", kMaxGroupHeads));
  if (args.layout.channels < 1 || args.layout.channels > kMaxChannels)
    throw Error("fathom scan: head_dim", fmt::format("head_dim {}", args.layout.channels),
                fmt::format("use 1..{}", kMaxChannels));
  // Tile: long runs for host planes, one superblock for HBM; fewer blocks for very large budgets.
  int tile = args.layout.kind == PlaneLayoutKind::host ? kScanTileBlocksHost : kScanTileBlocksHbm;
  const std::int64_t units = std::max(1, budget);
  while (tile > 4 && units * tile * 8 > kScanTileBytesMax) tile /= 2;
  if (args.layout.kind == PlaneLayoutKind::hbm) tile = std::min(tile, kSuperblockBlocks);
  ws.tile_blocks = tile;
  ws.budget = budget;
  const std::int64_t tile_bytes =
      units * tile * 8 + static_cast<std::int64_t>(args.layout.channels) * tile * 4;
  const std::int64_t fixed =
      4096 + static_cast<std::int64_t>(args.heads) * args.layout.channels * 4;
  const std::int64_t per_head_min =
      (static_cast<std::int64_t>(args.keep) + 2 * kScanRoundTokens) * 8;
  if (tile_bytes + fixed + args.heads * per_head_min > kScanSharedBudget)
    throw Error(
        "fathom scan: top_k",
        fmt::format("{} query heads x keep {} needs {} KB of shared memory for the fused "
                    "selection, more than {} KB",
                    args.heads, args.keep, (tile_bytes + fixed + args.heads * per_head_min) / 1024,
                    kScanSharedBudget / 1024),
        "lower top_k or the plane budget");
  std::int64_t tiles_max = 1;
  if (args.max_tokens > 0)
    tiles_max = (args.max_tokens + static_cast<std::int64_t>(tile) * kBlockTokens - 1) /
                (static_cast<std::int64_t>(tile) * kBlockTokens);
  const std::int64_t want =
      (static_cast<std::int64_t>(multiprocessors) * kScanBlocksPerSm + args.streams - 1) /
      std::max(1, args.streams);
  // Each chunk hands keep candidates per head to the (serial per stream) final merge: give every
  // chunk at least 4 x keep tokens so that the merge never dominates at short contexts.
  const std::int64_t tile_tokens = static_cast<std::int64_t>(tile) * kBlockTokens;
  const std::int64_t min_tiles = std::max<std::int64_t>(
      1, (4 * static_cast<std::int64_t>(args.keep) + tile_tokens - 1) / tile_tokens);
  ws.chunks = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(want, 1, std::max<std::int64_t>(1, tiles_max / min_tiles)));
  return ws;
}

}  // namespace hisparse::kernels::fathom
