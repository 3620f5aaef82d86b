// CUDA swap-in in two kernels:
//  resolve: one block per batch row. Each thread holds kResolveItems consecutive entries of each
//           tile of the selection / slot table / LRU order (the first tile of each is loaded up
//           front). Shared-memory open-addressing hash of the selection (2 x top_k entries, each
//           key with its first selection index and its slot); hits mark a bit per slot; one
//           block scan per tile numbers the misses (selection order) and the evictable slots
//           (LRU order); the new LRU order is built in shared memory. Writes a miss plan, grouped
//           by host address (512 buckets of the sequence) at large batch. Rows of the common
//           shapes (a one-tile selection, a hot buffer of one or two tiles, the direct table, no
//           fetch by the resolve) take a lean path with the same results and fewer instructions
//           (resolve_tile_row).
//  copy:    a fixed grid (sized to the GPU, not to the misses, so the launch is graph-replayable)
//           cuts every request's plan into chunks of R rows and copies each chunk with several
//           vector loads in flight per thread straight from mapped pinned memory. A chunk never
//           spans two requests, so a block's loads stay within one request's host region
//           (REFERENCE.md section 4: host address translation is the wall). At large batch the
//           chunks are small and run in many waves, each over a band of requests.
// The copy kernel is launched with programmatic dependent launch, so its launch overlaps the
// resolve kernel; it waits on griddepcontrol before reading the plan, or, below batch 8 with
// MissPlan::ready (the early hand-off), on per-row flags the resolve raises as soon as a row's
// miss tokens (1) and slots (2) are written. With a residency bitmap and MissPlan::entry_slot
// as well, it gathers speculatively: each block loads the host rows of its share of the
// selection that the bitmap calls not resident as soon as it starts, and stores them once the
// row's slots are published (batch 1 / 20% miss 19.2 -> 15.4 us, 100% 43 -> 37.5 us). Tuning and
// the figures behind it: swap_in_config.hpp, reports/hotcache_tuning.md.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/cuda_check.hpp"
#include "kernels/common/block_scan.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_cache.hpp"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/common/global_timer.cuh"
#include "kernels/hotcache/swap_in.hpp"
#include "kernels/hotcache/swap_in_config.hpp"

namespace hisparse::kernels {
namespace {
namespace cfg = swap_in_config;

constexpr std::uint32_t kNoSlot = 0xffffu;
constexpr std::uint32_t kMissFlag = 0x8000u;

// Smallest power of two >= max(32, 2 * top_k), without a loop: every warp of the resolve computes
// it, and the loop cost 40 instructions per warp (ncu, batch 1).
__device__ __forceinline__ int hash_capacity(int top_k) {
  const int need = max(32, 2 * top_k);
  return 1 << (32 - __clz(need - 1));
}

__device__ __forceinline__ std::uint32_t hash_home(std::int32_t key, std::uint32_t mask) {
  std::uint32_t x = static_cast<std::uint32_t>(key);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x & mask;
}

// Value word of an entry: high 16 bits = first selection index, low 16 bits = slot, kNoSlot, or
// kMissFlag | miss ordinal. atomicMin on the word keeps the first occurrence.
__device__ __forceinline__ void hash_insert(std::int32_t* keys, std::uint32_t* vals,
                                            std::uint32_t mask, std::int32_t key, int index) {
  std::uint32_t h = hash_home(key, mask);
  while (true) {
    const std::int32_t prev = atomicCAS(&keys[h], -1, key);
    if (prev == -1 || prev == key) {
      atomicMin(&vals[h], (static_cast<std::uint32_t>(index) << 16) | kNoSlot);
      return;
    }
    h = (h + 1) & mask;
  }
}

__device__ __forceinline__ int hash_find(const std::int32_t* keys, std::uint32_t mask,
                                         std::int32_t key) {
  std::uint32_t h = hash_home(key, mask);
  while (true) {
    const std::int32_t k = keys[h];
    if (k == key) return static_cast<int>(h);
    if (k == -1) return -1;
    h = (h + 1) & mask;
  }
}

// Sequence length of batch row b (int32 or int64 per SwapInArgs::seq_lens_int64).
__device__ __forceinline__ std::int64_t row_seq_len(const SwapInArgs& a, int b) {
  return a.seq_lens_int64 ? static_cast<const std::int64_t*>(a.seq_lens)[b]
                          : static_cast<const std::int32_t*>(a.seq_lens)[b];
}

// Copy blocks with a fixed block -> row map (at least one block per row): block k serves row
// k % batch, as the row's (k / batch)-th of its `blocks` blocks.
struct RowBlocks {
  int row, index, blocks;
};
__device__ __forceinline__ RowBlocks row_blocks(int batch) {
  const int k = static_cast<int>(blockIdx.x);
  const int row = k % batch;
  return {row, k / batch, (static_cast<int>(gridDim.x) - row + batch - 1) / batch};
}

__device__ __forceinline__ void write_row_stats(const SwapInArgs& a, int row, int hits, int misses,
                                                bool fetched = false) {
  if (a.stats) {
    a.stats[2 * row] = hits;
    a.stats[2 * row + 1] = misses;
  }
  a.plan.count[row] = misses;
  if (a.plan.fetched) a.plan.fetched[row] = fetched ? 1 : 0;
}

constexpr int kItems = cfg::kResolveItems;

// MissPlan::ready: a release store of a row's progress, and an acquire spin until it is reached.
__device__ __forceinline__ void publish_ready(const SwapInArgs& a, int row, int stage) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(a.plan.ready + row), "r"(stage)
               : "memory");
}
__device__ __forceinline__ void wait_ready(const std::int32_t* flag, int stage) {
  while (true) {
    int v = 0;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v >= stage) return;
    __nanosleep(100);
  }
}

// Adds each thread's `value` to a shared counter (one atomic per warp; all lanes must call it).
__device__ __forceinline__ void block_add(int* counter, int value) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) value += __shfl_xor_sync(0xffffffffu, value, o);
  if ((threadIdx.x & 31) == 0 && value != 0) atomicAdd(counter, value);
}

// Entries first..first+kN-1 of src (-1 past n): one thread's part of a tile, all loads issued
// before any is used; 16-B loads for each aligned group of 4 that is whole.
template <int kN>
__device__ __forceinline__ void load_items(const std::int32_t* src, int first, int n,
                                           std::int32_t (&v)[kN]) {
  static_assert(kN % 4 == 0);
#pragma unroll
  for (int g = 0; g < kN; g += 4) {
    const int at = first + g;
    if (at + 4 <= n && (reinterpret_cast<std::uintptr_t>(src + at) & 15u) == 0) {
      const int4 q = *reinterpret_cast<const int4*>(src + at);  // one 16-B load, not four
      v[g] = q.x;
      v[g + 1] = q.y;
      v[g + 2] = q.z;
      v[g + 3] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[g + j] = at + j < n ? src[at + j] : -1;
    }
  }
}

