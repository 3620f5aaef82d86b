// PlaneScan + selection: approximate scores from the first t_j planes of every channel (midpoint
// reconstruction, weights quantized to 8 bits per 16-block scale group and head and block scales
// to multipliers 0..16 of the group's largest, so that the CUDA kernel can sum on integer tensor
// cores; see fathom_math.hpp), then per query head the top `keep` tokens outside the sinks and
// the recent window, unioned over the GQA group with the sinks and the recent tokens,
// deduplicated and sorted. The CUDA version fuses the scan with a per-block streaming top-k (no
// score is written to memory unless `scores` is given) and reads host-offloaded planes straight
// from mapped pinned memory in runs of tile_blocks x 8 bytes per active (channel, plane), without
// host synchronisation.
#pragma once

#include <cstdint>
#include <span>

#include "core/stream.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::kernels::fathom {

struct PlaneScanArgs {
  const std::uint64_t* words = nullptr;   ///< planes of every stream (PlaneLayout)
  const std::uint16_t* scales = nullptr;  ///< fp16 scales of every stream
  PlaneLayout layout;
  const std::int64_t* lengths = nullptr;  ///< [streams] tokens of each stream
  const float* queries = nullptr;         ///< [streams][heads][channels]
  const std::uint8_t* depths = nullptr;   ///< [streams][channels], 0..4 (unless planned below)
  /// Fused DepthPlanner: when set, every scan block plans its own stream from `queries` and these
  /// [plan_variance_period][channels] calibration variances at `plan_budget` (the arithmetic of
  /// launch_depth_plan, bit for bit) and `depths` is not read. The depths go to `planned_depths`
  /// ([streams][channels]) when it is set. Saves the planner's launch in the decode step.
  const float* plan_variances = nullptr;
  std::int32_t plan_variance_period = 1;
  std::int32_t plan_budget = 0;
  /// [plan_variance_period], optional: a budget per KV head, each 0..plan_budget
  /// (DepthPlanArgs::budgets).
  const std::int32_t* plan_budgets = nullptr;
  std::uint8_t* planned_depths = nullptr;
  std::int32_t streams = 0;
  std::int32_t heads = 0;  ///< query heads per KV head (<= kMaxGroupHeads)
  std::int32_t keep = 0;   ///< top tokens per query head (k - sinks - recent)
  std::int32_t sinks = 4;
  std::int32_t recent = 32;
  std::int64_t max_tokens = 0;             ///< >= every length; row stride of `scores`
  std::int32_t* selected = nullptr;        ///< [streams][max_selected()], ascending positions
  std::int32_t* selected_count = nullptr;  ///< [streams]
  float* scores = nullptr;  ///< optional [streams][heads][max_tokens]: every approximate score
  /// Seeded selection (optional; HBM planes and host planes read in place, ignored when host
  /// planes are staged): [streams][heads][2], each head's (keep-th, top) selected scores of an
  /// earlier step, as score_range writes them. The scan adds no token scoring below
  /// seed_score(keep-th, top, seed_margin) to its candidates, counts per head how many reached
  /// it, and rescans without the seed every stream where some head had fewer than
  /// min(keep, eligible tokens): the selection is the unseeded one whatever the seeds. NaN
  /// entries seed nothing. May be the same buffer as score_range.
  const float* seed_range = nullptr;
  float seed_margin = 0.5f;
  /// Optional output [streams][heads][2]: each head's keep-th and top selected scores (the
  /// keep-th is NaN where fewer than `keep` tokens are eligible, both NaN where none is).
  float* score_range = nullptr;

  /// The planner arguments of the fused plan (plan_variances set).
  [[nodiscard]] HISPARSE_HD DepthPlanArgs plan_args(std::uint8_t* out) const {
    DepthPlanArgs p;
    p.queries = queries;
    p.variances = plan_variances;
    p.variance_period = plan_variance_period;
    p.streams = streams;
    p.heads = heads;
    p.channels = layout.channels;
    p.budget = plan_budget;
    p.budgets = plan_budgets;
    p.depths = out;
    return p;
  }
  [[nodiscard]] HISPARSE_HD std::int64_t max_selected() const {
    return static_cast<std::int64_t>(sinks) + recent + static_cast<std::int64_t>(heads) * keep;
  }
};

