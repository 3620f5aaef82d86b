// HiSparse swap-in: resolves one decode step's top-k selection against each request's hot buffer
// (one layer), fetches the misses from mapped pinned host memory and outputs the physical rows
// attention reads. Contract (REFERENCE.md section 1), per batch row b:
//  1. b >= *num_real (read from device memory, so a captured CUDA graph can be replayed with a
//     different number of real requests): physical_rows[b][*] = -1, stats/plan count 0, nothing
//     else is touched.
//  2. r = request_of_row[b] (identity when null) picks the request's state. Positions outside
//     [0, seq_len) (including -1) are "none" and give -1.
//  3. seq_len <= hot: token t lives in slot t (the buffer still holds the whole sequence): output
//     the slot; no I/O, no table or LRU change.
//  4. Otherwise the newest token (seq_len - 1) lives in the reserved slot `hot` and is a hit.
//     Other resident positions are hits. Misses (first occurrence in selection order) take the
//     least recently used slots that are not hits this step: the m-th miss takes the m-th oldest
//     evictable slot; slot_token is updated and the row copied from the host pool.
//  5. New LRU order: untouched slots oldest first, then this step's misses (in miss order), then
//     this step's hits in their previous relative order.
//  6. Output physical row = r * (hot + 1) + slot, an index into the layer's hot rows.
// Duplicated positions in a selection are allowed: every occurrence gets the same row.
// Stats per row: misses = rows fetched; hits = valid entries - misses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/stream.hpp"