// Entries first..first+kN-1 of dst (those below n) = v: the store twin of load_items.
template <int kN>
__device__ __forceinline__ void store_items(std::int32_t* dst, int first, int n,
                                            const std::int32_t (&v)[kN]) {
  static_assert(kN % 4 == 0);
#pragma unroll
  for (int g = 0; g < kN; g += 4) {
    const int at = first + g;
    if (at + 4 <= n && (reinterpret_cast<std::uintptr_t>(dst + at) & 15u) == 0) {
      *reinterpret_cast<int4*>(dst + at) = make_int4(v[g], v[g + 1], v[g + 2], v[g + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (at + j < n) dst[at + j] = v[g + j];
    }
  }
}

static_assert(kItems == 4, "the hit-word shuffle and the 16-B loads assume 4 entries per thread");

// Token -> value-word table of one row: the shared-memory hash of the selection, or (direct) one
// word per token of the sequence, indexed by the token itself: no hashing and no probe loops.
// Both hold the same words, so the phases below do not care which one a row uses.
struct SelectionTable {
  std::int32_t* keys;  // hash only
  std::uint32_t* vals;
  std::uint32_t mask;  // hash only
  bool direct;

  __device__ __forceinline__ void insert(std::int32_t pos, int index) const {
    if (direct) {
      atomicMin(&vals[pos], (static_cast<std::uint32_t>(index) << 16) | kNoSlot);
    } else {
      hash_insert(keys, vals, mask, pos, index);
    }
  }
  // Word index of `key` (0 <= key < seq_len, key != newest, inserted or not), -1 when absent.
  __device__ __forceinline__ int find(std::int32_t key) const {
    if (direct) return vals[key] != 0xffffffffu ? key : -1;
    return hash_find(keys, mask, key);
  }
};

// How one call's resolve runs (chosen by the launcher, passed to the kernel).
struct ResolveShape {
  int direct_tokens = 0;  ///< tokens of the direct table (0: every row hashes)
  std::size_t shared_bytes = 0;
  int fetch_rows = 0;    ///< MissPlan::fetched: rows a block fetches itself (0: the copy does)
  int fetch_offset = 0;  ///< their staging area (16-B aligned)
  /// Byte offset of the old-token array (hot ints: each slot's token before this call), which
  /// the residency bitmap's updates read; 0: read from slot_token instead (no room).
  int old_token_offset = 0;
  bool early = false;  ///< MissPlan::ready: the copy kernel started with the resolve
  bool lean = false;   ///< ResolvePath::direct: one-tile rows take resolve_tile_row
  bool spec = false;   ///< speculative gather: entry_slot published after the LRU walk
};

// Speculative gather: the rows of the misses the copy kernel did not guess (a stale residency
// bit), copied by the resolve block itself once their slots are known, and their bits set.
// Rare (the swap-in keeps the bitmap exact), so plainly: 16-B pieces when everything is aligned.
// Its own loop rather than copy_rows: inlined here, copy_rows raised the speculative resolve's
// spills from 8 to 40 bytes (ptxas, sm_90a), and as a called function to 180.
__device__ __forceinline__ void fetch_late_rows(const SwapInArgs& a, int r, std::int32_t base,
                                                const std::int32_t* late_token,
                                                const std::int32_t* late_ordinal, int n_late,
                                                const std::uint16_t* evict_slot,
                                                std::uint32_t* resident,
                                                std::int64_t resident_tokens) {
  if (n_late == 0) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  const std::uint8_t* host =
      a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride;
  const auto piece = ((a.copy_bytes | a.host_pool.row_stride | a.host_pool.request_stride |
                       a.hot_buffer.row_stride | reinterpret_cast<std::uintptr_t>(host) |
                       reinterpret_cast<std::uintptr_t>(a.hot_buffer.rows)) &
                      15u) == 0
                         ? std::size_t{16}
                         : std::size_t{1};
  const auto pieces = static_cast<int>(a.copy_bytes / piece);
  for (int u = tid; u < n_late * pieces; u += nt) {
    const int k = u / pieces;
    const std::size_t at = static_cast<std::size_t>(u - k * pieces) * piece;
    const std::uint8_t* src =
        host + static_cast<std::size_t>(late_token[k]) * a.host_pool.row_stride + at;
    std::uint8_t* dst =
        a.hot_buffer.rows +
        (static_cast<std::size_t>(base) + evict_slot[late_ordinal[k]]) * a.hot_buffer.row_stride +
        at;
    if (piece == 16) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
  }
  for (int k = tid; k < n_late; k += nt)
    if (late_token[k] < resident_tokens)
      atomicOr(resident + late_token[k] / 32, 1u << (late_token[k] % 32));
}

// Request r's slot table, LRU order and residency bitmap (null when not kept), and the tokens the
// bitmap covers.
struct RequestTables {
  std::int32_t* slot_token;
  std::int32_t* lru;
  std::uint32_t* resident;
  std::int64_t resident_tokens;
};
__device__ __forceinline__ RequestTables request_tables(const SwapInArgs& a, int r) {
  const auto at = static_cast<std::size_t>(r) * static_cast<std::size_t>(a.hot);
  return {a.hot_buffer.slot_token + at, a.hot_buffer.lru + at,
          a.hot_buffer.resident
              ? a.hot_buffer.resident + static_cast<std::size_t>(r) * a.hot_buffer.resident_words
              : nullptr,
          static_cast<std::int64_t>(32 * a.hot_buffer.resident_words)};
}

// Block blockIdx.x's row of the call: the thread's place in the block and the row's slices of
// the selection, the output and entry_slot (null when not kept).
struct ResolveRowView {
  int b, tid, nt, top_k, hot, tile, mine;
  const std::int32_t* sel;
  std::int32_t* out;
  std::int32_t* entry_slot;
};
__device__ __forceinline__ ResolveRowView resolve_row_view(const SwapInArgs& a) {
  const int b = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  const auto at = static_cast<std::size_t>(b) * a.top_k;
  return {b,
          tid,
          nt,
          a.top_k,
          a.hot,
          nt * kItems,
          tid * kItems,
          a.selected + at,
          a.physical_rows + at,
          a.plan.entry_slot ? a.plan.entry_slot + at : nullptr};
}

// The resolve's dynamic shared memory (swap_in_shared_bytes, swap_in_direct_shared_bytes): the
// table (the hash's keys then values, or the direct table's word per token from the start), the
// hit bits, the scratch ints, the buckets, the new LRU order, the evicted slots and (direct only)
// each miss's plan entry.
struct ResolveSmem {
  std::int32_t* keys;
  std::uint32_t* vals;  // the hash's values
  std::uint32_t* hit_bits;
  int* scratch;
  int* bucket;
  std::uint16_t* new_lru;
  std::uint16_t* evict_slot;
  std::uint16_t* miss_entry;
};
__device__ __forceinline__ ResolveSmem resolve_smem(unsigned char* smem, int direct_tokens,
                                                    int top_k, int hot) {
  const int capacity = hash_capacity(top_k);
  const int table_words = direct_tokens > 0 ? max(2 * capacity, direct_tokens) : 2 * capacity;
  ResolveSmem s{};
  s.keys = reinterpret_cast<std::int32_t*>(smem);
  s.vals = reinterpret_cast<std::uint32_t*>(s.keys + capacity);
  s.hit_bits = reinterpret_cast<std::uint32_t*>(smem) + table_words;
  // scratch: [0, 66) the BlockScan, 66 hits, 67 valid, 68 misses handed over before numbering,
  // 69 late misses (speculative gather)
  static_assert(kSwapInScratchInts >= kBlockScanScratchInts + 4);
  s.scratch = reinterpret_cast<int*>(s.hit_bits + (hot + 31) / 32);
  s.bucket = s.scratch + kSwapInScratchInts;
  s.new_lru = reinterpret_cast<std::uint16_t*>(s.bucket + kSwapInBuckets);
  s.evict_slot = s.new_lru + hot;
  s.miss_entry = s.evict_slot + top_k;
  return s;
}

// This thread's entries of the selection tile that starts at t0 (the first tile, loaded up
// front, is passed in).
__device__ __forceinline__ void selection_tile(const std::int32_t* sel, int t0, int mine, int top_k,
                                               const std::int32_t (&first)[kItems],
                                               std::int32_t (&v)[kItems]) {
  if (t0 == 0) {
#pragma unroll
    for (int j = 0; j < kItems; ++j) v[j] = first[j];
  } else {
    load_items(sel, t0 + mine, top_k, v);
  }
}

// Speculative gather, after the LRU walk: each entry's slot (entry_slot: the evicted slot for a
// miss's first occurrence, `ordinal` its miss number; -1 elsewhere), then ready 2, from which
// the copy kernel stores the rows its speculative loads got; then the misses it did not guess.
// Every thread of the block calls it (one tile of entries, kItems per thread).
__device__ __forceinline__ void publish_entry_slots(
    const SwapInArgs& a, int b, int r, std::int32_t base, const int (&ordinal)[kItems],
    const std::uint16_t* evict_slot, std::int32_t* entry_slot, const std::int32_t* late_token,
    const std::int32_t* late_ordinal, int n_late, std::uint32_t* resident,
    std::int64_t resident_tokens) {
  std::int32_t slots[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) slots[j] = ordinal[j] >= 0 ? evict_slot[ordinal[j]] : -1;
  store_items(entry_slot, static_cast<int>(threadIdx.x) * kItems, a.top_k, slots);
  __syncthreads();
  if (threadIdx.x == 0) publish_ready(a, b, 2);
  fetch_late_rows(a, r, base, late_token, late_ordinal, n_late, evict_slot, resident,
                  resident_tokens);
}

// Phase stamp (diagnostic, kTimed only): a block barrier, then thread 0 of block 0 writes the
// global timer (ns) and the SM clock.
template <bool kTimed>
__device__ __forceinline__ void phase_stamp(const SwapInArgs& a, int k) {
  if constexpr (kTimed) {
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      const long long clock = clock64();
      a.phase_stamps[k] = global_timer_ns();
      a.phase_stamps[kSwapInPhaseStamps + k] = static_cast<std::uint64_t>(clock);
    }
  } else {
    (void)a;
    (void)k;
  }
}

// Stores the new LRU order (built in shared memory as 16-bit slots) to device memory, 4 slots
// per load and store where aligned.
__device__ __forceinline__ void commit_lru(std::int32_t* lru, const std::uint16_t* new_lru,
                                           int hot) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  if ((hot & 3) == 0 && (reinterpret_cast<std::uintptr_t>(lru) & 15u) == 0 &&
      (reinterpret_cast<std::uintptr_t>(new_lru) & 7u) == 0) {
    for (int p = 4 * tid; p < hot; p += 4 * nt) {
      const uint2 q = *reinterpret_cast<const uint2*>(new_lru + p);
      *reinterpret_cast<int4*>(lru + p) =
          make_int4(static_cast<int>(q.x & 0xffffu), static_cast<int>(q.x >> 16),
                    static_cast<int>(q.y & 0xffffu), static_cast<int>(q.y >> 16));
    }
  } else {
    for (int p = tid; p < hot; p += nt) lru[p] = new_lru[p];
  }
}