/// Host-plane staging (host layout, scan variant kStagedVariant): copy blocks move the step's
/// active plane runs and scales from pinned host memory into this HBM area, round after round,
/// while the scan waits per round on `landed` and reads HBM. The copy blocks are the scan
/// kernel's own first blocks to start (a ticket gives each block its role), so both run at once
/// and the copy is resident before any scan block waits for it; a separate copy kernel with
/// programmatic dependent launch was measured to run before the scan, not beside it. Round r
/// holds tiles [r * chunks, (r + 1) * chunks) of every stream and scan chunk c takes tiles c,
/// c + chunks, ..., so every round feeds every scan block. The copy reads one run per active
/// (channel, plane) and round with many loads in flight, and the scan never waits on PCIe
/// latency. Disabled (the scan reads mapped host memory itself) when `words` is null.
struct PlaneStaging {
  std::uint64_t* words = nullptr;   ///< [streams][units_cap][blocks_cap], by plane-unit ordinal
  std::uint16_t* scales = nullptr;  ///< [streams][slots_cap][blocks_cap], by channel slot
  std::int32_t* landed = nullptr;   ///< [streams][rounds]: copy blocks done with the round
  std::int32_t* ticket = nullptr;   ///< one int after `landed`: the scan blocks' role counter
  std::int32_t units_cap = 0;       ///< plane units per stream (the budget)
  std::int32_t slots_cap = 0;       ///< channel slots per stream
  std::int64_t blocks_cap = 0;      ///< quantization blocks per unit (whole tiles)
  std::int32_t rounds = 0;          ///< tiles_max / chunks, rounded up
  std::int32_t copy_blocks = 0;     ///< scan blocks that take the copy role
  /// Copy blocks per stream (each takes one contiguous share of a round's pieces); landed
  /// counts them, and a round is in HBM once its flag reaches `parts`.
  std::int32_t parts = 1;
  /// Scan rounds one copy step moves together (longer host runs, a later first round).
  std::int32_t rounds_per_copy = 1;
  /// Diagnostic (null: off): [0] the first copy block's start and [1] the last one's end
  /// (globaltimer ns, by atomicMin / atomicMax), so [1] - [0] is the span of the step's transfer.
  /// The caller sets [0] to all ones and [1] to 0 before each call.
  unsigned long long* copy_clock = nullptr;
  [[nodiscard]] HISPARSE_HD bool enabled() const { return words != nullptr; }
  [[nodiscard]] std::int64_t word_count(std::int32_t streams) const {
    return static_cast<std::int64_t>(streams) * units_cap * blocks_cap;
  }
  [[nodiscard]] std::int64_t scale_count(std::int32_t streams) const {
    return static_cast<std::int64_t>(streams) * slots_cap * blocks_cap;
  }
  [[nodiscard]] std::int64_t flag_count(std::int32_t streams) const {
    return static_cast<std::int64_t>(streams) * rounds;
  }
};

/// What plan_scan_workspace is asked to size for host-layout planes (ignored for HBM planes).
struct HostStaging {
  bool enabled = false;
  int copy_blocks = 0;      ///< 0: stage_copy_blocks(streams) (plane_scan_config.hpp)
  int rounds_per_copy = 0;  ///< 0: stage_rounds_per_copy (plane_scan_config.hpp)
  unsigned long long* copy_clock = nullptr;  ///< PlaneStaging::copy_clock (diagnostic)
};

/// Longest period of per-KV-head budgets that work-sized chunks follow (PlaneScanWorkspace).
inline constexpr int kMaxChunkPeriod = 16;