namespace hisparse::kernels {

/// The state of one layer's hot buffers, indexed by request.
struct HotBufferView {
  std::int32_t* slot_token = nullptr;  ///< [requests][hot]: token held by each slot, -1 empty
  std::int32_t* lru = nullptr;         ///< [requests][hot]: slot indices, least recently used first
  std::uint8_t* rows = nullptr;  ///< row of slot s of request r at (r * (hot + 1) + s) * row_stride
  std::size_t row_stride = 0;    ///< bytes between hot rows
  /// Optional residency bitmap, [requests][resident_words]: bit t of request r is set while some
  /// slot of r holds token t (tokens below 32 * resident_words; the reserved newest-token slot is
  /// not counted). Every swap-in keeps it in step with slot_token (the twin too). The CUDA copy
  /// kernel reads it as a hint (speculative gather, MissPlan::entry_slot): a stale bit costs
  /// speed, never a wrong byte. Null: not kept.
  std::uint32_t* resident = nullptr;
  std::size_t resident_words = 0;
};

/// One layer of the host KV pool (device address of mapped pinned memory; host address on the CPU).
struct HostPoolView {
  const std::uint8_t* base =
      nullptr;  ///< token t of request r at base + r * request_stride + t * row_stride
  std::size_t request_stride = 0;
  std::size_t row_stride = 0;
};

/// The miss plan the resolve step writes and the copy step consumes (device scratch). Entry m of
/// a row is one fetched row: (destination slot, token). The twin lists the misses in miss order;
/// the CUDA resolve may list them grouped by host address instead (sort_misses_from), or, with
/// the early hand-off, in the order its threads found them, which changes the order of the
/// pairs, never the pairs.
struct MissPlan {
  std::int32_t* count = nullptr;  ///< [batch] rows to fetch
  std::int32_t* slot = nullptr;   ///< [batch][top_k] destination slot of the m-th entry
  std::int32_t* token = nullptr;  ///< [batch][top_k] token (host row) of the m-th entry
  /// [batch] optional (CUDA): 1 where the resolve block fetched the row's misses itself, 0
  /// elsewhere. With it set and a batch below kLargeBatch, a row whose misses fit the resolve's
  /// spare shared memory (a few dozen rows) is fetched by its resolve block, which issues the host reads as soon as the
  /// misses are numbered and lands them after the LRU walk; the copy kernel skips the row. Saves
  /// the copy kernel's hand-off when there are few misses. Null: the copy kernel fetches every
  /// row. The plan is written in full either way; the twin ignores this field.
  std::int32_t* fetched = nullptr;
  /// [batch + 1] optional (CUDA), zero when first used: the early hand-off of launch_swap_in at
  /// batch < kLargeBatch. The resolve raises ready[b] to 1 once row b's miss tokens and count are
  /// written and to 2 once their slots are (or straight to 2 when the row has nothing early to
  /// give), and the copy kernel, started with the resolve, gathers a row's host rows as soon as
  /// its tokens are known instead of waiting for the whole resolve grid; the last copy block
  /// resets the flags (ready[batch] counts the copy blocks). Null, or a call of
  /// launch_swap_in_resolve / launch_swap_in_copy alone: the copy waits for the resolve grid.
  std::int32_t* ready = nullptr;
  /// [batch][top_k] optional: for selection entry i of a real row longer than `hot`, the slot its
  /// row is fetched into when i is the first occurrence of a miss; -1 for every other entry (and
  /// every entry of padding and short rows). With it, a residency bitmap and the early hand-off,
  /// the CUDA copy kernel gathers speculatively: at its start it loads the host rows of the
  /// selected tokens the bitmap says are not resident, without waiting for the resolve, then
  /// stores the ones this array names (loading any it missed). Null: not written.
  std::int32_t* entry_slot = nullptr;
};

/// Which resolve kernel runs (CUDA only; the twin ignores it; results are identical).
enum class ResolvePath : std::uint8_t {
  /// Rows with seq_len <= kResolveDirectTokens look tokens up in a direct token-indexed table in
  /// shared memory (no hashing, no probe loops) and build the hit bits without atomics; longer
  /// rows use the hash. Rows whose selection is one tile (top_k at most 4096), whose hot buffer
  /// is one or two tiles (hot at most 8192) and that the resolve does not fetch itself take a
  /// lean path written for that shape (resolve_tile_row). The default.
  direct,
  /// `direct` compiled so that a call of the common shapes runs compact code: the set-up, the
  /// short-sequence and the lean paths in one kernel, the general code a called function apart
  /// from them (in `direct` it is inlined between the set-up and the lean path). Same results.
  direct_compact,
  /// `direct` without the lean path: every row runs the general resolve code (the kernel before
  /// the lean path; to compare, and so that the GPU tests keep that code covered).
  direct_general,
  /// Every row hashes its selection in shared memory (the kernel measured in calls 1-3).
  hash,
};

/// Phase stamps of the resolve kernel (diagnostic): kSwapInPhaseStamps globaltimer values (ns)
/// then kSwapInPhaseStamps clock64 values, written by thread 0 of block 0 after a block barrier
/// at the end of each phase. Stamp k of a phase the row did not run is left as it was.
inline constexpr int kSwapInPhaseStamps = 9;

struct SwapInArgs {
  const std::int32_t* selected = nullptr;  ///< [batch][top_k] positions, -1 none
  const void* seq_lens = nullptr;          ///< [batch] int32 or int64 (seq_lens_int64)
  bool seq_lens_int64 = false;
  const std::int32_t* num_real = nullptr;        ///< one int32 in device memory
  const std::int32_t* request_of_row = nullptr;  ///< [batch] request index per row, null: identity
  HotBufferView hot_buffer;
  HostPoolView host_pool;
  std::size_t copy_bytes = 0;             ///< bytes copied per fetched row (<= both strides)
  std::int32_t* physical_rows = nullptr;  ///< [batch][top_k] output
  std::int32_t* stats = nullptr;          ///< [batch][2] hits, misses; optional
  MissPlan plan;
  int batch = 0;
  int top_k = 0;
  int hot = 0;
  // Launch tuning (CUDA only; ignored by the twin).
  int copy_blocks = 0;  ///< blocks of the copy kernel; 0: from the SM count and the batch
  bool use_pdl = true;  ///< programmatic dependent launch of the copy kernel (sm_90+)
  /// A row with at least this many misses lists its plan grouped by host address (buckets of
  /// about seq_len / 512 tokens), so that a copy block walks one stretch of the host region; 0:
  /// never (plan in miss order, as the twin writes it).
  int sort_misses_from = -1;  ///< -1: kSortMissesFrom at batch >= kLargeBatch, else never
  /// Rows per copy block and chunk; 0: the fewest chunks in one wave (searched by every block);
  /// -1: swap_in_config::kCopyRowsPerChunk.
  int copy_rows_per_chunk = -1;
  ResolvePath resolve = ResolvePath::direct;
  /// Every row's seq_len is at most this; 0: unknown. When it is known and within the direct
  /// table (32K tokens), ResolvePath::direct runs the compact kernel (as direct_compact does):
  /// on the H200 1.5 us faster at batch 64 / 0.1% miss and about 3 us faster with cold
  /// instruction caches, but 2-4 us slower on rows past the table, which the bound rules out.
  /// HotCache sets it to its pool capacity per request.
  std::int64_t max_seq_len = 0;
  /// Diagnostic: when set, a separately compiled resolve kernel writes 2 x kSwapInPhaseStamps
  /// uint64 stamps here (barriers added between phases; results unchanged). Null: no cost.
  /// A stamp's own stores wait behind the global stores of the phase before it, so a phase that
  /// follows many stores reads long (two stamps with nothing between them measured 1.3 us on the
  /// H200): compare phases across builds, not as absolute costs.
  std::uint64_t* phase_stamps = nullptr;
};

/// Resolve kernel shared memory: block-scan scratch (two ping-pong areas of 33 ints and three
/// counters, padded) and the buckets that group a row's misses by host address.
inline constexpr int kSwapInScratchInts = 72;
inline constexpr int kLog2SwapInBuckets = 9;
inline constexpr int kSwapInBuckets = 1 << kLog2SwapInBuckets;

/// Dynamic shared memory the resolve kernel needs for (top_k, hot).
[[nodiscard]] std::size_t swap_in_shared_bytes(int top_k, int hot) noexcept;
/// Hash-table capacity for a selection of top_k entries (power of two >= 2 * top_k).
[[nodiscard]] int swap_in_hash_capacity(int top_k) noexcept;
/// Dynamic shared memory of the resolve kernel on ResolvePath::direct: the hash area grows to
/// hold one 4-byte word per token of a kResolveDirectTokens-token sequence. The launcher falls
/// back to the hash path when this exceeds swap_in_config::kMaxResolveSharedBytes.
[[nodiscard]] std::size_t swap_in_direct_shared_bytes(int top_k, int hot) noexcept;
/// Names of the phases between stamps k - 1 and k (k = 1 .. kSwapInPhaseStamps - 1).
[[nodiscard]] const char* swap_in_phase_name(int k) noexcept;
/// The enumerator's name ("direct", "direct_compact", ...), as benchmarks and tests print it.
[[nodiscard]] const char* resolve_path_name(ResolvePath path) noexcept;
/// Every ResolvePath, in declaration order (tests and benchmarks cycle through them).
inline constexpr ResolvePath kResolvePaths[] = {ResolvePath::direct, ResolvePath::direct_compact,
                                                ResolvePath::direct_general, ResolvePath::hash};
/// The ResolvePath whose resolve_path_name is `name`; nullopt for any other name.
[[nodiscard]] std::optional<ResolvePath> resolve_path_named(std::string_view name) noexcept;

#if HISPARSE_WITH_CUDA
/// Sets the resolve kernel's dynamic shared-memory limit for (top_k, hot) on the current device.
/// Call once outside stream capture before the first launch (the launcher also calls it when not
/// capturing). A repeated call that needs no more than an earlier one on the device makes no
/// driver call (allow_dynamic_shared).
void configure_swap_in(int top_k, int hot);
/// Resolve kernel (one block per batch row) then copy kernel (rows of the plan spread over many
/// blocks, each chunk within one request's host region). Capturable in a CUDA graph.
void launch_swap_in(const SwapInArgs& args, cudaStream_t stream);
/// The two halves of launch_swap_in, for timing them apart: the resolve writes the plan, the
/// copy fetches what the plan lists (it leaves the plan as it is, so it can be replayed alone).
void launch_swap_in_resolve(const SwapInArgs& args, cudaStream_t stream);
void launch_swap_in_copy(const SwapInArgs& args, cudaStream_t stream);
/// The resolve kernel launch_swap_in runs for args: "swap_in_resolve", or
/// "swap_in_resolve_compact<4>" / "<8>" (ResolvePath::direct_compact where the lean path may run).
[[nodiscard]] std::string swap_in_resolve_kernel(const SwapInArgs& args);
#endif
/// CPU twin with the identical contract (fills the plan too).
void swap_in_ref(const SwapInArgs& args);

}  // namespace hisparse::kernels