// The long-sequence path of a row whose selection is one tile and whose sequence fits the direct
// table (the common shape: top_k <= 4096, hot <= 4096 or 8192, <= 32K tokens), when the resolve
// does not fetch the row's misses itself. Each thread holds kItems selection entries and kSlots
// consecutive hot slots / LRU positions (4: hot <= 4096; 8: hot <= 8192, SGLang's 6144 default
// among them), so one block scan still numbers the evictable slots in LRU order. 32-bit positions,
// no tile loops, no hash, hand-over or fetch branches, one-barrier block scans. It computes exactly
// what the general path computes (the GPU tests run both against the twin;
// ResolvePath::direct_general keeps the general path for every row). Why: the general path executes
// about 1,250 warp instructions per warp on this shape, mostly branches and 64-bit compares, and
// the one-block resolve is about half issue-bound (ncu, H200). The first form of this path (taken
// after the general set-up) executed 20% fewer in all; the row now leaves the general code before
// the table pointers and loads. H200: resolve at batch 64 / 0.1% 11.7 -> 9.7 us, whole call at
// batch 1 / 0.1% 13.3 -> 12.0 us (reports/hotcache_tuning.md). Storing the new order straight to
// device memory instead of staging it in shared memory was slower (12.7 against 12.2 us).
template <bool kTimed, bool kSpec, int kSlots>
__device__ __forceinline__ void resolve_tile_row(const SwapInArgs& a, const ResolveShape& shape,
                                                 unsigned char* smem, int b, int r, int seq_len,
                                                 std::int32_t base,
                                                 const std::int32_t (&sel)[kItems]) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int mine = tid * kItems;     // first selection entry of this thread
  const int slot_at = tid * kSlots;  // first hot slot / LRU position of this thread
  const int top_k = a.top_k;
  const int hot = a.hot;
  const int newest = seq_len - 1;
  static_assert(kSlots == 4 || kSlots == 8, "a hit word's 32 slots span 8 or 4 lanes");
  const auto in_seq = [seq_len](std::int32_t pos) {
    return static_cast<unsigned>(pos) < static_cast<unsigned>(seq_len);
  };
  // The direct layout of swap_in_direct_shared_bytes (the general path's, so the offsets agree).
  const int table_words = max(2 * hash_capacity(top_k), shape.direct_tokens);
  auto* vals = reinterpret_cast<std::uint32_t*>(smem);
  auto* hit_bits = vals + table_words;
  int* scratch = reinterpret_cast<int*>(hit_bits + (hot + 31) / 32);
  int* bucket = scratch + kSwapInScratchInts;
  auto* new_lru = reinterpret_cast<std::uint16_t*>(bucket + kSwapInBuckets);
  auto* evict_slot = new_lru + hot;
  auto* old_token = shape.old_token_offset > 0
                        ? reinterpret_cast<std::int32_t*>(smem + shape.old_token_offset)
                        : nullptr;
  auto* late_token = reinterpret_cast<std::int32_t*>(smem + shape.fetch_offset);
  auto* late_ordinal = late_token + top_k;
  const auto [slot_token, lru, resident, resident_tokens] = request_tables(a, r);
  // The request's tables (the loads are in flight during the clear), the residency bitmap's
  // lines into L2 for the commit's atomics, and (kSpec) the residency bit of each entry, which
  // the copy kernel's guesses read too: no selected token's bit changes before the LRU walk.
  std::int32_t slot0[kSlots], lru0[kSlots];  // -1 past hot
  load_items(slot_token, slot_at, hot, slot0);
  load_items(lru, slot_at, hot, lru0);
  std::uint32_t bits = 0;  // kSpec: bit j set when entry j's token is resident or past the bitmap
  if (resident) {
    const int words = (seq_len + 31) / 32;
    if (32 * tid < words && static_cast<std::size_t>(32 * tid) < a.hot_buffer.resident_words)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(resident + 32 * tid));
    if constexpr (kSpec) {
      const int in_bitmap = static_cast<int>(min(resident_tokens, std::int64_t{seq_len}));
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const std::int32_t pos = sel[j];
        if (in_seq(pos) && (pos >= in_bitmap || ((__ldcg(resident + pos / 32) >> (pos % 32)) & 1u)))
          bits |= 1u << j;
      }
    }
  }
  const int sort_from = a.sort_misses_from >= 0
                            ? a.sort_misses_from
                            : (a.batch >= cfg::kLargeBatch ? cfg::kSortMissesFrom : 0);
  const int shift = max(0, 32 - __clz(seq_len - 1) - kLog2SwapInBuckets);  // seq_len > hot >= 1
  phase_stamp<kTimed>(a, 1);

  // Clear the table words of the sequence (and the bucket counts a grouped plan uses).
  {
    // A constant stride (blockDim.x is always kResolveThreads): no trip-count division.
    auto* words4 = reinterpret_cast<uint4*>(smem);
    const int n4 = (seq_len + 3) / 4;
#pragma unroll 8
    for (int i = tid; i < n4; i += cfg::kResolveThreads)
      words4[i] = make_uint4(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    if (sort_from > 0 && tid < kSwapInBuckets) bucket[tid] = 0;
    if (tid == 0) scratch[67] = scratch[69] = 0;
  }
  __syncthreads();
  phase_stamp<kTimed>(a, 2);

  // 1. The selection's first occurrences (the newest token lives in the reserved slot).
  int my_valid = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const std::int32_t pos = sel[j];
    if (in_seq(pos)) {
      ++my_valid;
      if (pos != newest)
        atomicMin(&vals[pos], (static_cast<std::uint32_t>(mine + j) << 16) | kNoSlot);
    }
  }
  block_add(&scratch[67], my_valid);
  __syncthreads();
  phase_stamp<kTimed>(a, 3);

  // 2. Hits: a slot whose token is selected writes its number into the word's low half.
  std::uint32_t nibble = 0;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const std::int32_t t = slot0[j];  // -1 past hot
    if (in_seq(t) && vals[t] != 0xffffffffu) {
      reinterpret_cast<std::uint16_t*>(vals + t)[0] = static_cast<std::uint16_t>(slot_at + j);
      nibble |= 1u << j;
    }
  }
  {
    // The 32 / kSlots lanes of an aligned group own the 32 slots of one hit word.
    constexpr int kLanesPerWord = 32 / kSlots;
    std::uint32_t word = nibble << (kSlots * (lane & (kLanesPerWord - 1)));
#pragma unroll
    for (int o = 1; o < kLanesPerWord; o <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, o);
    if ((lane & (kLanesPerWord - 1)) == 0 && (slot_at >> 5) < (hot + 31) / 32)
      hit_bits[slot_at >> 5] = word;
  }
  if (old_token && slot_at < hot) store_items(old_token, slot_at, hot, slot0);
  __syncthreads();
  phase_stamp<kTimed>(a, 4);

  // 3. Misses (first occurrences without a slot) and evictable slots (LRU entries not hit),
  //    numbered together by one scan of packed counts (both below 2^16).
  bool miss[kItems], evictable[kSlots];
  int misses = 0, evictables = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const std::int32_t pos = sel[j];
    miss[j] = false;
    if (in_seq(pos) && pos != newest) {
      const std::uint32_t w = vals[pos];
      miss[j] = w == ((static_cast<std::uint32_t>(mine + j) << 16) | kNoSlot);
    }
    misses += miss[j] ? 1 : 0;
  }
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const std::int32_t s = lru0[j];  // -1 past hot
    evictable[j] = s >= 0 && ((hit_bits[s >> 5] >> (s & 31)) & 1u) == 0;
    evictables += evictable[j] ? 1 : 0;
  }
  int total = 0;
  const int before = block_exclusive_sum_one_barrier((misses << 16) | evictables, scratch, total);
  const int n_miss = total >> 16;
  const int n_evictable = total & 0xffff;
  const int n_untouched = n_evictable - n_miss;
  const bool grouped = sort_from > 0 && n_miss >= sort_from;
  int ordinal[kItems];
  {
    int m = before >> 16;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      ordinal[j] = -1;
      if (!miss[j]) continue;
      const std::int32_t pos = sel[j];
      ordinal[j] = m;
      vals[pos] =
          (static_cast<std::uint32_t>(mine + j) << 16) | kMissFlag | static_cast<std::uint32_t>(m);
      // kSpec: the copy kernel guessed this miss iff its residency bit was clear.
      if (kSpec && ((bits >> j) & 1u)) {
        const int k = atomicAdd(&scratch[69], 1);
        late_token[k] = pos;
        late_ordinal[k] = m;
      }
      if (grouped) atomicAdd(&bucket[pos >> shift], 1);
      ++m;
    }
  }
  // New order (staged in shared memory): untouched oldest first, then the misses (the m-th
  // evictable slot goes to the m-th miss), then the hits in their old order.
  {
    int e = before & 0xffff;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int p = slot_at + j;
      const std::int32_t s = lru0[j];
      if (s < 0) continue;
      int at;
      if (!evictable[j]) {
        at = n_evictable + (p - e);
      } else {
        if (e < n_miss) {
          evict_slot[e] = static_cast<std::uint16_t>(s);
          at = n_untouched + e;
        } else {
          at = e - n_miss;
        }
        ++e;
      }
      new_lru[at] = static_cast<std::uint16_t>(s);
    }
  }
  __syncthreads();  // evict_slot, the miss words and the bucket counts are complete
  commit_lru(lru, new_lru, hot);
  phase_stamp<kTimed>(a, 5);
  phase_stamp<kTimed>(a, 6);  // the LRU walk ran in the same phase

  if (grouped) {  // each bucket's first plan index
    int bucket_total = 0;
    const int c = tid < kSwapInBuckets ? bucket[tid] : 0;
    const int first = block_exclusive_sum_one_barrier(c, scratch + 32, bucket_total);
    if (tid < kSwapInBuckets) bucket[tid] = first;
    __syncthreads();
  }
  phase_stamp<kTimed>(a, 7);
  std::int32_t* entry_slot =
      a.plan.entry_slot ? a.plan.entry_slot + static_cast<std::size_t>(b) * top_k : nullptr;
  if constexpr (kSpec)
    publish_entry_slots(a, b, r, base, ordinal, evict_slot, entry_slot, late_token, late_ordinal,
                        scratch[69], resident, resident_tokens);

  // 4. Commit: the slot table, the residency bits and the plan at each miss's first occurrence;
  //    the physical row of every entry.
  std::int32_t* plan_token = a.plan.token + static_cast<std::size_t>(b) * top_k;
  std::int32_t* plan_slot = a.plan.slot + static_cast<std::size_t>(b) * top_k;
  std::int32_t rows_out[kItems], slots_out[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const std::int32_t pos = sel[j];
    rows_out[j] = -1;
    slots_out[j] = -1;
    if (!in_seq(pos)) continue;
    if (pos == newest) {
      rows_out[j] = base + hot;
      continue;
    }
    const std::uint32_t w = vals[pos];
    if ((w & kMissFlag) == 0) {
      rows_out[j] = base + static_cast<std::int32_t>(w & 0xffffu);
      continue;
    }
    const int m = static_cast<int>(w & 0x7fffu);
    const int slot = evict_slot[m];
    rows_out[j] = base + slot;
    if (ordinal[j] < 0) continue;  // a later occurrence: the first one commits
    slots_out[j] = slot;
    if (resident) {  // token out, token in (distinct tokens: the atomics commute)
      const std::int32_t old = old_token ? old_token[slot] : slot_token[slot];
      if (old >= 0 && old < resident_tokens) atomicAnd(resident + old / 32, ~(1u << (old % 32)));
      // kSpec: the bit is set by whoever stores the row, never before the guess has read it.
      if (!kSpec && pos < resident_tokens) atomicOr(resident + pos / 32, 1u << (pos % 32));
    }
    slot_token[slot] = pos;
    const int at = grouped ? atomicAdd(&bucket[pos >> shift], 1) : m;
    plan_token[at] = pos;
    plan_slot[at] = slot;
  }
  store_items(a.physical_rows + static_cast<std::size_t>(b) * top_k, mine, top_k, rows_out);
  if (entry_slot && !kSpec) store_items(entry_slot, mine, top_k, slots_out);
  if (tid == 0) write_row_stats(a, b, scratch[67] - n_miss, n_miss);
  if (!kSpec && shape.early) {  // the copy kernel may read the plan once it is complete
    __syncthreads();
    if (tid == 0) publish_ready(a, b, 2);
  }
  phase_stamp<kTimed>(a, 8);
}