/// Device workspace of the fused kernels (sized by plane_scan_workspace, owned by lib/).
struct PlaneScanWorkspace {
  std::int32_t chunks = 1;  ///< chunk slots per stream (the grid's x extent)
  /// Work-sized chunks (per-KV-head budgets, planes not staged): stream s scans its tiles in
  /// period_chunks[s % chunk_period] chunks (1..chunks), so that a stream with a larger budget
  /// takes more, shorter chunks and every block of the wave ends at about the same time; its
  /// other chunk slots stay empty (count 0). chunk_period 0: every stream takes `chunks`.
  std::int32_t chunk_period = 0;
  std::int32_t period_chunks[kMaxChunkPeriod] = {};
  std::int32_t tile_blocks = 16;             ///< quantization blocks per tile
  std::int32_t variant = 0;                  ///< index into kScanVariants (plane_scan_config.hpp)
  std::int32_t budget = 0;                   ///< largest sum of depths of any stream
  std::uint64_t* candidates = nullptr;       ///< [streams][heads][chunks][keep]
  std::int32_t* candidate_counts = nullptr;  ///< [streams][heads][chunks]
  /// Seeded selection: [streams][heads] candidates that reached the seed, summed over chunks;
  /// zero before a launch (the owner zeroes it once; finalize re-zeroes it).
  std::int32_t* seed_hits = nullptr;
  /// Seeded selection: the lists of the launcher's second scan pass, shaped like candidates /
  /// candidate_counts. That pass runs only the streams whose seed was not proven, spread over
  /// the grid (rescan_blocks, rescan_share), and grid block (x, y) writes its lists at entries
  /// (y, head, x). The head merge reads them for those streams, the first pass's for the others.
  std::uint64_t* rescan_candidates = nullptr;
  std::int32_t* rescan_counts = nullptr;
  /// Tokens per rescan sub-chunk of the longest stream (rescan_blocks; 0: the whole grid).
  std::int64_t rescan_sub_tokens = 0;
  /// Scoring records (planes not staged): [streams][records_per_stream] records of
  /// record_bytes (ScanRecordLayout), one per scale group of 16 blocks. Each scan block writes
  /// the records of its own chunk before its tile loop, one warp per group with no block
  /// barrier, then streams them with the planes; a rescan pass reuses them. Staged host planes
  /// arrive round by round and keep the prep inside the tile loop.
  std::uint8_t* records = nullptr;
  std::int32_t record_bytes = 0;
  std::int64_t records_per_stream = 0;
  /// Shape of the host staging when plan_scan_workspace was asked for it (pointers are the
  /// owner's to set; left null, the scan reads host planes directly).
  PlaneStaging staging;
  /// Chunks stream `s` is scanned in.
  [[nodiscard]] HISPARSE_HD std::int32_t chunks_of(std::int32_t s) const {
    return chunk_period > 0 ? period_chunks[s % chunk_period] : chunks;
  }
  [[nodiscard]] std::int64_t candidate_words(const PlaneScanArgs& a) const {
    return static_cast<std::int64_t>(a.streams) * a.heads * chunks * a.keep;
  }
  [[nodiscard]] std::int64_t count_entries(const PlaneScanArgs& a) const {
    return static_cast<std::int64_t>(a.streams) * a.heads * chunks;
  }
  [[nodiscard]] std::int64_t record_bytes_total(const PlaneScanArgs& a) const {
    return static_cast<std::int64_t>(a.streams) * records_per_stream * record_bytes;
  }
};

/// Seeded selection: whether every head of stream `s` has at least min(keep, eligible tokens)
/// candidates that reached its seed (`seed_hits` [streams][heads], summed over the chunks). Then
/// the seed was at or below the head's true keep-th score and the seeded lists are exact.
HISPARSE_HD bool seed_proven(const PlaneScanArgs& a, const std::int32_t* seed_hits,
                             std::int32_t s) {
  const std::int64_t eligible = eligible_window(a.lengths[s], a.sinks, a.recent).size();
  const std::int64_t need = eligible < a.keep ? eligible : a.keep;
  for (std::int32_t h = 0; h < a.heads; ++h)
    if (seed_hits[static_cast<std::int64_t>(s) * a.heads + h] < need) return false;
  return true;
}

