#include "kernels/fathom/plane_scan.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/common/shared_layout.hpp"
#include "kernels/fathom/plane_scan_config.hpp"
#include "kernels/fathom/plane_stage.hpp"

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
      const int t = read_planes(depths[j]);
      if (t == 0) continue;
      std::uint32_t code = 0;
      for (int p = 0; p < t; ++p)
        code = (code << 1) |
               static_cast<std::uint32_t>((words[args.layout.word_index(block, j, p)] >> bit) & 1u);
      const float scale =
          reads_scale(depths[j]) ? f16_to_float(scales[args.layout.scale_index(block, j)]) : 1.0f;
      const float v = scale * partial_multiplier(code, t);
      for (int h = 0; h < args.heads; ++h)
        acc[h] = fused_multiply_add(q[h * channels + j], v, acc[h]);
    }
    for (int h = 0; h < args.heads; ++h) out[h * n + i] = acc[h];
  }
}

void plane_scores_quantized_ref(const PlaneScanArgs& args, std::int32_t s, std::int64_t n,
                                float* out) {
  const int channels = args.layout.channels, heads = args.heads;
  const std::uint64_t* words = args.words + s * args.layout.words_per_stream();
  const std::uint16_t* scales = args.scales + s * args.layout.scales_per_stream();
  const float* q = args.queries + static_cast<std::int64_t>(s) * heads * channels;
  const std::uint8_t* depths = args.depths + static_cast<std::int64_t>(s) * channels;
  std::vector<int> active, planes;
  for (int j = 0; j < channels; ++j)
    if (read_planes(depths[j]) > 0) active.push_back(j), planes.push_back(read_planes(depths[j]));
  const std::size_t na = active.size();
  const std::int64_t nb = (n + kBlockTokens - 1) / kBlockTokens;
  std::vector<int> weights(static_cast<std::size_t>(heads) * na), offset(heads), shift(heads);
  std::vector<int> mult(na);
  std::vector<float> group_max(na);
  std::vector<std::uint32_t> codes(na);
  const auto scale = [&](std::int64_t block, std::size_t k) {  // a sign read's scale is 1
    return reads_scale(depths[active[k]])
               ? f16_to_float(scales[args.layout.scale_index(block, active[k])])
               : 1.0f;
  };
  for (std::int64_t g0 = 0; g0 < nb; g0 += kScaleGroupBlocks) {
    const std::int64_t g1 = std::min<std::int64_t>(nb, g0 + kScaleGroupBlocks);
    for (std::size_t k = 0; k < na; ++k) {
      float m = 0.0f;
      for (std::int64_t b = g0; b < g1; ++b) m = group_scale_max(m, scale(b, k));
      group_max[k] = m;
    }
    for (int h = 0; h < heads; ++h) {
      float max_abs = 0.0f;
      for (std::size_t k = 0; k < na; ++k)
        max_abs = std::max(max_abs, std::fabs(q[h * channels + active[k]] * group_max[k]));
      shift[h] = weight_shift(max_abs);
      for (std::size_t k = 0; k < na; ++k)
        weights[h * na + k] = quantize_weight(q[h * channels + active[k]] * group_max[k], shift[h]);
    }
    for (std::int64_t block = g0; block < g1; ++block) {
      for (std::size_t k = 0; k < na; ++k)
        mult[k] = scale_multiplier(scale(block, k), group_max[k]);
      for (int h = 0; h < heads; ++h) {
        int sum = 0;
        for (std::size_t k = 0; k < na; ++k)
          sum += weights[h * na + k] * mult[k] * code_offset(planes[k]);
        offset[h] = sum;
      }
      const std::int64_t b0 = block * kBlockTokens;
      const std::int64_t end = std::min<std::int64_t>(n, b0 + kBlockTokens);
      for (std::int64_t i = b0; i < end; ++i) {
        const int bit = static_cast<int>(i - b0);
        for (std::size_t k = 0; k < na; ++k) {
          std::uint32_t code = 0;
          for (int p = 0; p < kPlanes; ++p)
            code =
                (code << 1) | static_cast<std::uint32_t>(
                                  (words[args.layout.word_index(block, active[k], p)] >> bit) & 1u);
          codes[k] = masked_code(code, planes[k]) * static_cast<std::uint32_t>(mult[k]);
        }
        for (int h = 0; h < heads; ++h) {
          int dot = 0;
          for (std::size_t k = 0; k < na; ++k)
            dot += weights[h * na + k] * static_cast<int>(codes[k]);
          out[h * n + i] = quantized_score(2 * dot + offset[h], shift[h]);
        }
      }
    }
  }
}