// Resolve, one block per batch row. Thread t owns entries t*kItems .. t*kItems+kItems-1 of each
// tile of kResolveThreads*kItems selection entries / hot slots (a blocked layout, so one block
// scan per tile numbers misses and evictable slots in order). The first tile of the selection,
// the slot table and the LRU order is loaded up front, so that the kernel waits for device
// memory about twice (inputs, then the request's tables) rather than once per loop iteration.
// direct_tokens > 0 (ResolvePath::direct): rows of at most direct_tokens tokens use the direct
// table, and the hit bits of every row are built by warp shuffles instead of shared atomics.
// fetch_rows > 0 (MissPlan::fetched): a row with at most fetch_rows misses is fetched by this
// block: at byte fetch_offset of shared memory, the misses' tokens (fetch_rows ints, padded to
// 16 B) then their staged rows. The block issues the host reads (cp.async, consecutive threads on
// consecutive 16-B pieces of a row, so a warp reads 512 contiguous bytes) as soon as the misses
// are numbered, and writes the rows to their slots after the LRU walk.
// spec (speculative gather): the row's entry_slot values are written and published (ready 2)
// right after the LRU walk, before the commit. The residency bitmap loses the evicted tokens in
// the commit; the new ones are set by whoever stores their rows (the copy kernel's guessing block,
// or fetch_late_rows), never before the guess has read them.
// one_phase: when the selection and the hot buffer are one tile each and nothing needs the miss
// count before the numbering, the misses and the LRU walk share one block scan (packed counts).
template <bool kTimed, bool kSpec>
__device__ __forceinline__ void resolve_general_row(const SwapInArgs& a, const ResolveShape& shape,
                                                    unsigned char* smem, int r,
                                                    std::int64_t seq_len, std::int32_t base,
                                                    const std::int32_t (&sel0)[kItems]) {
  const int direct_tokens = shape.direct_tokens;
  const int fetch_rows = shape.fetch_rows;
  const int fetch_offset = shape.fetch_offset;
  const bool early = shape.early;
  constexpr bool spec = kSpec;
  const auto [b, tid, nt, top_k, hot, tile, mine, sel, out, entry_slot] = resolve_row_view(a);
  auto sel_tile = [&](int t0, std::int32_t(&v)[kItems]) {
    selection_tile(sel, t0, mine, top_k, sel0, v);
  };
  const int capacity = hash_capacity(top_k);
  const auto mask = static_cast<std::uint32_t>(capacity - 1);
  const int words = (hot + 31) / 32;
  const bool fast = direct_tokens > 0;
  const ResolveSmem layout = resolve_smem(smem, direct_tokens, top_k, hot);
  std::int32_t* keys = layout.keys;
  std::uint32_t* vals = layout.vals;
  std::uint32_t* hit_bits = layout.hit_bits;
  int* scratch = layout.scratch;
  int* bucket = layout.bucket;
  std::uint16_t* new_lru = layout.new_lru;
  std::uint16_t* evict_slot = layout.evict_slot;
  std::uint16_t* miss_entry = layout.miss_entry;
  BlockScan scan(scratch);

  const auto [slot_token, lru, resident, resident_tokens] = request_tables(a, r);
  // The bitmap's few lines (4 KB at 32K tokens) into L2 now, so that the commit's atomics at
  // the end of the block do not wait for device memory.
  if (resident)
    for (std::size_t w = 32 * static_cast<std::size_t>(tid); w < a.hot_buffer.resident_words;
         w += 32 * static_cast<std::size_t>(nt))
      asm volatile("prefetch.global.L2 [%0];" ::"l"(resident + w));
  // spec: the residency bit of this thread's entries, read now so that the misses phase does not
  // wait for device memory. The copy kernel's guesses read the same values: no selected token's
  // bit changes before the LRU walk (bits are set after ready 2, and cleared in the commit).
  std::uint32_t my_bits = 0;  // bit j: entry mine + j is resident, or past the bitmap
  if constexpr (kSpec) {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const std::int32_t pos = sel0[j];
      if (pos >= 0 && pos < seq_len &&
          (pos >= resident_tokens || ((__ldcg(resident + pos / 32) >> (pos % 32)) & 1u)))
        my_bits |= 1u << j;
    }
  }
  auto* old_token = resident && shape.old_token_offset > 0
                        ? reinterpret_cast<std::int32_t*>(smem + shape.old_token_offset)
                        : nullptr;
  std::int32_t slot0[kItems], lru0[kItems];
  load_items(slot_token, mine, hot, slot0);
  load_items(lru, mine, hot, lru0);
  const auto newest = static_cast<std::int32_t>(seq_len - 1);
  const int sort_from = a.sort_misses_from >= 0
                            ? a.sort_misses_from
                            : (a.batch >= cfg::kLargeBatch ? cfg::kSortMissesFrom : 0);
  // Bucket of a token: token >> shift < kSwapInBuckets (seq_len > hot >= 1 here).
  const int shift = max(0, 64 - __clzll(static_cast<long long>(seq_len - 1)) - kLog2SwapInBuckets);
  phase_stamp<kTimed>(a, 1);
  const bool direct = fast && seq_len <= direct_tokens;
  const SelectionTable table{keys, direct ? reinterpret_cast<std::uint32_t*>(smem) : vals, mask,
                             direct};

  if (table.direct) {  // one word per token of the sequence (direct_tokens is a multiple of 4)
    auto* words4 = reinterpret_cast<uint4*>(smem);
    const int n4 = static_cast<int>((seq_len + 3) / 4);
#pragma unroll 8
    for (int i = tid; i < n4; i += nt)
      words4[i] = make_uint4(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  } else {
    for (int i = tid; i < capacity; i += nt) {
      keys[i] = -1;
      vals[i] = 0xffffffffu;
    }
  }
  if (!fast) {  // the fast path writes every hit word in step 2
    for (int i = tid; i < words; i += nt) hit_bits[i] = 0;
  }
  if (!fast || sort_from > 0) {
    for (int i = tid; i < kSwapInBuckets; i += nt) bucket[i] = 0;
  }
  if (tid == 0) scratch[66] = scratch[67] = scratch[68] = scratch[69] = 0;
  __syncthreads();
  phase_stamp<kTimed>(a, 2);

  // 1. Table of the selection (newest and invalid positions excluded); count valid entries.
  int my_valid = 0;
  for (int t0 = 0; t0 < top_k; t0 += tile) {
    std::int32_t v[kItems];
    sel_tile(t0, v);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const std::int32_t pos = v[j];
      if (pos >= 0 && pos < seq_len) {
        ++my_valid;
        if (pos != newest) table.insert(pos, t0 + mine + j);
      }
    }
  }
  block_add(&scratch[67], my_valid);
  __syncthreads();
  phase_stamp<kTimed>(a, 3);

  // 2. Hits: resident tokens found in the table record their slot.
  int my_hits = 0;
  const int lane = tid & 31;
  for (int t0 = 0; t0 < hot; t0 += tile) {
    std::int32_t v[kItems];
    if (t0 == 0) {
#pragma unroll
      for (int j = 0; j < kItems; ++j) v[j] = slot0[j];
    } else {
      load_items(slot_token, t0 + mine, hot, v);
    }
    if (old_token)
      store_items(old_token, t0 + mine, hot, v);  // read by the commit's bitmap updates
    std::uint32_t nibble = 0;                     // bit j: slot t0 + mine + j is hit
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      // Empty slots, slots past hot and tokens past the sequence are never in the table.
      if (v[j] < 0 || v[j] >= seq_len) continue;
      const int h = table.find(v[j]);
      if (h < 0) continue;
      const int s = t0 + mine + j;
      table.vals[h] = (table.vals[h] & 0xffff0000u) | static_cast<std::uint32_t>(s);
      nibble |= 1u << j;
      ++my_hits;
    }
    if (fast) {
      // The 8 lanes of an aligned group own the 32 slots of one hit word (kItems == 4): OR their
      // nibbles together and store the word (every word is written, so none needs clearing).
      std::uint32_t word = nibble << (kItems * (lane & 7));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, o);
      const int w = (t0 + mine) >> 5;
      if ((lane & 7) == 0 && w < words) hit_bits[w] = word;
    } else {
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int s = t0 + mine + j;
        if ((nibble >> j) & 1u) atomicOr(&hit_bits[s >> 5], 1u << (s & 31));
      }
    }
  }
  block_add(&scratch[66], my_hits);
  __syncthreads();
  phase_stamp<kTimed>(a, 4);
  const int n_hit = scratch[66];
  const int valid = scratch[67];

  // 3. Misses, numbered in selection order (first occurrences only); bucket counts by address.
  //    A row with few misses (one tile of selection) starts fetching them here.
  int n_miss = 0;
  bool fetch = false;  // uniform: decided from the block-wide miss count
  const auto units_per_row = static_cast<int>(a.copy_bytes / 16);
  auto* fetch_token = reinterpret_cast<std::int32_t*>(smem + fetch_offset);
  auto* staged = reinterpret_cast<uint4*>(smem + fetch_offset + (fetch_rows * 4 + 15) / 16 * 16);
  const std::uint8_t* host_row0 =
      a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride;
  // MissPlan::ready: an ungrouped plan is handed to the copy kernel in two steps, the tokens
  // as soon as they are known and the slots after the LRU walk. A row of one tile hands its
  // tokens over before numbering them, in the order its warps find them (one atomic per warp),
  // so the copy starts two barriers earlier; the numbering then records each miss's entry.
  const bool early_plan = early && !spec && sort_from == 0;
  const bool hand_over_first = early_plan && top_k <= tile && fast;
  int my_entry = 0;  // hand_over_first: this thread's first plan entry
  std::int32_t* plan_token = a.plan.token + static_cast<std::size_t>(b) * top_k;
  std::int32_t* plan_slot = a.plan.slot + static_cast<std::size_t>(b) * top_k;
  // spec (one tile): each entry's miss ordinal, -1 when not a miss.
  int my_ordinal[kItems] = {-1, -1, -1, -1};
  // spec: misses the copy kernel does not guess (their bit is set, or past the bitmap), which this
  // block fetches itself after the LRU walk: tokens and ordinals at fetch_offset.
  auto* late_token = reinterpret_cast<std::int32_t*>(smem + fetch_offset);
  auto* late_ordinal = late_token + top_k;
  // The parts of the misses phase and of the LRU walk (step 4) for one tile of entries / of the
  // LRU order. A call of one tile each, without the two hand-overs that need the miss count
  // before the numbering (hand_over_first, fetch), runs both in one phase with one block scan of
  // packed counts: one barrier-separated phase fewer.
  auto find_misses = [&](const std::int32_t(&v)[kItems], int t0, int(&h)[kItems],
                         bool(&miss)[kItems]) {
    int count = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const std::int32_t pos = v[j];
      miss[j] = false;
      h[j] = 0;
      if (pos >= 0 && pos < seq_len && pos != newest) {
        h[j] = table.find(pos);
        const std::uint32_t w = table.vals[h[j]];
        miss[j] =
            (w >> 16) == static_cast<std::uint32_t>(t0 + mine + j) && (w & 0xffffu) == kNoSlot;
        count += miss[j] ? 1 : 0;
      }
    }
    return count;
  };
  auto number_misses = [&](const std::int32_t(&v)[kItems], int t0, const int(&h)[kItems],
                           const bool(&miss)[kItems], int ordinal) {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      my_ordinal[j] = miss[j] ? ordinal : -1;
      if (!miss[j]) continue;
      // The copy kernel guessed this miss iff its bit was clear: nothing sets the bit before the
      // guessing block has read it (that block sets it once the row is stored), so both sides
      // see the value the call started with.
      if (spec && ((my_bits >> j) & 1u)) {  // spec: one tile, so v is sel0
        const int k = atomicAdd(&scratch[69], 1);
        late_token[k] = v[j];
        late_ordinal[k] = ordinal;
      }
      table.vals[h[j]] = (static_cast<std::uint32_t>(t0 + mine + j) << 16) | kMissFlag |
                         static_cast<std::uint32_t>(ordinal);
      if (sort_from > 0) atomicAdd(&bucket[v[j] >> shift], 1);
      if (fetch) fetch_token[ordinal] = v[j];
      if (hand_over_first) {
        miss_entry[ordinal] = static_cast<std::uint16_t>(my_entry++);
      } else if (early_plan && !fetch) {
        plan_token[ordinal] = v[j];
      }
      ++ordinal;
    }
  };
  auto find_evictable = [&](const std::int32_t(&v)[kItems], int t0, bool(&evictable)[kItems]) {
    int count = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int s = v[j];
      evictable[j] = t0 + mine + j < hot && ((hit_bits[s >> 5] >> (s & 31)) & 1u) == 0;
      count += evictable[j] ? 1 : 0;
    }
    return count;
  };
  // New order: untouched oldest first, then this step's misses, then the hits in their old order;
  // the m-th evictable slot goes to the m-th miss. e: evictable slots before this thread's.
  auto place_slots = [&](const std::int32_t(&v)[kItems], int t0, const bool(&evictable)[kItems],
                         int e) {
    const int n_evictable = hot - n_hit;
    const int n_untouched = n_evictable - n_miss;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int p = t0 + mine + j;
      if (p >= hot) continue;
      const auto slot = static_cast<std::uint16_t>(v[j]);
      if (!evictable[j]) {
        new_lru[n_evictable + (p - e)] = slot;
      } else {
        if (e < n_miss) {
          evict_slot[e] = slot;
          new_lru[n_untouched + e] = slot;
        } else {
          new_lru[e - n_miss] = slot;
        }
        ++e;
      }
    }
  };
  const bool one_phase = top_k <= tile && hot <= tile && !hand_over_first && fetch_rows == 0;
  if (one_phase) {  // counts < 2^16 each (top_k, hot <= tile), so one scan numbers both
    std::int32_t v[kItems];
    sel_tile(0, v);
    int h[kItems];
    bool miss[kItems], evictable[kItems];
    const int misses = find_misses(v, 0, h, miss);
    const int evictables = find_evictable(lru0, 0, evictable);
    int total = 0;
    const int before = scan.exclusive_sum((misses << 16) | evictables, total);
    n_miss = total >> 16;
    number_misses(v, 0, h, miss, before >> 16);
    place_slots(lru0, 0, evictable, before & 0xffff);
  } else {
    for (int t0 = 0; t0 < top_k; t0 += tile) {
      std::int32_t v[kItems];
      sel_tile(t0, v);
      int h[kItems];
      bool miss[kItems];
      const int count = find_misses(v, t0, h, miss);
      if (hand_over_first) {
        const int inclusive = warp_inclusive_sum(count, lane);
        int warp_first = 0;
        if (lane == 31 && inclusive > 0) warp_first = atomicAdd(&scratch[68], inclusive);
        my_entry = __shfl_sync(0xffffffffu, warp_first, 31) + inclusive - count;
        int at = my_entry;
#pragma unroll
        for (int j = 0; j < kItems; ++j)
          if (miss[j]) plan_token[at++] = v[j];
        __syncthreads();
        const int found = scratch[68];
        fetch = fetch_rows > 0 && found <= fetch_rows;
        if (!fetch && tid == 0) {
          a.plan.count[b] = found;
          if (a.plan.fetched) a.plan.fetched[b] = 0;
          publish_ready(a, b, 1);
        }
      }
      int total = 0;
      const int ordinal = n_miss + scan.exclusive_sum(count, total);
      // (hand_over_first decided it above, from the same count, before the scan)
      if (t0 == 0 && !hand_over_first)
        fetch = fetch_rows > 0 && top_k <= tile && total <= fetch_rows;
      number_misses(v, t0, h, miss, ordinal);
      n_miss += total;
    }
  }
  if (fetch || early_plan) __syncthreads();  // fetch tokens / plan tokens written
  if (early_plan && (!hand_over_first || fetch) && tid == 0) {
    a.plan.count[b] = n_miss;
    if (a.plan.fetched) a.plan.fetched[b] = fetch ? 1 : 0;
    publish_ready(a, b, 1);
  }
  if (fetch) {
    for (int u = tid; u < n_miss * units_per_row; u += nt) {
      const int m = u / units_per_row;
      cp_async16(staged + u, host_row0 +
                                 static_cast<std::size_t>(fetch_token[m]) * a.host_pool.row_stride +
                                 16 * static_cast<std::size_t>(u - m * units_per_row));
    }
    cp_async_commit();
  }
  phase_stamp<kTimed>(a, 5);

  // 4. Walk the LRU order (done above in one_phase).
  if (!one_phase) {
    int evictable_before = 0;
    for (int t0 = 0; t0 < hot; t0 += tile) {
      std::int32_t v[kItems];
      if (t0 == 0) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) v[j] = lru0[j];
      } else {
        load_items(lru, t0 + mine, hot, v);
      }
      bool evictable[kItems];
      int total = 0;
      const int e = evictable_before + scan.exclusive_sum(find_evictable(v, t0, evictable), total);
      place_slots(v, t0, evictable, e);
      evictable_before += total;
    }
  }
  phase_stamp<kTimed>(a, 6);

  // Grouped plan: each bucket's first plan index (exclusive scan of the bucket counts).
  const bool grouped = sort_from > 0 && n_miss >= sort_from;
  if (grouped) {
    // one_phase counted the buckets after its only scan: wait for every count (the separate LRU
    // walk's scans put the barrier there otherwise).
    if (one_phase) __syncthreads();
    int total = 0;
    const int c = tid < kSwapInBuckets ? bucket[tid] : 0;
    const int first = scan.exclusive_sum(c, total);
    if (tid < kSwapInBuckets) bucket[tid] = first;
  }
  __syncthreads();
  phase_stamp<kTimed>(a, 7);
  if (spec) {
    publish_entry_slots(a, b, r, base, my_ordinal, evict_slot, entry_slot, late_token, late_ordinal,
                        scratch[69], resident, resident_tokens);
  } else if (early_plan) {  // the copy kernel may store this row's gathered rows from here on
    if (!fetch)
      for (int m = tid; m < n_miss; m += nt)
        plan_slot[hand_over_first ? miss_entry[m] : m] = evict_slot[m];
    __syncthreads();
    if (tid == 0) publish_ready(a, b, 2);
  }

  // The fetched rows land in their evicted slots (evict_slot is complete after the barrier).
  if (fetch) {
    cp_async_wait_all();
    __syncthreads();
    std::uint8_t* rows = a.hot_buffer.rows;
    for (int u = tid; u < n_miss * units_per_row; u += nt) {
      const int m = u / units_per_row;
      const std::size_t row = static_cast<std::size_t>(base) + evict_slot[m];
      *reinterpret_cast<uint4*>(rows + row * a.hot_buffer.row_stride +
                                16 * static_cast<std::size_t>(u - m * units_per_row)) = staged[u];
    }
  }

  // 5. Commit the order, the slot table and the plan; output the physical rows.
  commit_lru(lru, new_lru, hot);
  for (int t0 = 0; t0 < top_k; t0 += tile) {
    std::int32_t v[kItems];
    sel_tile(t0, v);
    std::int32_t rows_out[kItems], slots_out[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = t0 + mine + j;
      std::int32_t& row = rows_out[j];
      row = -1;
      slots_out[j] = -1;
      if (i >= top_k) continue;
      const std::int32_t pos = v[j];
      if (pos >= 0 && pos < seq_len) {
        if (pos == newest) {
          row = base + hot;
        } else {
          const std::uint32_t w = table.vals[table.find(pos)];
          if (w & kMissFlag) {
            const int m = static_cast<int>(w & 0x7fffu);
            const int slot = evict_slot[m];
            row = base + slot;
            if ((w >> 16) == static_cast<std::uint32_t>(i)) {  // the first occurrence commits
              slots_out[j] = slot;
              if (resident) {  // token out, token in (distinct tokens: the atomics commute)
                const std::int32_t old = old_token ? old_token[slot] : slot_token[slot];
                if (old >= 0 && old < resident_tokens)
                  atomicAnd(resident + old / 32, ~(1u << (old % 32)));
                // spec: the bit is set by whoever stores the row (the copy kernel's guessing
                // block, or fetch_late_rows), never before the guess has read it.
                if (!spec && pos < resident_tokens) atomicOr(resident + pos / 32, 1u << (pos % 32));
              }
              slot_token[slot] = pos;
              if (!early_plan || fetch) {  // else already handed to the copy kernel
                const int at = grouped ? atomicAdd(&bucket[pos >> shift], 1) : m;
                plan_token[at] = pos;
                plan_slot[at] = slot;
              }
            }
          } else {
            row = base + static_cast<std::int32_t>(w & 0xffffu);
          }
        }
      }
    }
    store_items(out, t0 + mine, top_k, rows_out);
    if (entry_slot && !spec) store_items(entry_slot, t0 + mine, top_k, slots_out);
  }
  if (tid == 0) write_row_stats(a, b, valid - n_miss, n_miss, fetch);
  if (early && !early_plan && !spec) {  // a grouped plan is complete only now
    __syncthreads();
    if (tid == 0) publish_ready(a, b, 2);
  }
  phase_stamp<kTimed>(a, 8);
}