/// The rescan pass spreads the `unproven` streams (in stream order: ranks) over all `blocks`
/// blocks of the grid, so that a wrong seed costs a share of one pass rather than a pass of the
/// stream's own few chunks: grid block b (y x chunks + x) scans sub-chunk b / unproven of the
/// stream of rank b % unproven, which has `subs` sub-chunks in all.
struct RescanShare {
  std::int32_t rank = 0, sub = 0, subs = 1;
};
HISPARSE_HD RescanShare rescan_share(std::int32_t block, std::int32_t blocks,
                                     std::int32_t unproven) {
  const std::int32_t rank = block % unproven;
  return {rank, block / unproven, (blocks - 1 - rank) / unproven + 1};
}
/// Blocks of a rescan grid of `grid_blocks` that take part: every one, or with `sub_tokens` > 0
/// at most as many sub-chunks per unproven stream as sub-chunks of `sub_tokens` tokens cover
/// the longest stream (each sub-chunk's list of up to `keep` candidates costs the head merge
/// what the extra block saves the scan).
HISPARSE_HD std::int32_t rescan_blocks(std::int32_t grid_blocks, std::int32_t unproven,
                                       std::int64_t max_tokens, std::int64_t sub_tokens) {
  if (sub_tokens <= 0) return grid_blocks;
  const std::int64_t subs =
      max_tokens > sub_tokens ? (max_tokens + sub_tokens - 1) / sub_tokens : 1;
  const std::int64_t wanted = subs * unproven;
  return wanted < grid_blocks ? static_cast<std::int32_t>(wanted) : grid_blocks;
}
/// The grid block that scans sub-chunk `sub` of the unproven stream of rank `rank`.
HISPARSE_HD std::int32_t rescan_block(std::int32_t rank, std::int32_t sub, std::int32_t unproven) {
  return rank + sub * unproven;
}

/// Byte offsets inside one scale group's scoring record: the block multipliers [16][slots_pad]
/// (u8), the 8-bit weights [heads_pad][slots_pad] (mma::weight_index), minus each block's
/// constant term [16][heads_pad] (int) and the weight shifts [heads_pad] (int), 16-byte aligned.
/// The tile loop reads a group's parameters from this layout in both paths: the staged path's
/// prep writes it into shared memory, the others stage records written by the block itself.
struct ScanRecordLayout {
  int slots_pad = 0, heads_pad = 0;
  [[nodiscard]] HISPARSE_HD int multipliers() const { return 0; }
  [[nodiscard]] HISPARSE_HD int weights() const { return kScaleGroupBlocks * slots_pad; }
  [[nodiscard]] HISPARSE_HD int terms() const { return weights() + heads_pad * slots_pad; }
  [[nodiscard]] HISPARSE_HD int shifts() const {
    return terms() + kScaleGroupBlocks * heads_pad * 4;
  }
  [[nodiscard]] HISPARSE_HD int bytes() const { return (shifts() + heads_pad * 4 + 15) / 16 * 16; }
};

/// Shared-memory plan of one scan block (byte offsets), the same on host and device.
struct ScanSharedPlan {
  int units_cap = 0;  ///< plane units one tile holds (the budget)
  int slots_pad = 0;  ///< channel slots, a multiple of 16
  int heads_pad = 0;  ///< heads rounded up to even (head pairs of the MMA)
  int cap = 0;        ///< candidate buffer entries per head
  int tile_blocks = 0;
  int threads = 0;  ///< threads per scan block (the variant's)
  int groups = 0;   ///< scale groups per tile (tile_blocks / kScaleGroupBlocks)
  /// weights, multipliers, group_max and shifts: staged host planes only (0 otherwise).
  std::int64_t queries = 0, slot_channel = 0, slot_info = 0, plane_rows = 0, magnitudes = 0,
               unit_code = 0, words = 0, scales = 0, weights = 0, multipliers = 0, group_max = 0,
               shifts = 0, counts = 0, thr = 0, hist = 0, scratch = 0, buf = 0, total = 0;
  /// Bytes of one pipeline stage; a words stage ends with a row of zeros (row units_cap).
  std::int64_t words_stage = 0, scales_stage = 0;
  /// One scale group's scoring record. A stage's `scales` hold the tile's scales (staged host
  /// planes) or its groups' records (the other paths).
  ScanRecordLayout record;
};
/// Throws Error (naming top_k and the budget) when it exceeds the scan's shared-memory budget.
/// `variant` indexes kScanVariants (threads per block, shared-memory target, slack). `staged`
/// (staged host planes) also reserves the tile prep's multipliers, weights, group maxima and
/// shifts; the other paths read them from the staged scoring records, and their candidate
/// buffers take that room.
[[nodiscard]] ScanSharedPlan plan_scan_shared(const PlaneScanArgs& args, int budget,
                                              int tile_blocks, int variant = 0,
                                              bool staged = false);