namespace {
// The selection keys of one head's eligible tokens (row: that head's scores).
void eligible_keys(const float* row, EligibleWindow window, std::vector<std::uint64_t>& keys) {
  keys.clear();
  for (std::int64_t i = window.first; i < window.end; ++i)
    keys.push_back(selection_key(row[i], static_cast<std::uint32_t>(i)));
}
}  // namespace

std::int64_t select_from_scores_ref(const float* scores, std::int32_t heads, std::int64_t n,
                                    std::int32_t keep, std::int32_t sinks, std::int32_t recent,
                                    std::int32_t* out) {
  std::vector<std::int32_t> chosen;
  const EligibleWindow window = eligible_window(n, sinks, recent);
  for (std::int64_t i = 0; i < window.first; ++i) chosen.push_back(static_cast<std::int32_t>(i));
  for (std::int64_t i = window.end; i < n; ++i) chosen.push_back(static_cast<std::int32_t>(i));
  std::vector<std::uint64_t> keys;
  for (int h = 0; h < heads; ++h) {
    eligible_keys(scores + h * n, window, keys);
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

void score_range_ref(const float* scores, std::int32_t heads, std::int64_t n, std::int32_t keep,
                     std::int32_t sinks, std::int32_t recent, float* out) {
  const EligibleWindow window = eligible_window(n, sinks, recent);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint64_t> keys;
  for (int h = 0; h < heads; ++h) {
    eligible_keys(scores + h * n, window, keys);
    out[2 * h] = out[2 * h + 1] = nan;
    if (keys.empty()) continue;
    out[2 * h + 1] =
        key_to_float(static_cast<std::uint32_t>(*std::max_element(keys.begin(), keys.end()) >> 32));
    if (keep < 1 || keys.size() < static_cast<std::size_t>(keep)) continue;
    std::nth_element(keys.begin(), keys.begin() + (keep - 1), keys.end(), std::greater<>());
    out[2 * h] = key_to_float(static_cast<std::uint32_t>(keys[keep - 1] >> 32));
  }
}

void plane_scan_select_ref(const PlaneScanArgs& planned_args) {
  // Fused plan: the depths the scan blocks compute, from the planner's twin.
  std::vector<std::uint8_t> planned;
  PlaneScanArgs args = planned_args;
  if (args.plan_variances != nullptr) {
    planned.resize(static_cast<std::size_t>(args.streams) * args.layout.channels);
    depth_plan_bisection_ref(args.plan_args(planned.data()));
    if (args.planned_depths) std::copy(planned.begin(), planned.end(), args.planned_depths);
    args.depths = planned.data();
    args.plan_variances = nullptr;
  }
  std::vector<float> scores;
  for (std::int32_t s = 0; s < args.streams; ++s) {
    const std::int64_t n = args.lengths[s];
    scores.assign(static_cast<std::size_t>(n) * args.heads, 0.0f);
    plane_scores_quantized_ref(args, s, n, scores.data());
    if (args.scores) {
      for (int h = 0; h < args.heads; ++h)
        std::copy_n(
            scores.data() + h * n, n,
            args.scores + (static_cast<std::int64_t>(s) * args.heads + h) * args.max_tokens);
    }
    if (args.score_range)
      score_range_ref(scores.data(), args.heads, n, args.keep, args.sinks, args.recent,
                      args.score_range + static_cast<std::int64_t>(s) * args.heads * 2);
    args.selected_count[s] = static_cast<std::int32_t>(
        select_from_scores_ref(scores.data(), args.heads, n, args.keep, args.sinks, args.recent,
                               args.selected + s * args.max_selected()));
  }
}

void check_scan_variant(int variant, const char* where) {
  if (variant < 0 || variant >= kScanVariantCount)
    throw Error(
        where, fmt::format("scan variant {} does not exist", variant),
        fmt::format("use 0..{} (kScanVariants in plane_scan_config.hpp)", kScanVariantCount - 1));
}

ScanSharedPlan plan_scan_shared(const PlaneScanArgs& args, int budget, int tile_blocks, int variant,
                                bool staged) {
  check_scan_variant(variant, "fathom scan: variant");
  const ScanVariant& v = kScanVariants[variant];
  const std::int64_t round_tokens = scan_round_tokens(v.threads);
  ScanSharedPlan m;
  m.threads = v.threads;
  const int d = args.layout.channels;
  m.units_cap = std::clamp(budget, 1, kPlanes * d);
  m.slots_pad = (std::min(d, m.units_cap) + 15) / 16 * 16;
  m.heads_pad = (args.heads + 1) / 2 * 2;
  m.tile_blocks = tile_blocks;
  SharedLayout layout;
  const auto take = [&](std::int64_t bytes) { return layout.take(bytes); };
  const std::int64_t tb = tile_blocks, hp = m.heads_pad, sp = m.slots_pad;
  m.record = ScanRecordLayout{m.slots_pad, m.heads_pad};
  // One row past the units: zeros, read by the planes past a slot's depth
  // (mma::plane_row_offsets).
  m.words_stage = align16((m.units_cap + 1) * tb * 8);
  m.scales_stage = align16(std::max(sp * tb * 2, tb / kScaleGroupBlocks * m.record.bytes()));
  // After the prep the kernel keeps a scale group's blocks' constant terms (16 x heads_pad ints)
  // in the group's part of a stage's scales (16 x slots_pad x 2 bytes): slots_pad >= 16 >= 2 x
  // heads_pad.
  static_assert(2 * kMaxGroupHeads <= 16);
  m.words = take(2 * m.words_stage);
  m.scales = take(2 * m.scales_stage);
  m.queries = take(hp * sp * 4);
  // Slot lists sized for every channel: the kernel orders the slots before it can tell that a
  // plan exceeds the budget it was launched for.
  const std::int64_t slots_all = (static_cast<std::int64_t>(d) + 15) / 16 * 16;
  m.slot_channel = take(slots_all * 4);
  m.slot_info = take(slots_all * 4);
  m.plane_rows = take(sp * 4 * kPlanes);
  m.magnitudes = take(sp);
  m.unit_code = take(static_cast<std::int64_t>(m.units_cap) * 4);  // over budget: not written
  if (tile_blocks < kScaleGroupBlocks || tile_blocks % kScaleGroupBlocks != 0)
    throw Error(
        "fathom scan: workspace", fmt::format("tile of {} blocks", tile_blocks),
        fmt::format("use a multiple of {} blocks (plan_scan_workspace)", kScaleGroupBlocks));
  m.groups = tile_blocks / kScaleGroupBlocks;
  const std::int64_t groups = m.groups;
  if (staged) {  // the tile loop's prep; the other paths stage scoring records instead
    m.weights = take(groups * hp * sp);
    m.multipliers = take(tb * sp);
    m.group_max = take(groups * sp * 4);
    m.shifts = take(groups * hp * 4);
  }
  m.counts = take(kMaxGroupHeads * 4);
  m.thr = take(kMaxGroupHeads * 8);
  m.hist = take(256 * 4);
  m.scratch = take(64 * 8);
  // Candidate buffers: keep + slack entries per head; a round appends at most one round of
  // tokens, and the slack (2 to 8 rounds) sets how often a buffer is compacted.
  const auto slack_within = [&](std::int64_t bytes) {
    const std::int64_t per_head = (bytes - layout.size()) / (8 * std::max(1, args.heads));
    return std::min<std::int64_t>(per_head - args.keep,
                                  static_cast<std::int64_t>(kScanSlackRoundsMax) * round_tokens);
  };
  const std::int64_t slack_min = static_cast<std::int64_t>(v.slack_rounds_min) * round_tokens;
  std::int64_t slack = slack_within(v.shared_target);
  if (slack < slack_min && slack_within(kScanSharedBudget) >= slack_min) slack = slack_min;
  if (slack < slack_min)
    throw Error("fathom scan: top_k",
                fmt::format("{} query heads x keep {} need {} KB of shared memory for the fused "
                            "selection at plane budget {}, more than {} KB",
                            args.heads, args.keep,
                            (layout.size() +
                             8 * static_cast<std::int64_t>(args.heads) * (args.keep + slack_min)) /
                                1024,
                            budget, kScanSharedBudget / 1024),
                "lower top_k or the plane budget");
  m.cap = static_cast<int>(args.keep + slack);
  // The prologue's scratch records (a record and slots_pad floats per warp) live in the candidate
  // buffers before the first candidate; one warp's must fit.
  const std::int64_t scratch = m.record.bytes() + 4 * sp;
  const std::int64_t heads_at_least_one = std::max(1, args.heads);
  m.cap = static_cast<int>(std::max<std::int64_t>(
      m.cap, (scratch + 8 * heads_at_least_one - 1) / (8 * heads_at_least_one)));
  m.buf = take(static_cast<std::int64_t>(args.heads) * m.cap * 8);
  m.total = layout.size();
  return m;
}

namespace {

// Greedy list schedule of a scan grid on the resident block slots (`ends`: one end time per
// slot, the caller's buffer), blocks started in linear order as slots free up: when the last
// block ends. Block (c, s) takes (ceil(tiles / chunks_of(s)) + kChunkStartTiles) x work(s), or
// nothing when c >= chunks_of(s) (an empty slot).
template <typename ChunksOf, typename WorkOf>
double schedule_makespan(std::int64_t streams, std::int64_t tiles, std::vector<double>& ends,
                         ChunksOf chunks_of, WorkOf work_of) {
  std::fill(ends.begin(), ends.end(), 0.0);  // a heap already
  double last = 0;
  for (std::int64_t s = 0; s < streams; ++s) {
    const std::int64_t c_s = chunks_of(s);
    const double block =
        static_cast<double>((tiles + c_s - 1) / c_s + kChunkStartTiles) * work_of(s);
    for (std::int64_t c = 0; c < c_s; ++c) {  // empty slots free at once: not modelled
      std::pop_heap(ends.begin(), ends.end(), std::greater<>());
      ends.back() += block;
      last = std::max(last, ends.back());
      std::push_heap(ends.begin(), ends.end(), std::greater<>());
    }
  }
  return last;
}

// Work-sized chunks for unequal per-KV-head budgets: the heaviest stream takes `c` chunks and
// every other stream chunks in proportion to its work, with no more blocks in all than the
// uniform plan's (its wave rule stands; the blocks are only shared out by work). The count of
// the heaviest is the one with the shortest modelled schedule, which must beat the uniform
// plan's by 5%; otherwise the workspace stays uniform.
void plan_work_sized_chunks(PlaneScanWorkspace& ws, std::span<const std::int32_t> head_budgets,
                            std::int64_t streams, std::int64_t tiles, std::int64_t resident,
                            std::int64_t max_chunks) {
  const auto period = static_cast<std::int64_t>(head_budgets.size());
  if (period < 1 || period > kMaxChunkPeriod) return;
  if (std::all_of(head_budgets.begin(), head_budgets.end(),
                  [&](std::int32_t b) { return b == head_budgets.front(); }))
    return;
  const auto work = [&](std::int64_t s) {
    return static_cast<double>(head_budgets[static_cast<std::size_t>(s % period)] + kChunkWorkBits);
  };
  double heaviest = 0;
  for (std::int64_t s = 0; s < streams; ++s) heaviest = std::max(heaviest, work(s));
  const auto share = [&](std::int64_t c, std::int64_t s) {
    return std::clamp<std::int64_t>(std::llround(static_cast<double>(c) * work(s) / heaviest), 1,
                                    c);
  };
  const std::int64_t blocks = streams * ws.chunks;
  std::vector<double> ends(static_cast<std::size_t>(std::max<std::int64_t>(1, resident)));
  double best = schedule_makespan(
      streams, tiles, ends, [&](std::int64_t) { return std::int64_t{ws.chunks}; }, work);
  const double uniform = best;
  std::int64_t best_c = 0;
  for (std::int64_t c = ws.chunks + 1; c <= max_chunks; ++c) {
    std::int64_t total = 0;
    for (std::int64_t s = 0; s < streams; ++s) total += share(c, s);
    if (total > blocks) break;  // shares only grow with c
    const double span = schedule_makespan(
        streams, tiles, ends, [&](std::int64_t s) { return share(c, s); }, work);
    if (span < best) {
      best = span;
      best_c = c;
    }
  }
  if (best_c == 0 || best > 0.95 * uniform) return;
  ws.chunks = static_cast<std::int32_t>(best_c);
  ws.chunk_period = static_cast<std::int32_t>(period);
  for (std::int64_t p = 0; p < period; ++p)
    ws.period_chunks[p] = static_cast<std::int32_t>(share(best_c, p));
}

}  // namespace

PlaneScanWorkspace plan_scan_workspace(const PlaneScanArgs& args, int budget, int multiprocessors,
                                       int variant, HostStaging host_staging,
                                       std::span<const std::int32_t> head_budgets) {
  check_scan_variant(variant, "fathom scan: variant");
  const ScanVariant& v = kScanVariants[variant];
  PlaneScanWorkspace ws;
  ws.variant = variant;
  if (args.heads < 1 || args.heads > kMaxGroupHeads)
    throw Error("fathom scan: heads", fmt::format("{} query heads per KV head", args.heads),
                fmt::format("use 1..{}", kMaxGroupHeads));
  if (args.layout.channels < 1 || args.layout.channels > kMaxChannels)
    throw Error("fathom scan: head_dim", fmt::format("head_dim {}", args.layout.channels),
                fmt::format("use 1..{}", kMaxChannels));
  // Tile: long runs for host planes read in place, one superblock for HBM (and for staged host
  // planes, which the scan reads from HBM); fewer blocks for large budgets.
  const bool staged = host_staging.enabled && args.layout.kind == PlaneLayoutKind::host &&
                      variant == kStagedVariant;
  for (const std::int32_t b : head_budgets)
    if (b < 0 || b > budget)
      throw Error("fathom scan: head budgets",
                  fmt::format("a KV head's budget of {} for a launch sized for {}", b, budget),
                  "size the launch for the largest head budget");
  if (host_staging.copy_blocks < 0 || host_staging.rounds_per_copy < 0)
    throw Error("fathom scan: staging",
                fmt::format("{} copy blocks, {} rounds per copy", host_staging.copy_blocks,
                            host_staging.rounds_per_copy),
                "use 0 (the default) or a positive count");
  // Staged host planes keep one scale group per tile: longer tiles make fewer, longer staging
  // rounds, and the first lands later (H200, B48: 1516 against 1396 us at 1M batch 1).
  const bool host_direct = args.layout.kind == PlaneLayoutKind::host && !staged;
  int tile = host_direct ? v.tile_blocks_host : staged ? kScanTileBlocksMin : v.tile_blocks_hbm;
  const std::int64_t units = std::clamp(budget, 1, kPlanes * args.layout.channels);
  while (tile > kScanTileBlocksMin && units * tile * 8 > kScanTileBytesMax) tile /= 2;
  // Longer HBM tiles only while the block stays within the variant's shared-memory target: a
  // plan above it halves the resident blocks (B128 at 32-block tiles: 1331 against 558 us at
  // 128K batch 8), while at B48 they pay (371 against 405 us: half the barriers per block).
  const auto within_target = [&](int t) {
    try {
      return plan_scan_shared(args, budget, t, variant, staged).total <= v.shared_target;
    } catch (const Error&) {  // the shortest tile decides (and names) what does not fit
      return false;
    }
  };
  while (!host_direct && tile > kScanTileBlocksMin && !within_target(tile)) tile /= 2;
  ws.tile_blocks = tile;
  ws.budget = budget;
  // Throws when the selection does not fit; a plan above the variant's target (large top_k)
  // holds fewer blocks per SM than the variant was compiled for.
  const std::int64_t shared = plan_scan_shared(args, budget, tile, variant, staged).total;
  const auto blocks_per_sm = std::max<std::int64_t>(
      1, std::min<std::int64_t>(scan_blocks_per_sm(v, args.heads),
                                kSharedPerSm / (shared + kSharedReservedPerBlock)));
  std::int64_t tiles_max = 1;
  if (args.max_tokens > 0)
    tiles_max = (args.max_tokens + static_cast<std::int64_t>(tile) * kBlockTokens - 1) /
                (static_cast<std::int64_t>(tile) * kBlockTokens);
  // Each chunk hands keep candidates per head to the (serial per stream) final merge: give every
  // chunk at least 4 x keep tokens so that the merge never dominates at short contexts.
  const std::int64_t tile_tokens = static_cast<std::int64_t>(tile) * kBlockTokens;
  const std::int64_t min_tiles = std::max<std::int64_t>(
      1, (4 * static_cast<std::int64_t>(args.keep) + tile_tokens - 1) / tile_tokens);
  const std::int64_t max_chunks = std::max<std::int64_t>(1, tiles_max / min_tiles);
  // Chunks per stream: fill whole waves of resident scan blocks (a last wave that is mostly
  // empty nearly doubles the time); among equally good counts take the fewest.
  const std::int64_t streams = std::max(1, args.streams);
  // A staging copy block is a scan block with the copy role: it takes one scan block's place.
  // Its streams' tables must fit the scan block's shared memory. With more copy blocks than
  // streams, each stream gets the same number (its parts).
  int copy_blocks = 0, parts = 1;
  if (staged) {
    const int s32 = static_cast<int>(streams);
    copy_blocks = host_staging.copy_blocks > 0 ? host_staging.copy_blocks : stage_copy_blocks(s32);
    const auto fit = std::max<std::int64_t>(1, shared / stage_table_bytes(args.layout.channels));
    copy_blocks = std::max(copy_blocks, static_cast<int>((streams + fit - 1) / fit));
    if (copy_blocks >= s32) {
      parts = copy_blocks / s32;
      copy_blocks = parts * s32;
    }
  }
  const double resident = std::max(
      1.0, static_cast<double>(std::max(1, multiprocessors)) * static_cast<double>(blocks_per_sm) -
               copy_blocks);
  const std::int64_t fill =
      (static_cast<std::int64_t>(resident) + streams - 1) / streams;  // chunks for one wave
  std::int64_t best = 1;
  double best_use = -1;
  // At most two waves: every chunk adds keep candidates per head to the per-stream merge.
  for (std::int64_t c = 1; c <= std::min(max_chunks, 2 * fill); ++c) {
    const double waves = static_cast<double>(streams * c) / resident;
    const double use = waves / std::ceil(waves) * std::min(1.0, waves);
    if (use > best_use + 0.05) {
      best = c;
      best_use = use;
    }
  }
  ws.chunks = static_cast<std::int32_t>(best);
  if (!staged) {
    plan_work_sized_chunks(ws, head_budgets, streams, tiles_max,
                           static_cast<std::int64_t>(resident), max_chunks);
    ws.record_bytes = plan_scan_shared(args, budget, tile, variant, false).record.bytes();
    ws.records_per_stream = tiles_max * (tile / kScaleGroupBlocks);
    ws.rescan_sub_tokens = kRescanSubChunkTokens;
  } else {
    PlaneStaging& st = ws.staging;
    st.units_cap = static_cast<std::int32_t>(units);
    st.slots_cap = std::min(st.units_cap, args.layout.channels);
    st.blocks_cap = tiles_max * tile;
    st.rounds = static_cast<std::int32_t>((tiles_max + best - 1) / best);
    st.copy_blocks = copy_blocks;
    st.parts = parts;
    st.rounds_per_copy = host_staging.rounds_per_copy > 0
                             ? host_staging.rounds_per_copy
                             : stage_rounds_per_copy(streams, units, best * tile, st.rounds);
    st.copy_clock = host_staging.copy_clock;
  }
  return ws;
}

}  // namespace hisparse::kernels::fathom