// resolve_general_row as a called function, for the compact kernel (ResolvePath::direct_compact):
// the general code then lies apart from the set-up and the lean path instead of between them
// (inlined, it is about 75 KB of the kernel's 132-147 KB of SASS, and the set-up jumps over
// about 64 KB to reach the lean path; ncu, H200). Only rows the lean path cannot take call it, so its
// call overhead and its reload of the first selection tile are paid on the rare path; as a called
// function it spills 142-156 B (ptxas), so a call whose rows are all long is slower here than on
// the inlined kernel. It declares the dynamic shared memory itself, so that its accesses stay
// shared-memory accesses.
template <bool kTimed, bool kSpec>
__device__ __noinline__ void resolve_general_row_apart(const SwapInArgs& a,
                                                       const ResolveShape& shape, int r,
                                                       std::int64_t seq_len, std::int32_t base) {
  extern __shared__ __align__(16) unsigned char smem[];
  const ResolveRowView row = resolve_row_view(a);
  std::int32_t sel0[kItems];
  load_items(row.sel, row.mine, row.top_k, sel0);
  resolve_general_row<kTimed, kSpec>(a, shape, smem, r, seq_len, base, sel0);
}

// The resolve of block b's row: padding rows and short sequences here, rows of the common shapes
// on the lean path (resolve_tile_row), the rest on the general path (resolve_general_row).
// kCompactSlots 0: both lean instances (4 and 8 slots per thread) and the general path inlined.
// kCompactSlots 4 or 8 (ResolvePath::direct_compact; the host picks it from hot): the lean
// instance of that many slots only, and the general path a called function, so that the code a
// call of the common shapes runs lies together: 30 KB of SASS (38 KB with kSpec) before the
// called function, against 132-147 KB for the inlined kernel (sm_90a, readelf).
// kTimed: phase stamps (diagnostic build; results unchanged). kSpec = shape.spec, a separate
// instance so that the other calls run the code they ran before the speculative gather (its
// register allocation cost them 1-2 us at batch 8-100 / 0.1%).
template <bool kTimed, bool kSpec, int kCompactSlots>
__device__ __forceinline__ void resolve_row(const SwapInArgs& a, const ResolveShape& shape) {
  phase_stamp<kTimed>(a, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the copy kernel's blocks be scheduled now; they wait for this grid (or, early hand-off,
  // for each row's flag) before reading the plan.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  extern __shared__ __align__(16) unsigned char smem[];
  const auto [b, tid, nt, top_k, hot, tile, mine, sel, out, entry_slot] = resolve_row_view(a);
  const bool early = shape.early;

  // Independent loads first (all sized by batch, so reading them for a padding row is safe).
  const int num_real = *a.num_real;
  const int r = a.request_of_row ? a.request_of_row[b] : b;
  const std::int64_t seq_len = row_seq_len(a, b);
  std::int32_t sel0[kItems];
  load_items(sel, mine, top_k, sel0);

  if (b >= num_real) {  // padding row (uniform across the block)
    for (int i = tid; i < top_k; i += nt) {
      out[i] = -1;
      if (entry_slot) entry_slot[i] = -1;
    }
    if (tid == 0) {
      write_row_stats(a, b, 0, 0);
      if (early) publish_ready(a, b, 2);
    }
    phase_stamp<kTimed>(a, kSwapInPhaseStamps - 1);
    return;
  }
  const std::int32_t base = r * (hot + 1);

  if (seq_len <= hot) {  // short sequence: token t in slot t
    BlockScan scan(resolve_smem(smem, shape.direct_tokens, top_k, hot).scratch);
    int my_valid = 0;
    for (int t0 = 0; t0 < top_k; t0 += tile) {
      std::int32_t v[kItems];
      selection_tile(sel, t0, mine, top_k, sel0, v);
      std::int32_t rows_out[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const bool ok = v[j] >= 0 && v[j] < seq_len;
        my_valid += ok ? 1 : 0;
        rows_out[j] = ok ? base + v[j] : -1;
      }
      store_items(out, t0 + mine, top_k, rows_out);
      if (entry_slot) store_items(entry_slot, t0 + mine, top_k, {-1, -1, -1, -1});
    }
    int valid = 0;
    scan.exclusive_sum(my_valid, valid);
    if (tid == 0) {
      write_row_stats(a, b, valid, 0);
      if (early) publish_ready(a, b, 2);
    }
    phase_stamp<kTimed>(a, kSwapInPhaseStamps - 1);
    return;
  }

  // The common shapes take the lean path (results identical; shape.lean implies the direct
  // table).
  constexpr int kMaxSlots = kCompactSlots > 0 ? kCompactSlots : 2 * kItems;
  if (shape.lean && seq_len <= shape.direct_tokens && top_k <= tile &&
      hot <= kMaxSlots / kItems * tile && shape.fetch_rows == 0) {
    if constexpr (kCompactSlots > 0) {
      resolve_tile_row<kTimed, kSpec, kCompactSlots>(a, shape, smem, b, r,
                                                     static_cast<int>(seq_len), base, sel0);
    } else if (hot <= tile) {
      resolve_tile_row<kTimed, kSpec, kItems>(a, shape, smem, b, r, static_cast<int>(seq_len), base,
                                              sel0);
    } else {
      resolve_tile_row<kTimed, kSpec, 2 * kItems>(a, shape, smem, b, r, static_cast<int>(seq_len),
                                                  base, sel0);
    }
    return;
  }
  if constexpr (kCompactSlots > 0) {
    resolve_general_row_apart<kTimed, kSpec>(a, shape, r, seq_len, base);
  } else {
    resolve_general_row<kTimed, kSpec>(a, shape, smem, r, seq_len, base, sel0);
  }
}

template <bool kTimed, bool kSpec>
__global__ void __launch_bounds__(cfg::kResolveThreads, 1)
    swap_in_resolve(SwapInArgs a, ResolveShape shape) {
  resolve_row<kTimed, kSpec, 0>(a, shape);
}

// __grid_constant__: the called general path reads the arguments where the launch put them.
// Without it they are copied to the stack for the call (400-440 B of stack frame and up to 44 B
// of spills, ptxas sm_90a); on the inlined kernel it changed the code (8 B of spills with kSpec).
template <bool kTimed, bool kSpec, int kSlots>
__global__ void __launch_bounds__(cfg::kResolveThreads, 1)
    swap_in_resolve_compact(__grid_constant__ const SwapInArgs a,
                            __grid_constant__ const ResolveShape shape) {
  resolve_row<kTimed, kSpec, kSlots>(a, shape);
}

template <int W>
struct VecOf;
template <>
struct VecOf<16> {
  using type = uint4;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<4> {
  using type = unsigned int;
};
template <>
struct VecOf<2> {
  using type = unsigned short;
};
template <>
struct VecOf<1> {
  using type = unsigned char;
};

// Sum over rows of ceil(count / rows_per_chunk): the chunks a chunk size gives (warp 0 only).
__device__ __forceinline__ int chunks_for(const int* counts, int batch, int rows_per_chunk) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  int chunks = 0;
  for (int c = lane; c < batch; c += 32)
    chunks += (counts[c] + rows_per_chunk - 1) / rows_per_chunk;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) chunks += __shfl_xor_sync(0xffffffffu, chunks, o);
  return chunks;
}