/// Chooses chunks and tile size for a launch on a GPU with `multiprocessors` SMs; `budget` is the
/// largest sum of depths any stream will use; `variant` indexes kScanVariants. With
/// `staging.enabled` and host-layout planes it also sizes a PlaneStaging (HBM-sized tiles, the
/// copy kernel's blocks taken out of the scan's residency). `head_budgets` (optional, host
/// memory): the budget of stream s is head_budgets[s % size]; unequal budgets with a period of
/// at most kMaxChunkPeriod give work-sized chunks (PlaneScanWorkspace::chunk_period) unless the
/// planes are staged, whose copy rounds assume equal chunks. Throws Error when the variant does
/// not exist, the staging shape is negative, a head budget lies outside 0..budget, or the
/// candidate buffers of `heads` x `keep` do not fit in shared memory.
[[nodiscard]] PlaneScanWorkspace plan_scan_workspace(
    const PlaneScanArgs& args, int budget, int multiprocessors, int variant = 0,
    HostStaging staging = {}, std::span<const std::int32_t> head_budgets = {});

/// The shared-memory plan of a launch with `ws` (staged when ws.staging is enabled).
[[nodiscard]] inline ScanSharedPlan plan_scan_shared(const PlaneScanArgs& args,
                                                     const PlaneScanWorkspace& ws) {
  return plan_scan_shared(args, ws.budget, ws.tile_blocks, ws.variant, ws.staging.enabled());
}

/// Throws Error naming `where` unless 0 <= variant < kScanVariantCount.
void check_scan_variant(int variant, const char* where);

#if HISPARSE_WITH_CUDA
void launch_plane_scan_select(const PlaneScanArgs& args, const PlaneScanWorkspace& ws,
                              cudaStream_t stream);
/// Scan blocks of this launch that the device can hold per SM (occupancy calculator: registers,
/// shared memory and threads of ws.variant's kernel).
[[nodiscard]] int plane_scan_resident_blocks(const PlaneScanArgs& args,
                                             const PlaneScanWorkspace& ws);
#endif
/// CPU twin: identical selection and (when asked) bit-identical scores (the quantized ones) and
/// score_range. It ignores seed_range: the kernel's selection does not depend on it.
void plane_scan_select_ref(const PlaneScanArgs& args);

/// REFERENCE.md's partial-read scores in float (cell midpoints, float weights): the definition
/// the scan approximates. Tokens [0, n) of stream `s` for every head: out[h * n + i].
void plane_scores_ref(const PlaneScanArgs& args, std::int32_t s, std::int64_t n, float* out);

/// The scan's scores (fathom_math.hpp "quantized-weight scores": per scale group and head, 8-bit
/// weights with a power-of-two scale, exact integer sums). Bit-identical to the CUDA kernel;
/// plane_scan_select_ref selects on these. Same layout as plane_scores_ref.
void plane_scores_quantized_ref(const PlaneScanArgs& args, std::int32_t s, std::int64_t n,
                                float* out);

/// Each head's (keep-th, top) score among the eligible tokens of `scores` ([heads][n]) into
/// out[2 h], out[2 h + 1] (PlaneScanArgs::score_range; NaN where there are too few).
void score_range_ref(const float* scores, std::int32_t heads, std::int64_t n, std::int32_t keep,
                     std::int32_t sinks, std::int32_t recent, float* out);

/// The selection rule over given scores ([heads][n], row stride n): sinks, the recent window and
/// the top `keep` of the remaining tokens per head under (score desc, position asc), unioned,
/// sorted ascending. Returns the number written to `out` (room for max_selected()).
std::int64_t select_from_scores_ref(const float* scores, std::int32_t heads, std::int64_t n,
                                    std::int32_t keep, std::int32_t sinks, std::int32_t recent,
                                    std::int32_t* out);

}  // namespace hisparse::kernels::fathom