// Copies `rows` host rows of request r, tokens[i] into slot slots[i] (skipped when negative), with
// one block. The host loads of the first round are issued before `before_stores` runs (it may
// wait for the resolve and fill `slots`; every thread calls it).
template <int W, class BeforeStores>
__device__ __forceinline__ void copy_rows(const SwapInArgs& a, int r, const std::int32_t* tokens,
                                          const std::int32_t* slots, int rows,
                                          BeforeStores&& before_stores) {
  using Vec = typename VecOf<W>::type;
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  const auto units_per_row = static_cast<unsigned>(a.copy_bytes / W);
  const std::uint8_t* host =
      a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride;
  std::uint8_t* dst = a.hot_buffer.rows + static_cast<std::size_t>(r) *
                                              static_cast<std::size_t>(a.hot + 1) *
                                              a.hot_buffer.row_stride;
  const unsigned units = static_cast<unsigned>(rows) * units_per_row;
  const auto step = static_cast<unsigned>(nt * cfg::kCopyUnroll);

  // Rounds of kCopyUnroll vectors per thread: the host loads of a round are issued before
  // the slots are read, so with the early hand-off the first round is in flight while the
  // resolve finishes its LRU walk.
  Vec v[cfg::kCopyUnroll];
  auto load = [&](unsigned u0) {
#pragma unroll
    for (int j = 0; j < cfg::kCopyUnroll; ++j) {
      const unsigned u = u0 + static_cast<unsigned>(j * nt);
      if (u < units) {
        const unsigned row = u / units_per_row;
        v[j] = *reinterpret_cast<const Vec*>(
            host + static_cast<std::size_t>(tokens[row]) * a.host_pool.row_stride +
            static_cast<std::size_t>(u - row * units_per_row) * W);
      }
    }
  };
  auto store = [&](unsigned u0) {
#pragma unroll
    for (int j = 0; j < cfg::kCopyUnroll; ++j) {
      const unsigned u = u0 + static_cast<unsigned>(j * nt);
      if (u < units) {
        const unsigned row = u / units_per_row;
        const std::int32_t slot = slots[row];
        if (slot >= 0)
          *reinterpret_cast<Vec*>(dst + static_cast<std::size_t>(slot) * a.hot_buffer.row_stride +
                                  static_cast<std::size_t>(u - row * units_per_row) * W) = v[j];
      }
    }
  };
  auto u0 = static_cast<unsigned>(tid);
  load(u0);
  before_stores();
  for (; u0 < units; u0 += step) {
    if (u0 != static_cast<unsigned>(tid)) load(u0);
    store(u0);
  }
}

// Rows first_row .. first_row + rows - 1 of row b's plan (one chunk, one block). With the early
// hand-off the slots are read once the row reaches 2, after the first round's host loads.
template <int W>
__device__ __forceinline__ void copy_chunk(const SwapInArgs& a, int b, int r, int first_row,
                                           int rows, bool early) {
  const std::size_t at = static_cast<std::size_t>(b) * a.top_k + first_row;
  copy_rows<W>(a, r, a.plan.token + at, a.plan.slot + at, rows, [&] {
    if (early) {
      if (threadIdx.x == 0) wait_ready(a.plan.ready + b, 2);
      __syncthreads();
    }
  });
}

// Appends `token` (with `value`) to a block's shared list when `take`; all threads must call it.
__device__ __forceinline__ void list_append(bool take, std::int32_t token, std::int32_t value,
                                            std::int32_t* tokens, std::int32_t* values,
                                            int* count) {
  const unsigned taken = __ballot_sync(0xffffffffu, take);
  const int lane = static_cast<int>(threadIdx.x & 31);
  int first = 0;
  if (lane == 0 && taken != 0) first = atomicAdd(count, __popc(taken));
  first = __shfl_sync(0xffffffffu, first, 0);
  if (take) {
    const int at = first + __popc(taken & ((1u << lane) - 1u));
    tokens[at] = token;
    values[at] = value;
  }
}

// Speculative gather (the early hand-off with MissPlan::entry_slot and a residency bitmap): block
// k serves row k % batch, a contiguous share of its selection entries. At once, without waiting
// for the resolve, it loads the host rows of the selected tokens the bitmap calls not resident;
// once the row reaches 2 it stores those that entry_slot names (the first occurrences of the
// misses) and sets their bits. A block that guessed nothing leaves at once. Misses whose bit was
// set (a stale bitmap) are the resolve's (fetch_late_rows): a stale hint costs time, never bytes.
template <int W>
__device__ __forceinline__ void copy_speculative(const SwapInArgs& a) {
  __shared__ std::int32_t list_token[cfg::kCopyThreads], list_value[cfg::kCopyThreads];
  __shared__ int list_count;
  const int batch = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  const RowBlocks share = row_blocks(batch);
  const int b = share.row;
  const int per = (a.top_k + share.blocks - 1) / share.blocks;
  const int first = share.index * per;
  const int last = min(a.top_k, first + per);
  // Padding rows and short rows fetch nothing (uniform across the block).
  const std::int64_t seq_len = row_seq_len(a, b);
  if (b >= *a.num_real || seq_len <= a.hot || first >= last) return;
  const int r = a.request_of_row ? a.request_of_row[b] : b;
  const std::int32_t* sel = a.selected + static_cast<std::size_t>(b) * a.top_k;
  const std::int32_t* entry_slot = a.plan.entry_slot + static_cast<std::size_t>(b) * a.top_k;
  std::uint32_t* resident =
      a.hot_buffer.resident + static_cast<std::size_t>(r) * a.hot_buffer.resident_words;
  const auto resident_tokens = static_cast<std::int64_t>(32 * a.hot_buffer.resident_words);
  bool waited = false;
  for (int e0 = first; e0 < last; e0 += nt) {  // one pass unless a block has > nt entries
    const int e = e0 + tid;
    const std::int32_t pos = e < last ? sel[e] : -1;
    // Valid, not the newest (it has its own slot), and not resident as far as the bitmap knows.
    // The resolve clears bits meanwhile, only of tokens no entry selects: an L2 load.
    const bool guess = pos >= 0 && pos < seq_len - 1 && pos < resident_tokens &&
                       ((__ldcg(resident + pos / 32) >> (pos % 32)) & 1u) == 0;
    if (tid == 0) list_count = 0;
    __syncthreads();
    list_append(guess, pos, e, list_token, list_value, &list_count);
    __syncthreads();
    const int listed = list_count;
    if (listed == 0) continue;  // nothing guessed: no need to wait for the resolve
    copy_rows<W>(a, r, list_token, list_value, listed, [&] {
      if (!waited) {  // entry_slot is written once the row reaches 2
        if (tid == 0) wait_ready(a.plan.ready + b, 2);
        __syncthreads();
        waited = true;
      }
      if (tid < listed) list_value[tid] = entry_slot[list_value[tid]];  // entry -> slot or -1
      __syncthreads();
    });
    if (tid < listed && list_value[tid] >= 0)  // stored: now resident
      atomicOr(resident + list_token[tid] / 32, 1u << (list_token[tid] % 32));
    __syncthreads();  // the lists are reused
  }
}

// Copy blocks with the early hand-off, one block per row at least: a fixed map from blocks to
// chunks, so that a block waits for its own row only and needs no prefix of every row's count.
// Each block takes its row's chunks index, index + blocks, ... (row_blocks).
template <int W>
__device__ __forceinline__ void copy_fixed_map(const SwapInArgs& a) {
  const RowBlocks share = row_blocks(a.batch);
  const int b = share.row;
  const int r = a.request_of_row ? a.request_of_row[b] : b;  // read while the resolve runs
  if (threadIdx.x == 0) wait_ready(a.plan.ready + b, 1);  // the row's count and tokens are written
  __syncthreads();
  const int count = a.plan.fetched && a.plan.fetched[b] ? 0 : a.plan.count[b];
  const int rows_per = a.copy_rows_per_chunk;
  for (int c = share.index; c * rows_per < count; c += share.blocks)
    copy_chunk<W>(a, b, r, c * rows_per, min(rows_per, count - c * rows_per), true);
}

// Copy blocks otherwise: every block reads every row's count, numbers the chunks of all rows
// (a prefix over the rows) and takes chunks blockIdx.x, blockIdx.x + grid, ...
template <int W>
__device__ __forceinline__ void copy_numbered_chunks(const SwapInArgs& a, bool early,
                                                     int* chunk_start) {
  __shared__ int rows_per_chunk;
  const int batch = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int grid = static_cast<int>(gridDim.x);
  if (tid < 32) {
    // Chunk size: the smallest that gives at most one chunk per block, so that no block copies
    // a second chunk after the others are done (at batch 100 a second wave cost up to 2x).
    int total = 0;
    for (int c = tid; c < batch; c += 32) {
      if (early) wait_ready(a.plan.ready + c, 1);  // the row's count and tokens are written
      chunk_start[c] = a.plan.fetched && a.plan.fetched[c] ? 0 : a.plan.count[c];
      total += chunk_start[c];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    __syncwarp();
    int lo = total > 0 ? max(1, (total + grid - 1) / grid) : 1;
    int hi = max(lo, a.top_k);
    if (a.copy_rows_per_chunk > 0) {
      lo = a.copy_rows_per_chunk;
    } else if (total > 0 && chunks_for(chunk_start, batch, hi) <= grid) {
      while (lo < hi) {  // chunks_for is non-increasing in the chunk size
        const int mid = (lo + hi) / 2;
        if (chunks_for(chunk_start, batch, mid) <= grid) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
    }
    const int rows = lo;
    int running = 0;
    for (int c = 0; c < batch; c += 32) {
      const int n = c + tid < batch ? chunk_start[c + tid] : 0;
      __syncwarp();
      const int chunks = (n + rows - 1) / rows;
      const int inclusive = warp_inclusive_sum(chunks, tid);
      if (c + tid < batch) chunk_start[c + tid] = running + inclusive - chunks;
      running += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (tid == 0) {
      chunk_start[batch] = running;
      rows_per_chunk = rows;
    }
  }
  __syncthreads();
  const int total_chunks = chunk_start[batch];
  const int rows_per = rows_per_chunk;

  for (int k = static_cast<int>(blockIdx.x); k < total_chunks; k += grid) {
    int lo = 0, hi = batch;  // chunk_start[lo] <= k < chunk_start[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (chunk_start[mid] <= k) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int b = lo;
    const int first_row = (k - chunk_start[b]) * rows_per;
    const int rows = min(rows_per, a.plan.count[b] - first_row);
    copy_chunk<W>(a, b, a.request_of_row ? a.request_of_row[b] : b, first_row, rows, early);
  }
}

template <int W, bool kSpec>
__global__ void __launch_bounds__(cfg::kCopyThreads, cfg::kCopyBlocksPerSm)
    swap_in_copy(SwapInArgs a, bool early) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Early hand-off (MissPlan::ready): rows are taken as the resolve publishes them, not after
  // the whole resolve grid.
  if (!early) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  extern __shared__ int chunk_start[];  // [batch + 1]; first the counts
  const int batch = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int grid = static_cast<int>(gridDim.x);
  if constexpr (kSpec) {
    copy_speculative<W>(a);
  } else if (early && a.copy_rows_per_chunk > 0 && grid >= batch) {
    copy_fixed_map<W>(a);
  } else {
    copy_numbered_chunks<W>(a, early, chunk_start);
  }
  if (early) {
    // The last block to finish waits until every row has published its slots (so no flag can
    // still rise after it), then resets the flags for the next call.
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      if (atomicAdd(a.plan.ready + batch, 1) == grid - 1) {
        for (int c = 0; c < batch; ++c) wait_ready(a.plan.ready + c, 2);
        for (int c = 0; c < batch; ++c) a.plan.ready[c] = 0;
        a.plan.ready[batch] = 0;
      }
    }
  }
}

int vector_width(const SwapInArgs& a) {
  const std::size_t g = a.copy_bytes | a.host_pool.request_stride | a.host_pool.row_stride |
                        a.hot_buffer.row_stride |
                        reinterpret_cast<std::uintptr_t>(a.host_pool.base) |
                        reinterpret_cast<std::uintptr_t>(a.hot_buffer.rows);
  int w = 16;
  while (w > 1 && (g % static_cast<std::size_t>(w)) != 0) w /= 2;
  return w;
}

template <int W>
void launch_copy(const SwapInArgs& a, int blocks, bool early, bool spec, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(blocks));
  const auto shared = static_cast<std::size_t>(a.batch + 1) * sizeof(int);
  launch_dependent(spec ? swap_in_copy<W, true> : swap_in_copy<W, false>, grid,
                   dim3(cfg::kCopyThreads), shared, stream, a.use_pdl, a, early);
}

// Bytes of the old-token array (one int per hot slot, 16-B aligned).
std::size_t old_token_bytes(int hot) {
  return (4 * static_cast<std::size_t>(hot) + 15) / 16 * 16;
}

// Blocks of the copy kernel: SwapInArgs::copy_blocks, or from the SM count and the batch. The
// large grid's waves serve the miss-plan copy of large calls; a speculative call (fewer than
// kSpeculativeGatherBelow rows) keeps the small grid, whose blocks each take a share of one
// row's selection (figures in swap_in_config.hpp).
int copy_grid(const SwapInArgs& a, bool spec) {
  if (a.copy_blocks > 0) return a.copy_blocks;
  const int sms = multiprocessors();
  const bool large = a.batch >= cfg::kLargeBatch && !spec;
  return sms * (large ? cfg::kCopyGridPerSmLarge : cfg::kCopyBlocksPerSm);
}

// Speculative gather: with the early hand-off, an entry_slot array, a residency bitmap, a
// selection of one tile (entry_slot is then written straight after the LRU walk) and at least
// one copy block per row (copy_speculative gives each block a share of one row).
bool speculative(const SwapInArgs& a, bool early) {
  return early && a.plan.entry_slot != nullptr && a.hot_buffer.resident != nullptr &&
         a.top_k <= cfg::kResolveThreads * cfg::kResolveItems && copy_grid(a, true) >= a.batch;
}

ResolveShape resolve_shape(const SwapInArgs& a, bool early) {
  ResolveShape shape;
  shape.shared_bytes = swap_in_shared_bytes(a.top_k, a.hot);
  shape.early = early;
  shape.spec = speculative(a, early);
  if (a.resolve != ResolvePath::hash) {
    const std::size_t bytes = swap_in_direct_shared_bytes(a.top_k, a.hot);
    if (bytes <= static_cast<std::size_t>(cfg::kMaxResolveSharedBytes)) {
      shape.direct_tokens = cfg::kResolveDirectTokens;
      shape.shared_bytes = bytes;
      shape.lean = a.resolve != ResolvePath::direct_general;
    }
  }
  // Fetching in the resolve needs whole 16-B pieces, one tile of selection (the miss count is
  // known after one block scan) and spare shared memory. It pays at small batch only: at batch 64
  // the blocks' concurrent host reads made the call slower (0.1% miss 19.2 -> 22.9 us, 1% 35.7 ->
  // 55.3 us; reports/hotcache_tuning.md), while batch 1 gains 3 us.
  const std::size_t room = static_cast<std::size_t>(cfg::kMaxResolveSharedBytes) -
                           std::min<std::size_t>(shape.shared_bytes, cfg::kMaxResolveSharedBytes);
  // With the speculative gather the copy kernel has the rows in flight before the resolve could.
  if (a.plan.fetched && !shape.spec && a.batch < cfg::kLargeBatch && a.copy_bytes > 0 &&
      vector_width(a) == 16 && a.top_k <= cfg::kResolveThreads * cfg::kResolveItems) {
    // Per row: its bytes plus one token (4 B, padded once to 16).
    const std::size_t bytes = std::min<std::size_t>(room, cfg::kResolveFetchBytes);
    shape.fetch_rows = bytes > 16 ? static_cast<int>((bytes - 16) / (a.copy_bytes + 4)) : 0;
    shape.fetch_offset = static_cast<int>(shape.shared_bytes);
    shape.shared_bytes += static_cast<std::size_t>(shape.fetch_rows * 4 + 15) / 16 * 16 +
                          static_cast<std::size_t>(shape.fetch_rows) * a.copy_bytes;
  }
  if (shape.spec) {  // the late misses' tokens and ordinals (fetch_late_rows)
    shape.fetch_offset = static_cast<int>(shape.shared_bytes);
    shape.shared_bytes += (8 * static_cast<std::size_t>(a.top_k) + 15) / 16 * 16;
  }
  // The residency bitmap's updates read each evicted slot's old token from shared memory when
  // there is room (else from slot_token, one device-memory round trip more in the commit).
  if (a.hot_buffer.resident && shape.shared_bytes + old_token_bytes(a.hot) <=
                                   static_cast<std::size_t>(cfg::kMaxResolveSharedBytes)) {
    shape.old_token_offset = static_cast<int>(shape.shared_bytes);
    shape.shared_bytes += old_token_bytes(a.hot);
  }
  return shape;
}

// Every instance of the resolve kernel: [2 * timed + spec][compact slots / 4].
using ResolveKernel = void (*)(SwapInArgs, ResolveShape);
template <bool kTimed, bool kSpec>
constexpr std::array<ResolveKernel, 3> kResolveBySlots = {
    swap_in_resolve<kTimed, kSpec>, swap_in_resolve_compact<kTimed, kSpec, 4>,
    swap_in_resolve_compact<kTimed, kSpec, 8>};
constexpr std::array<std::array<ResolveKernel, 3>, 4> kResolveKernels = {
    kResolveBySlots<false, false>, kResolveBySlots<false, true>, kResolveBySlots<true, false>,
    kResolveBySlots<true, true>};
ResolveKernel resolve_instance(bool timed, bool spec, int compact_slots) {
  return kResolveKernels[(timed ? 2 : 0) + (spec ? 1 : 0)][compact_slots / 4];
}
// The compact instance's slots per thread, where the lean path may run at all (else it would
// only add a call): for ResolvePath::direct_compact, and for direct when every row is known to
// fit the direct table (SwapInArgs::max_seq_len), so that no row takes the compact kernel's
// slower called general path. 0 for the inlined kernel.
int compact_slots(const SwapInArgs& a, const ResolveShape& shape) {
  constexpr int kTile = cfg::kResolveThreads * cfg::kResolveItems;
  const bool rows_fit = a.max_seq_len > 0 && a.max_seq_len <= shape.direct_tokens;
  const bool compact =
      a.resolve == ResolvePath::direct_compact || (a.resolve == ResolvePath::direct && rows_fit);
  if (!compact || !shape.lean || shape.fetch_rows > 0 || a.top_k > kTile || a.hot > 2 * kTile)
    return 0;
  return a.hot <= kTile ? kItems : 2 * kItems;
}
}  // namespace

void configure_swap_in(int top_k, int hot) {
  // Enough for either resolve path, so a graph captured later may use both.
  SwapInArgs probe;
  probe.top_k = top_k;
  probe.hot = hot;
  probe.resolve = ResolvePath::direct;  // the larger of the two paths, whatever the default is
  std::size_t needed = swap_in_shared_bytes(top_k, hot);
  needed = std::max(needed, resolve_shape(probe, false).shared_bytes);
  // Room for the rows the resolve may fetch itself (MissPlan::fetched), whatever their size, and
  // for the old-token array of the residency bitmap.
  needed = std::min<std::size_t>(needed + cfg::kResolveFetchBytes + old_token_bytes(hot),
                                 cfg::kMaxResolveSharedBytes);
  // One lookup per call rather than one per resolve instance (12): the limit every instance got
  // on this device (allow_dynamic_shared never lowers one).
  static std::mutex configured_mutex;
  static std::map<int, std::size_t> configured;  // device -> bytes allowed to every instance
  int device = 0;
  HISPARSE_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(configured_mutex);
  std::size_t& allowed = configured[device];
  if (needed <= allowed) return;
  for (const auto& by_slots : kResolveKernels)
    for (const ResolveKernel kernel : by_slots) allow_dynamic_shared(kernel, needed);
  allowed = needed;
}

namespace {
// Whether launch_swap_in uses the early hand-off. It pays where latency matters (small batch); at
// large batch the copy is bound by host page translation and its blocks would only wait beside
// the resolve.
bool early_handoff(const SwapInArgs& a) {
  const int early_below =
      speculative(a, true) ? cfg::kSpeculativeGatherBelow : cfg::kEarlyHandoffBelow;
  return a.plan.ready != nullptr && a.batch < early_below;
}

void resolve_launch(const SwapInArgs& a, bool early, cudaStream_t stream) {
  if (a.batch <= 0 || a.top_k <= 0) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  HISPARSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) configure_swap_in(a.top_k, a.hot);
  const auto blocks = static_cast<unsigned>(a.batch);
  const ResolveShape shape = resolve_shape(a, early);
  const ResolveKernel resolve =
      resolve_instance(a.phase_stamps != nullptr, shape.spec, compact_slots(a, shape));
  resolve<<<blocks, cfg::kResolveThreads, shape.shared_bytes, stream>>>(a, shape);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void copy_launch(const SwapInArgs& args, bool early, cudaStream_t stream) {
  const bool spec = speculative(args, early);
  if (args.batch <= 0 || args.top_k <= 0) return;
  SwapInArgs a = args;
  if (a.copy_rows_per_chunk < 0) a.copy_rows_per_chunk = cfg::kCopyRowsPerChunk;
  const int blocks = copy_grid(a, spec);
  switch (vector_width(a)) {
    case 16:
      launch_copy<16>(a, blocks, early, spec, stream);
      break;
    case 8:
      launch_copy<8>(a, blocks, early, spec, stream);
      break;
    case 4:
      launch_copy<4>(a, blocks, early, spec, stream);
      break;
    case 2:
      launch_copy<2>(a, blocks, early, spec, stream);
      break;
    default:
      launch_copy<1>(a, blocks, early, spec, stream);
      break;
  }
}
}  // namespace

void launch_swap_in_resolve(const SwapInArgs& a, cudaStream_t stream) {
  resolve_launch(a, false, stream);
}

void launch_swap_in_copy(const SwapInArgs& args, cudaStream_t stream) {
  copy_launch(args, false, stream);
}

void launch_swap_in(const SwapInArgs& a, cudaStream_t stream) {
  const bool early = early_handoff(a);
  resolve_launch(a, early, stream);
  copy_launch(a, early, stream);
}

std::string swap_in_resolve_kernel(const SwapInArgs& a) {
  const ResolveShape shape = resolve_shape(a, early_handoff(a));
  const int slots = compact_slots(a, shape);
  return slots > 0 ? "swap_in_resolve_compact<" + std::to_string(slots) + ">" : "swap_in_resolve";
}

}  // namespace hisparse::kernels
