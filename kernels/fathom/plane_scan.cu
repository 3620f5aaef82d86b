#include "kernels/fathom/plane_scan.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_fp16.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/block_scan.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dynamic_shared.hpp"
#include "kernels/common/shared_layout.hpp"
#include "kernels/fathom/depth_plan_warp.cuh"
#include "kernels/fathom/plane_scan_config.hpp"
#include "kernels/fathom/plane_scan_fragments.hpp"
#include "kernels/fathom/plane_stage.cuh"

namespace hisparse::kernels::fathom {
namespace {

/// v, as a value the compiler cannot see through: what depends on it is not computed before the
/// point where it is read (an empty volatile asm is never moved or speculated).
__device__ __forceinline__ std::int64_t opaque(std::int64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

// Shared scratch (ScanSharedPlan::scratch, FinalizeSmem::scratch: 128 ints) of the selection
// helpers: ints [0, 2) compact_top's digit search, [2, 4) its prefix, [4, 6) the merge kernel's
// threshold, then a BlockScan.
constexpr int kScratchPrefix = 2, kScratchThreshold = 4, kScratchScan = 8;
static_assert(kScratchScan + kBlockScanScratchInts <= 128);

// Keeps the `keep` largest of the `*count` unique keys in buf (ordered in-place compaction after an
// MSB radix select of up to 8 passes, stopping at the first digit whose keys are all kept);
// returns a threshold: every kept key is >= it and every dropped key below it. All threads of the
// block must call it.
template <int THREADS>
__device__ std::uint64_t compact_top(std::uint64_t* buf, int* count, int keep, int* hist,
                                     int* scratch) {
  const int n = *count;
  std::uint64_t prefix = 0, mask = 0;
  int remaining = keep;
  auto* shared_u64 = reinterpret_cast<std::uint64_t*>(scratch + kScratchPrefix);
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += THREADS) hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS) {
      const std::uint64_t key = buf[i];
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // digit search: warp 0 scans the 256 bins from the top, 8 per lane
      const int lane = threadIdx.x, top = 255 - 8 * lane;
      int mine = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) mine += hist[top - i];
      const int inclusive = warp_inclusive_sum(mine, lane);
      const int before = inclusive - mine;
      const bool here = before < remaining && inclusive >= remaining;
      const int total = __shfl_sync(0xffffffffu, inclusive, 31);
      if (__ballot_sync(0xffffffffu, here) == 0u) {
        if (lane == 0) {  // fewer keys than asked for (not reached: callers hold more)
          shared_u64[0] = prefix;
          scratch[0] = remaining - total;
          scratch[1] = 1;
        }
      } else if (here) {
        int above = before, digit = top - 7;
        for (int i = 0; i < 8; ++i) {
          if (above + hist[top - i] >= remaining) {
            digit = top - i;
            break;
          }
          above += hist[top - i];
        }
        shared_u64[0] = prefix | (static_cast<std::uint64_t>(digit) << shift);
        scratch[0] = remaining - above;
        // Every key with this digit is kept: the lower digits need no passes.
        scratch[1] = hist[digit] == remaining - above ? 1 : 0;
      }
    }
    __syncthreads();
    // No barrier after these reads: the next pass writes them only after two more barriers, and
    // it clears `hist` after warp 0 has read it (before the barrier above).
    prefix = shared_u64[0];
    remaining = scratch[0];
    const bool whole_digit = scratch[1] != 0;
    mask |= std::uint64_t{255} << shift;
    if (whole_digit) break;
  }
  const std::uint64_t kth = prefix;
  // Compaction, kCompactPerThread keys per thread and round (one block scan per round). The
  // scan's barriers order a round's reads before its writes, and every write lands below the
  // next round's first key: no barrier of its own. The kept keys keep no particular order.
  constexpr int kCompactPerThread = 4;
  BlockScan scan(scratch + kScratchScan);
  int out = 0;
  for (int base = 0; base < n; base += kCompactPerThread * THREADS) {
    std::uint64_t keys[kCompactPerThread];
    int mine = 0;
#pragma unroll
    for (int j = 0; j < kCompactPerThread; ++j) {
      const int i = base + j * THREADS + static_cast<int>(threadIdx.x);
      keys[j] = i < n ? buf[i] : 0;
      mine += i < n && keys[j] >= kth ? 1 : 0;
    }
    int total = 0;
    int at = out + scan.exclusive_sum(mine, total);
#pragma unroll
    for (int j = 0; j < kCompactPerThread; ++j) {
      const int i = base + j * THREADS + static_cast<int>(threadIdx.x);
      if (i < n && keys[j] >= kth) buf[at++] = keys[j];
    }
    out += total;
  }
  if (threadIdx.x == 0) *count = out;
  __syncthreads();
  return kth;
}

// out[0] = the score of the smallest of `count` selection keys when count >= keep (else NaN),
// out[1] = the score of the largest (NaN when count is 0): a head's (keep-th, top) selected
// scores (PlaneScanArgs::score_range). `slots`: 2 shared words. All threads of the block call it.
template <int THREADS>
__device__ void write_score_range(const std::uint64_t* keys, int count, int keep,
                                  unsigned long long* slots, float* out) {
  if (threadIdx.x == 0) {
    slots[0] = ~0ull;
    slots[1] = 0;
  }
  __syncthreads();
  unsigned long long lo = ~0ull, hi = 0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += THREADS) {
    lo = min(lo, static_cast<unsigned long long>(keys[i]));
    hi = max(hi, static_cast<unsigned long long>(keys[i]));
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (threadIdx.x % 32 == 0 && hi != 0) {
    atomicMin(&slots[0], lo);
    atomicMax(&slots[1], hi);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float nan = __int_as_float(0x7fc00000);
    out[0] =
        count > 0 && count >= keep ? key_to_float(static_cast<std::uint32_t>(slots[0] >> 32)) : nan;
    out[1] = count > 0 ? key_to_float(static_cast<std::uint32_t>(slots[1] >> 32)) : nan;
  }
  __syncthreads();  // the slots may be reused
}

// A word of two consecutive blocks' fp16 scales with the halves of blocks from `live` on (the
// blocks past a stream's end, counted from the word's first block) cleared: fp16 0 converts to
// scale 0, so the scoring records and the staged prep clear a stream's end once instead of
// testing every block.
__device__ __forceinline__ std::uint32_t live_scale_pair(std::uint32_t word, int live) {
  return live <= 0 ? 0u : live == 1 ? word & 0xffffu : word;
}

// fp16 scale to float with the hardware conversion: exact for every finite value, so it equals
// the twin's f16_to_float; a NaN stays a NaN, and quantize_weight maps NaN products to 0 either
// way.
__device__ __forceinline__ float scale_value(std::uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// Spins (one thread) until a staging round is published: every one of the `parts` copy blocks
// of the stream added 1 with release semantics after its stores (PlaneStaging). The acquire load
// and the block barrier that follows make the round's bytes visible to every thread's cp.async
// (which reads L2).
__device__ __forceinline__ void wait_landed(const std::int32_t* flag, int parts) {
  int v = 0;
  while (true) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v >= parts) return;
    __nanosleep(200);
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Seeded selection: calls visit(stream, rank) on the thread that holds each stream whose seed
// was not proven (seed_proven), rank being its place among them in stream order, and returns
// how many there are. Every thread of the block calls it; `scratch` holds a BlockScan, and the
// block has passed a barrier on return.
template <class Visit>
__device__ int for_each_unproven(const PlaneScanArgs& a, const PlaneScanWorkspace& ws, int* scratch,
                                 Visit visit) {
  BlockScan scan(scratch);
  const int threads = static_cast<int>(blockDim.x);
  int unproven = 0;
  for (int s0 = 0; s0 < a.streams; s0 += threads) {
    const int s = s0 + static_cast<int>(threadIdx.x);
    const bool flag = s < a.streams && !seed_proven(a, ws.seed_hits, s);
    int total = 0;
    const int rank = scan.exclusive_count(flag, total);
    if (flag) visit(s, unproven + rank);
    unproven += total;
  }
  __syncthreads();
  return unproven;
}

// The 8-bit weights of one head in one scale group, by one warp, one lane per slot: the
// shift that puts the group's largest |q x group scale| in [64, 128), then each slot's weight
// at weight_index (zeros from `slots` to `slots_read`). Returns the shift. Shared by the
// scoring records and the staged prep, so that both give the same bits. UNROLL keeps each
// caller's code as it was: the records' loops by 4 (what nvcc chose there), the staged prep's not
// at all (unrolled, its instances spilled 44 bytes more; ptxas -v, 2026-12-04).
template <int UNROLL>
__device__ __forceinline__ int write_head_weights(const float* q, const float* group_scales,
                                                  int slots, int slots_read, int sp, int h,
                                                  int lane, std::int8_t* weights) {
  float max_abs = 0.0f;
#pragma unroll(UNROLL)
  for (int sl = lane; sl < slots; sl += 32)
    max_abs = fmaxf(max_abs, fabsf(q[sl] * group_scales[sl]));
  const int shift =
      weight_shift(detail::bits_float(__reduce_max_sync(0xffffffffu, detail::float_bits(max_abs))));
#pragma unroll(UNROLL)
  for (int sl = lane; sl < slots_read; sl += 32)
    weights[mma::weight_index(h, sl, sp)] =
        static_cast<std::int8_t>(sl < slots ? quantize_weight(q[sl] * group_scales[sl], shift) : 0);
  return shift;
}

// What the scan needs per scale group (slots ordered, queries of the block's stream in shared
// memory), for write_group_record.
struct GroupRecordInputs {
  const int* slot_channel;
  const std::uint8_t* magnitudes;  ///< [slot] |o| of the slot's depth
  const float* queries;            ///< [heads_pad][slots_pad]
  int slots, scaled, slots_read, heads_pad;
};

// The constant terms of one scale group's 16 blocks and every head (plane_scan_fragments.hpp),
// by one warp: one MMA per 32 slots over the group's multipliers [16][slots_pad] and its weights;
// terms[block * heads_pad + head] gets minus the term.
__device__ __forceinline__ void write_group_terms(const std::uint8_t* group_mult,
                                                  const std::uint8_t* magnitudes,
                                                  const std::uint8_t* group_weights, int sp, int hp,
                                                  int slots_read, int lane, int* terms) {
  int term[4] = {0, 0, 0, 0};
#pragma unroll 1
  for (int k0 = 0; k0 < slots_read; k0 += 2 * mma::kSlotsPerWord) {
    std::uint32_t af[4], bf[2];
    mma::offset_fragments(group_mult, magnitudes, group_weights, sp, hp, k0, slots_read, lane, af,
                          bf);
    mma::mma_u8s8(term, af, bf);
  }
  if (2 * (lane % 4) < hp) {  // columns 2t, 2t + 1 of rows g, g + 8; heads_pad is even
    int* at = terms + (lane / 4) * hp + 2 * (lane % 4);
    at[0] = -term[0];
    at[1] = -term[1];
    at[8 * hp] = -term[2];
    at[8 * hp + 1] = -term[3];
  }
}

// One scale group's scoring record (ScanRecordLayout), computed by one warp into `rec` (16-byte
// aligned) with `group_max` (slots_pad floats) as scratch, one lane per slot: the group's largest
// scale per slot, the blocks' multipliers, the 8-bit weights and shifts per head, and the
// constant terms (one MMA per 32 slots, plane_scan_fragments.hpp). The same arithmetic as the
// staged path's prep, so the two give the same bits; being one warp's work, it needs no block
// barrier. `scales`: the stream's scales (`layout`); the group starts at block `first_block`,
// and its blocks from `blocks_here` on hold no token.
__device__ void write_group_record(const GroupRecordInputs& in, const PlaneLayout& layout,
                                   const std::uint16_t* scales, std::int64_t first_block,
                                   int blocks_here, ScanRecordLayout r, unsigned char* rec,
                                   float* group_max, int lane) {
  const int sp = r.slots_pad, hp = in.heads_pad;
  std::uint8_t* mults = rec + r.multipliers();
  for (int sl = lane; sl < in.slots; sl += 32) {
    std::uint32_t raw[kScaleGroupBlocks / 2];
    if (sl < in.scaled) {  // 16 consecutive scales of one channel (both layouts), 32-byte aligned
      const auto* src = reinterpret_cast<const uint4*>(
          scales + layout.scale_index(first_block, in.slot_channel[sl]));
      const uint4 lo = src[0], hi = src[1];
      raw[0] = lo.x, raw[1] = lo.y, raw[2] = lo.z, raw[3] = lo.w;
      raw[4] = hi.x, raw[5] = hi.y, raw[6] = hi.z, raw[7] = hi.w;
    } else {  // sign reads have no scale row: 1 in every block that holds tokens
#pragma unroll
      for (int j = 0; j < kScaleGroupBlocks / 2; ++j) raw[j] = 0x3c003c00u;  // fp16 1.0
    }
    // Blocks past the stream's end (only in its last group, the same for the whole warp) get
    // scale 0, so that the loops below test no block.
    if (blocks_here < kScaleGroupBlocks) {
#pragma unroll
      for (int j = 0; j < kScaleGroupBlocks / 2; ++j)
        raw[j] = live_scale_pair(raw[j], blocks_here - 2 * j);
    }
    const auto block_scale = [&](int j) {
      return scale_value(static_cast<std::uint16_t>(raw[j / 2] >> (16 * (j & 1))));
    };
    float gm = 0.0f;
#pragma unroll
    for (int j = 0; j < kScaleGroupBlocks; ++j) gm = group_scale_max(gm, block_scale(j));
    const float step = scale_step(gm);
#pragma unroll
    for (int j = 0; j < kScaleGroupBlocks; ++j)
      mults[j * sp + sl] = static_cast<std::uint8_t>(scale_multiplier_by(block_scale(j), step));
    group_max[sl] = gm;
  }
  __syncwarp();
  auto* weights = reinterpret_cast<std::int8_t*>(rec + r.weights());
  auto* shifts = reinterpret_cast<int*>(rec + r.shifts());
  for (int h = 0; h < hp; ++h) {
    const int shift = write_head_weights<4>(in.queries + h * sp, group_max, in.slots, in.slots_read,
                                            sp, h, lane, weights);
    if (lane == 0) shifts[h] = shift;
  }
  __syncwarp();
  write_group_terms(mults, in.magnitudes, rec + r.weights(), sp, hp, in.slots_read, lane,
                    reinterpret_cast<int*>(rec + r.terms()));
  __syncwarp();
}

// Fused scan + streaming top-k of one chunk of one stream (plane_scan_fragments.hpp has the
// register layout). Per tile of tile_blocks blocks: cp.async stages the active plane units and
// scales of the next tile while this one is scored; a prep pass quantizes the weights of every
// (block, head) into shared memory (one warp per block, one lane per slot); then every warp
// scores one 64-token block per round with integer MMAs, and only tokens whose integer sum can
// beat the head's current threshold take the float path into the candidate buffer.
// THREADS and MIN_BLOCKS come from one kScanVariants entry; MIN_BLOCKS caps the registers.
// MAX_HEADS (4 or kMaxGroupHeads) sizes the per-head register arrays: a group of <= 4 query heads
// needs half the accumulators, which keeps the capped variants free of spills. GROUP > 0 compiles
// for exactly that many query heads (the common GQA group of 4): every per-head loop and test is
// then resolved at compile time, which removes most of the prep's branches.
// STAGED: instances for staged host planes (ws.staging set) carry the copy role and read the
// staging area; the others are compiled without any of it, so HBM and direct host scans keep
// their code (the copy role in the same instance cost the direct host scan 2x and the HBM scan
// 7%, measured).
// RESCAN: the seeded selection's second pass, whose blocks take their stream and sub-chunk from
// rescan_share instead of their grid position and write PlaneScanWorkspace::rescan_candidates.
// A separate instance: the same test at run time cost the first pass 10-13% (12 bytes of spills
// in the default instance; H200, PERF_LOG 2026-12-04).
template <int THREADS, int MIN_BLOCKS, int MAX_HEADS, int GROUP = 0, bool STAGED = false,
          bool RESCAN = false>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    scan_select_kernel(PlaneScanArgs a, PlaneScanWorkspace ws, ScanSharedPlan m) {
  static_assert(GROUP >= 0 && GROUP <= MAX_HEADS);
  constexpr int kWarps = THREADS / 32;
  constexpr int kRoundTokens = scan_round_tokens(THREADS);
  constexpr int kPerWarp = scan_blocks_per_warp(THREADS);
  static_assert(kScaleGroupBlocks % (kWarps * kPerWarp) == 0, "a round stays in one scale group");
  constexpr int kPairs = MAX_HEADS / 2;
  // Whole pairs of head pairs: neighbouring lanes share the threshold conversions of two pairs.
  static_assert(MAX_HEADS % 4 == 0 && MAX_HEADS <= kMaxGroupHeads);
  extern __shared__ __align__(16) unsigned char smem[];
  auto* words_s = reinterpret_cast<std::uint64_t*>(smem + m.words);
  auto* scales_s = reinterpret_cast<std::uint16_t*>(smem + m.scales);
  auto* qs = reinterpret_cast<float*>(smem + m.queries);
  auto* slot_channel = reinterpret_cast<int*>(smem + m.slot_channel);
  auto* slot_info = reinterpret_cast<int*>(smem + m.slot_info);
  auto* plane_rows = reinterpret_cast<int*>(smem + m.plane_rows);  // [slot][plane] byte offsets
  std::uint8_t* magnitudes = smem + m.magnitudes;                  // [slot] |o| of the slot's depth
  auto* unit_code = reinterpret_cast<int*>(smem + m.unit_code);
  std::uint8_t* wts = smem + m.weights;        // [group][head][slot] (weight_index), int8
  std::uint8_t* mults = smem + m.multipliers;  // [block][slot]
  auto* gmax = reinterpret_cast<float*>(smem + m.group_max);  // [group][slot]
  auto* shifts = reinterpret_cast<int*>(smem + m.shifts);     // [group][head]
  auto* counts = reinterpret_cast<int*>(smem + m.counts);
  auto* thr = reinterpret_cast<std::uint64_t*>(smem + m.thr);
  auto* hist = reinterpret_cast<int*>(smem + m.hist);
  auto* scratch = reinterpret_cast<int*>(smem + m.scratch);
  auto* buf = reinterpret_cast<std::uint64_t*>(smem + m.buf);

  constexpr bool staged = STAGED;
  constexpr bool rescan = RESCAN;
  static_assert(!(staged && rescan), "staged host planes are never seeded");
  const int tid = static_cast<int>(threadIdx.x);
  // Staged host planes: roles by ticket in order of start (1-D grid). The first copy_blocks
  // blocks copy, so the copy is running before any scan block can wait for a round; the others
  // scan ticket - copy_blocks = stream * chunks + chunk. The stream is read back from shared
  // memory where it is used (volatile), like blockIdx on the plain path, so that it and what is
  // derived from it need not stay in registers across the tile loop.
  __shared__ int role;
  if constexpr (staged) {
    if (tid == 0) role = atomicAdd(ws.staging.ticket, 1) - ws.staging.copy_blocks;
    __syncthreads();
    if (role < 0) {
      stage_detail::stage_copy_block<THREADS>(a, ws.staging, ws.chunks, m.tile_blocks,
                                              role + ws.staging.copy_blocks, smem);
      return;
    }
  }
  // The launcher's second pass (seeded selection): the streams where some head's candidates over
  // every chunk did not reach min(keep, eligible tokens) run again without their seed, spread
  // over the grid (rescan_blocks, rescan_share); the block's lists go to its own grid position
  // of the rescan lists. [0] stream, [1] sub-chunk, [2] sub-chunks.
  __shared__ int rescan_target[3];
  if constexpr (rescan) {
    const int unproven = for_each_unproven(a, ws, scratch + kScratchScan, [](int, int) {});
    if (unproven == 0) return;
    const int block = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
    const int blocks = rescan_blocks(static_cast<int>(gridDim.x * gridDim.y), unproven,
                                     a.max_tokens, ws.rescan_sub_tokens);
    if (block >= blocks) return;
    const RescanShare share = rescan_share(block, blocks, unproven);
    for_each_unproven(a, ws, scratch + kScratchScan,
                      [want = share.rank, target = &rescan_target[0]](int stream, int rank) {
                        if (rank == want) *target = stream;
                      });
    if (tid == 0) {
      rescan_target[1] = share.sub;
      rescan_target[2] = share.subs;
    }
    __syncthreads();
  }
  const auto stream_index = [&]() -> int {
    if constexpr (staged) return *static_cast<volatile int*>(&role) / ws.chunks;
    if constexpr (rescan) return *static_cast<volatile int*>(&rescan_target[0]);
    return static_cast<int>(blockIdx.y);
  };
  const int s = stream_index();
  const int chunk =
      staged ? role % ws.chunks : (rescan ? rescan_target[1] : static_cast<int>(blockIdx.x));
  const int lane = tid % 32, warp = tid / 32;
  const int d = a.layout.channels, tb = m.tile_blocks;
  const int heads = GROUP > 0 ? GROUP : a.heads;
  const int hp = GROUP > 0 ? (GROUP + 1) / 2 * 2 : m.heads_pad;
  const int sp = m.slots_pad, pairs = hp / 2;
  const int tb_log2 = __ffs(tb) - 1;  // tiles are a power of two of blocks (16..64)
  const std::int64_t n = a.lengths[s];
  // Positions fit in 31 bits (selection keys and the final merge hold them as int): block,
  // tile and token indices are kept in 32-bit registers.
  const int nb = static_cast<int>((n + kBlockTokens - 1) / kBlockTokens);
  const int tiles = (nb + tb - 1) / tb;
  // A chunk scores a contiguous range of tiles, or (staged host planes) every chunks-th tile from
  // its own index, so that each staging round (chunks consecutive tiles) feeds every chunk. With
  // work-sized chunks a stream uses its first chunks_of(s) slots; the others get an empty range
  // and report no candidates. (An early return there made the default instance spill 20 bytes;
  // mapping the grid so that real chunks start first cost the uniform HBM scan 5-10%.)
  const int tile_step = staged ? ws.chunks : 1;
  const int stream_chunks = staged ? ws.chunks : (rescan ? rescan_target[2] : ws.chunks_of(s));
  const int tile_begin =
      staged
          ? chunk
          : min(tiles, static_cast<int>(static_cast<std::int64_t>(tiles) * chunk / stream_chunks));
  const int tile_end = staged ? tiles
                              : min(tiles, static_cast<int>(static_cast<std::int64_t>(tiles) *
                                                            (chunk + 1) / stream_chunks));
  const auto window = eligible_window(static_cast<int>(n), a.sinks, a.recent);
  const int first_eligible = window.first, end_eligible = window.end;
  // Entry of (stream, head 0, chunk) in the candidate counts (recomputed where used); a rescan
  // block's own grid position.
  const auto count_base = [&]() -> std::int64_t {
    const int grid_stream = rescan ? static_cast<int>(blockIdx.y) : stream_index();
    return (static_cast<std::int64_t>(grid_stream) * heads) * ws.chunks +
           (staged ? *static_cast<volatile int*>(&role) % ws.chunks : static_cast<int>(blockIdx.x));
  };

  const std::uint8_t* depths = a.depths + static_cast<std::int64_t>(s) * d;
  if (a.plan_variances != nullptr) {
    // Fused DepthPlanner: warp 0 plans this stream. The candidate buffer is not in use yet (at
    // least 2 KB: one round of slack), so it holds the depths until the slots are ordered.
    auto* planned = reinterpret_cast<std::uint8_t*>(buf);
    if (warp == 0) plan_stream_warp_lean_any(a.plan_args(nullptr), s, lane, planned);
    __syncthreads();
    if (chunk == 0 && a.planned_depths != nullptr)
      for (int j = tid; j < d; j += THREADS)
        a.planned_depths[static_cast<std::int64_t>(s) * d + j] = planned[j];
    depths = planned;
  }
  if (warp == 0) {
    int units = 0, scaled = 0, deep = 0;
    const int slots = mma::order_slots_warp(depths, d, slot_channel, slot_info, unit_code,
                                            m.units_cap, &units, &scaled, lane, &deep);
    if (lane == 0) {
      scratch[0] = slots;
      scratch[1] = units;
      scratch[2] = scaled;
      scratch[3] = deep;
    }
  }
  for (int h = tid; h < kMaxGroupHeads; h += THREADS) {
    counts[h] = 0;
    thr[h] = 0;
    if (a.seed_range != nullptr && h < heads) {
      const float* range = a.seed_range + (static_cast<std::int64_t>(s) * heads + h) * 2;
      thr[h] = seed_threshold(seed_score(range[0], range[1], a.seed_margin));
    }
  }
  __syncthreads();
  const int n_slots = scratch[0], n_units = scratch[1], n_scaled = scratch[2], n_deep = scratch[3];
  if (n_units > m.units_cap) {  // depths exceed the budget the launch was sized for
    for (int h = tid; h < heads; h += THREADS)
      ws.candidate_counts[count_base() + h * ws.chunks] = -1;
    return;
  }
  for (int i = n_slots + tid; i < sp; i += THREADS) slot_info[i] = 0;  // depth 0 padding
  for (int i = tid; i < sp; i += THREADS)
    mma::plane_row_offsets(i < n_slots ? slot_info[i] : 0, tb, m.units_cap, plane_rows + 4 * i);
  for (int i = tid; i < 2 * tb; i += THREADS)  // the zero row of each stage
    words_s[(i / tb) * (m.words_stage / 8) + m.units_cap * tb + i % tb] = 0;
  for (int i = tid; i < sp; i += THREADS)
    magnitudes[i] = i < n_slots ? mma::offset_magnitude(slot_info[i]) : 0;
  for (int i = tid; i < hp * sp; i += THREADS) {
    const int h = i / sp, sl = i % sp;
    qs[i] = h < heads && sl < n_slots
                ? a.queries[(static_cast<std::int64_t>(s) * heads + h) * d + slot_channel[sl]]
                : 0.0f;
  }
  __syncthreads();
  const int steps2 = (n_slots + mma::kSlotsPerWord - 1) / mma::kSlotsPerWord;
  const int slots_read = steps2 * mma::kSlotsPerWord;
  // Passes of two k-steps from which every slot reads at most one plane (a_fragments' SHALLOW).
  const int deep_steps2 = (n_deep + mma::kSlotsPerWord - 1) / mma::kSlotsPerWord;

  // Prologue (planes not staged): the scoring record of every scale group of the chunk, one warp
  // per group in a scratch record inside the (still empty) candidate buffers, copied to
  // ws.records; the tile loop then stages records with the planes instead of quantizing weights
  // between barriers (H200: 1-2% faster at budget 48, 8-13% at 128; PERF_LOG 2026-12-04). A
  // rescan pass finds its chunk's records written by the first pass.
  if constexpr (!staged) {
    if constexpr (!rescan) {
      const int scratch_bytes = m.record.bytes() + 4 * sp;
      const int writers = min(
          kWarps, static_cast<int>(static_cast<std::int64_t>(heads) * m.cap * 8 / scratch_bytes));
      const int group_end =
          min(tile_end * m.groups, (nb + kScaleGroupBlocks - 1) / kScaleGroupBlocks);
      if (warp < writers) {
        auto* rec = reinterpret_cast<unsigned char*>(buf) + warp * scratch_bytes;
        auto* group_max = reinterpret_cast<float*>(rec + m.record.bytes());
        const GroupRecordInputs in{slot_channel, magnitudes, qs, n_slots, n_scaled, slots_read, hp};
        const std::uint16_t* scales =
            a.scales + static_cast<std::int64_t>(s) * a.layout.scales_per_stream();
        for (int g = tile_begin * m.groups + warp; g < group_end; g += writers) {
          const int first_block = g * kScaleGroupBlocks;
          if (g + writers < group_end)  // the warp's next group: its scales wait in L2
            for (int sl = lane; sl < n_scaled; sl += 32)
              prefetch_l2(scales + a.layout.scale_index(first_block + writers * kScaleGroupBlocks,
                                                        slot_channel[sl]));
          write_group_record(in, a.layout, scales, first_block, nb - first_block, m.record, rec,
                             group_max, lane);
          auto* out = reinterpret_cast<uint4*>(
              ws.records +
              (static_cast<std::int64_t>(s) * ws.records_per_stream + g) * m.record.bytes());
          for (int i = lane; i < m.record.bytes() / 16; i += 32)
            out[i] = reinterpret_cast<const uint4*>(rec)[i];
          __syncwarp();  // the scratch record is read before the next group overwrites it
        }
      }
      __syncthreads();  // the records are in memory before the tiles stage them
    }
  }

  // Stage one tile: 16-byte pieces of tb words per active (channel, plane) and tb scales per
  // slot that reads scales (sign reads, the last slots, read none). Pieces of blocks past the
  // stream's end are skipped (never read). Staged host planes come from the HBM staging area
  // (unit ordinal and slot major) once their round has landed.
  const PlaneStaging& staging = ws.staging;
  auto stage = [&](int tile, int st) {
    const int b0 = tile * tb;
    const std::int64_t at = stream_index();
    const std::uint64_t* words = staged
                                     ? staging.words + at * staging.units_cap * staging.blocks_cap
                                     : a.words + at * a.layout.words_per_stream();
    if constexpr (staged) {
      if (tid == 0)
        wait_landed(staging.landed + at * staging.rounds + tile / ws.chunks, staging.parts);
      __syncthreads();
    }
    // A piece's source is (its run) x stride + (its block's offset): the staging area holds the
    // runs in unit order, the stores in (channel, plane) order (PlaneLayout::word_index).
    const std::int64_t stride = staged ? staging.blocks_cap : a.layout.unit_stride();
    std::uint64_t* dst_w = words_s + st * (m.words_stage / 8);
    const int pieces_w_log2 = tb_log2 - 1, pieces_w = tb / 2;
    for (int i = tid; i < n_units * pieces_w; i += THREADS) {
      const int u = i >> pieces_w_log2, c = i & (pieces_w - 1);
      const int b = b0 + 2 * c;
      if (b < nb) {
        const int code = unit_code[u];
        const std::int64_t from =
            staged ? u * stride + b
                   : mma::unit_run(code) * stride + a.layout.block_offset(b, kPlanes);
        cp_async16(dst_w + u * tb + mma::tile_column(2 * c, mma::unit_swizzle(code)), words + from);
      }
    }
    std::uint16_t* dst_s = scales_s + st * (m.scales_stage / 2);
    if constexpr (staged) {
      const int pieces_s_log2 = tb_log2 - 3, pieces_s = tb / 8;
      for (int i = tid; i < n_scaled * pieces_s; i += THREADS) {
        const int sl = i >> pieces_s_log2, c = i & (pieces_s - 1);
        const int b = b0 + 8 * c;
        if (b < nb)
          cp_async16(dst_s + sl * tb + 8 * c,
                     staging.scales + (at * staging.slots_cap + sl) * stride + b);
      }
    } else {  // the records of the tile's groups that hold tokens (written by the prologue)
      const int pieces = min(m.groups, (nb - b0 + kScaleGroupBlocks - 1) / kScaleGroupBlocks) *
                         (m.record.bytes() / 16);
      const unsigned char* src =
          ws.records + (at * ws.records_per_stream + static_cast<std::int64_t>(tile) * m.groups) *
                           m.record.bytes();
      auto* dst = reinterpret_cast<unsigned char*>(dst_s);
      for (int i = tid; i < pieces; i += THREADS) cp_async16(dst + 16 * i, src + 16 * i);
    }
    cp_async_commit();
  };

  // Staged host planes arrive round by round, so their tiles are prepared in the tile loop (the
  // same values as write_group_record's): scale multipliers of every (block, slot) and weights of
  // every (scale group, head). First every thread takes four blocks of one slot, 4 consecutive
  // lanes per group and slot: the group's largest scale by shuffles, then the blocks'
  // multipliers. Then one warp per (group, head), one lane per slot: the 8-bit weights and their
  // shift; then the constant terms, one warp per group. Slots past 16 x steps are never read.
  // After the prep has turned a tile's scales into multipliers, scale group g's part of the
  // stage (16 x slots_pad x 2 bytes) holds its blocks' constant terms per head ([16][heads_pad]
  // ints); the stage is not refilled before the next tile.
  const auto group_terms = [&](int st, int g) {
    return reinterpret_cast<int*>(scales_s + st * (m.scales_stage / 2) +
                                  g * kScaleGroupBlocks * sp);
  };
  auto prep = [&](int tile, int st) {
    const std::uint16_t* sc = scales_s + st * (m.scales_stage / 2);
    const int blocks_here = nb - tile * tb;  // blocks of the tile that hold tokens (may be > tb)
    // Four blocks per lane, so a scale group is 4 lanes: one 8-byte load of their scales, two
    // shuffles for the group's largest, one division (scale_step) for four multipliers. Live
    // slots only (a padding slot's codes and |o| are 0, so its multiplier is never used), rounded
    // up to whole warps: every lane of a warp takes part in the shuffles.
    const int quads_log2 = tb_log2 - 2;
    const int items = ((n_slots << quads_log2) + 31) & ~31;
    for (int i = tid; i < items; i += THREADS) {
      const int sl = i >> quads_log2, w0 = (i & ((1 << quads_log2) - 1)) * 4;
      // Sign reads (slots from n_scaled) have no scale row: 1 in every block that holds tokens.
      uint2 raw = sl < n_scaled ? *reinterpret_cast<const uint2*>(sc + sl * tb + w0)
                                : make_uint2(0x3c003c00u, 0x3c003c00u);  // fp16 1.0
      // Blocks past the stream's end (only in its last tile) get scale 0, so the four blocks
      // below are not tested one by one. A padding slot's quad (sl >= n_slots) writes nothing,
      // so its scales need no clearing.
      if (const int live = blocks_here - w0; live < 4) {
        raw.x = live_scale_pair(raw.x, live);
        raw.y = live_scale_pair(raw.y, live - 2);
      }
      float sv[4], gm = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t half = ((j < 2 ? raw.x : raw.y) >> (16 * (j & 1))) & 0xffffu;
        sv[j] = scale_value(static_cast<std::uint16_t>(half));
        gm = group_scale_max(gm, sv[j]);
      }
      gm = group_scale_max(gm, __shfl_xor_sync(0xffffffffu, gm, 1));
      gm = group_scale_max(gm, __shfl_xor_sync(0xffffffffu, gm, 2));
      if (sl < n_slots) {
        const float step = scale_step(gm);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mults[(w0 + j) * sp + sl] = static_cast<std::uint8_t>(scale_multiplier_by(sv[j], step));
        if ((w0 & (kScaleGroupBlocks - 1)) == 0) gmax[(w0 / kScaleGroupBlocks) * sp + sl] = gm;
      }
    }
    __syncthreads();
    // The 8-bit weights and their shift, one warp per (scale group, head): with one warp per
    // group the other warps of the block waited at the barrier, and the prep's weights took
    // 16-26% of the scan (ablation, PERF_LOG 2026-12-03).
#pragma unroll 1
    for (int pair = warp; pair < m.groups * hp; pair += kWarps) {
      const int g = pair / hp, h = pair - g * hp;
      if (tile * tb + g * kScaleGroupBlocks >= nb) continue;
      const int shift = write_head_weights<1>(
          qs + h * sp, gmax + g * sp, n_slots, slots_read, sp, h, lane,
          reinterpret_cast<std::int8_t*>(wts) + static_cast<std::int64_t>(g) * hp * sp);
      if (lane == 0) shifts[g * hp + h] = shift;
    }
    __syncthreads();
    // The constant term of each group's blocks and heads (plane_scan_fragments.hpp), one warp per
    // group: one MMA per 32 slots over the multipliers and the weights just written.
    for (int g = warp; g < m.groups; g += kWarps) {
      if (tile * tb + g * kScaleGroupBlocks >= nb) continue;
      write_group_terms(mults + g * kScaleGroupBlocks * sp, magnitudes,
                        wts + static_cast<std::int64_t>(g) * hp * sp, sp, hp, slots_read, lane,
                        group_terms(st, g));
    }
  };

  // One warp scores blocks w0 + k * kWarps (k < kPerWarp) of the staged tile together and appends
  // their candidates. The blocks share a scale group, so one set of B fragments serves them, and
  // their MMA chains are independent: the scan is latency-bound, and two chains per warp give
  // the scheduler twice the independent work.
  bool near_full = false;  // this thread appended at or past a head's compaction bound this round
  auto score_round = [&](int tile, int st, int w0) {
    const std::uint64_t* tw = words_s + st * (m.words_stage / 8);
    // w0 >= 0: as unsigned, divisions and remainders by kScaleGroupBlocks are shifts and masks.
    const unsigned uw0 = static_cast<unsigned>(w0);
    const int g = static_cast<int>(uw0 / kScaleGroupBlocks);
    // The group's multipliers [16][slots_pad], weights, constant terms and shifts: a staged
    // record (ScanRecordLayout) or what the prep wrote.
    const std::uint8_t *group_mults, *wb;
    const int *terms, *group_shifts;
    if constexpr (staged) {
      group_mults = mults + g * kScaleGroupBlocks * sp;
      wb = wts + static_cast<std::int64_t>(g) * hp * sp;
      terms = group_terms(st, g);
      group_shifts = shifts + g * hp;
    } else {
      const unsigned char* rec =
          reinterpret_cast<const unsigned char*>(scales_s + st * (m.scales_stage / 2)) +
          g * m.record.bytes();
      group_mults = rec + m.record.multipliers();
      wb = rec + m.record.weights();
      terms = reinterpret_cast<const int*>(rec + m.record.terms());
      group_shifts = reinterpret_cast<const int*>(rec + m.record.shifts());
    }
    const std::uint8_t* bm[kPerWarp];
    bool live[kPerWarp];
#pragma unroll
    for (int k = 0; k < kPerWarp; ++k) {
      bm[k] = group_mults + ((uw0 + k * kWarps) % kScaleGroupBlocks) * sp;
      live[k] = tile * tb + w0 + k * kWarps < nb;
    }
    int acc[kPerWarp][kPairs][4];
#pragma unroll
    for (int k = 0; k < kPerWarp; ++k)
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[k][p][i] = 0;
    // This lane's weight row of each pair (mma::weight_row) and its tile column.
    const std::uint8_t* wrow[kPairs];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) wrow[p] = mma::weight_row(wb, sp, p, lane);
    const auto* stage_bytes = reinterpret_cast<const unsigned char*>(tw);
    const int column_bytes = 8 * mma::tile_column(w0, lane % 4);
    // One pass: two k-steps (16 slots) of every block and head pair. `shallow` (a
    // std::bool_constant): no slot of the pass reads more than one plane.
    const auto pass = [&](int ks2, auto shallow) {
      std::uint32_t wword[kPairs];
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
        wword[p] = p < pairs ? mma::load_word(wrow[p] + 4 * ks2) : 0u;
#pragma unroll
      for (int odd = 0; odd < 2; ++odd) {
        std::uint32_t af[kPerWarp][4];
        mma::a_fragments<kPerWarp, kWarps, decltype(shallow)::value>(
            stage_bytes, column_bytes, plane_rows, slot_info, bm[0], kWarps * sp, 2 * ks2 + odd,
            lane, af);
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
          if (p < pairs) {
            std::uint32_t bf[2];
            mma::b_fragment(wword[p], odd, lane, bf);
#pragma unroll
            for (int k = 0; k < kPerWarp; ++k) mma::mma_u8s8(acc[k][p], af[k], bf);
          }
        }
      }
    };
    int ks2 = 0;
    for (; ks2 < deep_steps2; ++ks2) pass(ks2, std::false_type{});
    for (; ks2 < steps2; ++ks2) pass(ks2, std::true_type{});
    // Per pair: this lane's head, its shift and the smallest sum that can enter at the head's
    // current threshold. Lanes t and t ^ 1 hold the same head of each pair (mma::lane_head), so
    // each converts the threshold of every other pair and takes the rest from its neighbour.
    int shift[kPairs], least[kPairs];
    const bool odd_lane = (lane & 1) != 0;
#pragma unroll
    for (int q = 0; q < kPairs; q += 2) {
      const int own_pair = q + (odd_lane ? 1 : 0), h = mma::lane_head(lane, own_pair);
      int own = INT_MAX;
      if (own_pair < pairs && h < heads) {
        const std::uint64_t t = thr[h];
        own = t == 0 ? INT_MIN
                     : min_candidate_sum(key_to_float(static_cast<std::uint32_t>(t >> 32)),
                                         group_shifts[h]);
      }
      const int other = __shfl_xor_sync(0xffffffffu, own, 1);
      least[q] = odd_lane ? other : own;
      least[q + 1] = odd_lane ? own : other;
    }
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const int h = mma::lane_head(lane, p);
      shift[p] = p < pairs && h < heads ? group_shifts[h] : kNoWeights;
    }
#pragma unroll
    for (int k = 0; k < kPerWarp; ++k) {
      if (!live[k]) continue;  // the same for every lane
      int offset[kPairs], floor[kPairs];
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        offset[p] = terms[((uw0 + k * kWarps) % kScaleGroupBlocks) * hp + mma::lane_head(lane, p)];
        floor[p] =
            least[p] == INT_MIN || least[p] == INT_MAX ? least[p] : (least[p] - offset[p]) >> 1;
      }
      const int base = (tile * tb + w0 + k * kWarps) * kBlockTokens;
      if (a.scores != nullptr) {  // diagnostics and tests: every score
        // Opaque, so that the 64-bit row arithmetic stays behind the null test: ptxas hoisted it
        // above the test into every round (about 8 instructions per block, ncu 2026-12-04).
        const std::int64_t row_tokens = opaque(a.max_tokens);
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
          const int h = mma::lane_head(lane, p);
          if (p >= pairs || h >= heads) continue;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int token = base + mma::lane_token(lane, i);
            if (token < n)
              a.scores[(static_cast<std::int64_t>(stream_index()) * heads + h) * row_tokens +
                       token] = quantized_score(2 * acc[k][p][i] + offset[p], shift[p]);
          }
        }
      }
      // Bit 4 p + i: accumulator i of pair p reaches its floor. Once the thresholds have risen
      // few do, so each lane walks only its own set bits (a warp takes as many steps as its
      // busiest lane, usually 0 or 1) instead of testing every entry one after the other.
      unsigned pass = 0;
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          pass |= static_cast<unsigned>(acc[k][p][i] >= floor[p]) << (4 * p + i);
      // Sinks and the recent window are never candidates. Only a block that holds some of them
      // (the same for the whole warp) clears their bits, so the walk tests no positions.
      if (base < first_eligible || base + kBlockTokens > end_eligible) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int token = base + mma::lane_token(lane, i);
          if (token < first_eligible || token >= end_eligible)
#pragma unroll
            for (int p = 0; p < kPairs; ++p) pass &= ~(1u << (4 * p + i));
        }
      }
      while (pass != 0u) {
        const int bit = __ffs(static_cast<int>(pass)) - 1;
        pass &= pass - 1u;
        const int p = bit >> 2, i = bit & 3;
        // Registers cannot be indexed: pick the entry with a tree of selects, by pair first (the
        // pair's offset and shift with it), then by accumulator.
        int by_pair[4], off = offset[0], sh = shift[0];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) by_pair[ii] = acc[k][0][ii];
#pragma unroll
        for (int pp = 1; pp < kPairs; ++pp) {
          if (pp == p) {
            off = offset[pp];
            sh = shift[pp];
#pragma unroll
            for (int ii = 0; ii < 4; ++ii) by_pair[ii] = acc[k][pp][ii];
          }
        }
        const int low = (i & 1) ? by_pair[1] : by_pair[0];
        const int high = (i & 1) ? by_pair[3] : by_pair[2];
        const int dot = (i & 2) ? high : low;
        const int token = base + mma::lane_token(lane, i);
        const std::uint64_t key =
            selection_key(quantized_score(2 * dot + off, sh), static_cast<std::uint32_t>(token));
        const int h = mma::lane_head(lane, p);
        if (key > thr[h]) {
          const int at = atomicAdd(&counts[h], 1);
          buf[h * m.cap + at] = key;
          // The count after the round exceeds the compaction bound iff some append got an index
          // at or past it (a round without appends leaves the count where the last check did).
          near_full |= at >= m.cap - kRoundTokens;
        }
      }
    }
  };

  if (tile_begin < tile_end) stage(tile_begin, 0);
  int it = 0;
  for (int tile = tile_begin; tile < tile_end; tile += tile_step, ++it) {
    const int st = it & 1;
    if (tile + tile_step < tile_end) {
      stage(tile + tile_step, st ^ 1);  // that buffer was last read before the previous tile's end
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (staged) {
      prep(tile, st);
      __syncthreads();
    }
    for (int r = 0; r < tb / (kWarps * kPerWarp); ++r) {
      const int w0 = r * kWarps * kPerWarp + warp;
      near_full = false;
      if (tile * tb + w0 < nb) score_round(tile, st, w0);
      // Most rounds compact nothing: the barrier that ends the round also says whether any head
      // needs it, so those rounds read no counts and take no second barrier before the next
      // round appends.
      if (__syncthreads_or(near_full)) {
        for (int h = 0; h < heads; ++h) {
          if (counts[h] > m.cap - kRoundTokens) {
            const std::uint64_t kth =
                compact_top<THREADS>(buf + h * m.cap, &counts[h], a.keep, hist, scratch);
            if (tid == 0) thr[h] = kth;
            __syncthreads();
          }
        }
        __syncthreads();  // every thread has read counts[] and thr[] before the next round appends
      }
    }
  }
  for (int h = 0; h < heads; ++h) {
    if (counts[h] > a.keep)
      compact_top<THREADS>(buf + h * m.cap, &counts[h], a.keep, hist, scratch);
    const int c = counts[h];
    std::uint64_t* out =
        ws.candidates + (count_base() + static_cast<std::int64_t>(h) * ws.chunks) * a.keep;
    for (int i = tid; i < c; i += THREADS) out[i] = buf[h * m.cap + i];
    if (tid == 0) {
      ws.candidate_counts[count_base() + h * ws.chunks] = c;
      if (a.seed_range != nullptr)
        atomicAdd(&ws.seed_hits[static_cast<std::int64_t>(stream_index()) * heads + h], c);
    }
  }
  // One chunk per stream: the lists are the result (the merge runs only for rescanned streams).
  if (ws.chunks == 1 && !rescan && a.score_range != nullptr)
    for (int h = 0; h < heads; ++h)
      write_score_range<THREADS>(
          buf + h * m.cap, counts[h], a.keep, reinterpret_cast<unsigned long long*>(hist),
          a.score_range + (static_cast<std::int64_t>(stream_index()) * heads + h) * 2);
}

// The merge runs in two kernels. merge_heads_kernel, one block per (head, stream), takes the top
// `keep` of the head's candidates over every chunk (a streaming top-k with the scan's compaction)
// and leaves their positions in the first chunk's candidate list and their number in its count
// (not launched with one chunk per stream: the scan's lists are the result).
// finalize_kernel, one block per stream, adds the sinks and the recent window and sorts and
// deduplicates the union. One block per stream doing every head in turn took 175 us of the
// 1M-token, batch 1 host scan (31 chunks x 4 heads x 2012 candidates; PERF_LOG 2026-12-01).
struct MergeSmem {
  int cap = 0;
  std::int64_t buf = 0, counts = 0, hist = 0, scratch = 0, total = 0;
};

MergeSmem plan_merge_smem(const PlaneScanArgs& a) {
  MergeSmem m;
  m.cap = a.keep + std::max(a.keep, 4 * kFinalizeThreads);
  SharedLayout layout;
  m.buf = layout.take(static_cast<std::int64_t>(m.cap) * 8);
  m.counts = layout.take(16);
  m.hist = layout.take(256 * 4);
  m.scratch = layout.take(64 * 8);
  m.total = layout.size();
  return m;
}

// A head's merged positions (int32) and their number, in the first chunk's entries.
__device__ __forceinline__ std::int64_t head_entry(const PlaneScanArgs& a,
                                                   const PlaneScanWorkspace& ws, int s, int h) {
  return (static_cast<std::int64_t>(s) * a.heads + h) * ws.chunks;
}
__device__ __forceinline__ std::int32_t* head_positions(const PlaneScanArgs& a,
                                                        const PlaneScanWorkspace& ws, int s,
                                                        int h) {
  return reinterpret_cast<std::int32_t*>(ws.candidates + head_entry(a, ws, s, h) * a.keep);
}

__global__ void __launch_bounds__(kFinalizeThreads)
    merge_heads_kernel(PlaneScanArgs a, PlaneScanWorkspace ws, MergeSmem m) {
  extern __shared__ __align__(16) unsigned char smem[];
  std::uint64_t* buf = reinterpret_cast<std::uint64_t*>(smem + m.buf);
  int* counts = reinterpret_cast<int*>(smem + m.counts);
  int* hist = reinterpret_cast<int*>(smem + m.hist);
  int* scratch = reinterpret_cast<int*>(smem + m.scratch);
  auto* thr_shared = reinterpret_cast<std::uint64_t*>(scratch + kScratchThreshold);
  const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
  const std::int64_t entry0 = head_entry(a, ws, s, h);
  // Seeded selection: a stream whose seed was not proven has the rescan pass's lists, one per
  // grid block that scanned a share of it (rescan_share); the others their own chunks' lists.
  int lists = ws.chunks, unproven = 0;
  if (tid == 0) {
    counts[0] = 0;
    thr_shared[0] = 0;
    scratch[0] = -1;
  }
  __syncthreads();
  if (ws.rescan_candidates != nullptr) {
    unproven = for_each_unproven(a, ws, scratch + kScratchScan, [s, scratch](int stream, int r) {
      if (stream == s) scratch[0] = r;
    });
  }
  const int rank = scratch[0];
  if (rank >= 0) {
    lists = rescan_share(
                rank,
                rescan_blocks(a.streams * ws.chunks, unproven, a.max_tokens, ws.rescan_sub_tokens),
                unproven)
                .subs;
  } else if (ws.chunks == 1) {
    return;  // one chunk per stream, seed proven: the scan's list is the result (finalize)
  }
  // List c of this head: entry and list base.
  const auto list_entry = [&](int c) -> std::int64_t {
    if (rank < 0) return entry0 + c;
    const int block = rescan_block(rank, c, unproven);
    return (static_cast<std::int64_t>(block / ws.chunks) * a.heads + h) * ws.chunks +
           block % ws.chunks;
  };
  const std::uint64_t* const lists_base = rank < 0 ? ws.candidates : ws.rescan_candidates;
  const std::int32_t* const counts_base = rank < 0 ? ws.candidate_counts : ws.rescan_counts;
  bool failed = false;
  for (int c = 0; c < lists; ++c) {
    const std::int64_t e = list_entry(c);
    const int cnt = counts_base[e];
    if (cnt < 0) failed = true;
    const std::uint64_t* cand = lists_base + e * a.keep;
    for (int base = 0; base < cnt; base += kFinalizeThreads) {
      const int i = base + tid;
      if (i < cnt) {
        const std::uint64_t key = cand[i];
        if (key > thr_shared[0]) buf[atomicAdd(&counts[0], 1)] = key;
      }
      __syncthreads();
      if (counts[0] > m.cap - kFinalizeThreads) {
        const std::uint64_t kth =
            compact_top<kFinalizeThreads>(buf, &counts[0], a.keep, hist, scratch);
        if (tid == 0) thr_shared[0] = kth;
      }
      __syncthreads();
    }
  }
  // Every candidate has been read (the barriers above): the first chunk's list takes the result.
  if (counts[0] > a.keep) compact_top<kFinalizeThreads>(buf, &counts[0], a.keep, hist, scratch);
  const int kept = counts[0];
  std::int32_t* out = head_positions(a, ws, s, h);
  for (int i = tid; i < kept; i += kFinalizeThreads)
    out[i] = static_cast<std::int32_t>(selection_key_position(buf[i]));
  if (tid == 0) ws.candidate_counts[entry0] = failed ? -1 : kept;
  if (a.score_range != nullptr)
    write_score_range<kFinalizeThreads>(
        buf, kept, a.keep, reinterpret_cast<unsigned long long*>(hist),
        a.score_range + (static_cast<std::int64_t>(s) * a.heads + h) * 2);
}

// finalize_kernel sorts and deduplicates the selection with a bitmap of the stream's positions
// when max_tokens / 8 bytes (and a summary bit per bitmap word) fit its shared memory (up to
// about 1.8M tokens): one bit per position, then the set bits of the marked words read out in
// order. Otherwise it bitonic-sorts the positions (66 barrier-separated stages at top_k 512;
// 20-25 us of the 29 us merge at 1K tokens, H200).
struct FinalizeSmem {
  int sort_size = 0;  // 0 on the bitmap path
  std::int64_t positions = 0, scratch = 0, total = 0;
  std::int64_t summary = 0;  // bitmap path: one bit per bitmap word, set when the word is not 0
};

FinalizeSmem plan_finalize_smem(const PlaneScanArgs& a) {
  FinalizeSmem m;
  SharedLayout layout;
  m.scratch = layout.take(64 * 8);
  const std::int64_t words = (a.max_tokens + 31) / 32;
  const std::int64_t summary_words = (words + 31) / 32;
  if (a.max_tokens > 0 &&
      layout.size() + align16(words * 4) + align16(summary_words * 4) <= kFinalizeSharedMax) {
    m.positions = layout.take(words * 4);
    m.summary = layout.take(summary_words * 4);
  } else {
    int p = 1;
    while (p < a.max_selected()) p <<= 1;
    m.sort_size = p;
    m.positions = layout.take(static_cast<std::int64_t>(p) * 4);
  }
  m.total = layout.size();
  return m;
}

__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(PlaneScanArgs a, PlaneScanWorkspace ws, FinalizeSmem m) {
  extern __shared__ __align__(16) unsigned char smem[];
  int* positions = reinterpret_cast<int*>(smem + m.positions);
  int* scratch = reinterpret_cast<int*>(smem + m.scratch);
  const int s = blockIdx.x, tid = threadIdx.x;
  const std::int64_t n = a.lengths[s];
  const EligibleWindow window = eligible_window(n, a.sinks, a.recent);
  const std::int64_t first_eligible = window.first, end_eligible = window.end;
  const int fixed = static_cast<int>(first_eligible + (n - end_eligible));
  // The head merge ran for this stream unless it has one chunk and was not rescanned: then the
  // lists hold the scan's keys, not merged positions.
  const bool merged =
      ws.chunks > 1 || (ws.rescan_candidates != nullptr && !seed_proven(a, ws.seed_hits, s));
  // Both scan passes are done: the seeded selection's counters start the next launch at zero.
  if (ws.seed_hits != nullptr) {
    __syncthreads();  // every thread has read them
    if (tid < a.heads) ws.seed_hits[static_cast<std::int64_t>(s) * a.heads + tid] = 0;
  }
  // Position i of the selection: a bit of the bitmap, or entry i of the list to sort.
  const bool bitmap = m.sort_size == 0;
  auto* bits = reinterpret_cast<std::uint32_t*>(positions);
  auto* summary = reinterpret_cast<std::uint32_t*>(smem + m.summary);
  const int words = static_cast<int>((n + 31) / 32);
  const int summary_words = (words + 31) / 32;
  if (bitmap) {
    for (int i = tid; i < words; i += kFinalizeThreads) bits[i] = 0;
    for (int i = tid; i < summary_words; i += kFinalizeThreads) summary[i] = 0;
    __syncthreads();
  }
  const auto emit = [&](int i, int position) {
    if (bitmap) {
      atomicOr(&bits[position >> 5], 1u << (position & 31));
      atomicOr(&summary[position >> 10], 1u << ((position >> 5) & 31));
    } else {
      positions[i] = position;
    }
  };
  for (int i = tid; i < fixed; i += kFinalizeThreads)
    emit(i, i < first_eligible ? i : static_cast<int>(end_eligible + (i - first_eligible)));
  int used = fixed;
  bool failed = false;
  for (int h = 0; h < a.heads; ++h) {
    const int kept = ws.candidate_counts[head_entry(a, ws, s, h)];
    if (kept < 0) {
      failed = true;
      continue;
    }
    if (!merged) {  // the scan's own top `keep`
      const std::uint64_t* keys = ws.candidates + head_entry(a, ws, s, h) * a.keep;
      for (int i = tid; i < kept; i += kFinalizeThreads)
        emit(used + i, static_cast<int>(selection_key_position(keys[i])));
    } else {
      const std::int32_t* merged = head_positions(a, ws, s, h);
      for (int i = tid; i < kept; i += kFinalizeThreads) emit(used + i, merged[i]);
    }
    used += kept;
  }
  if (failed) {
    if (tid == 0) a.selected_count[s] = -1;
    return;
  }
  __syncthreads();
  std::int32_t* out = a.selected + s * a.max_selected();
  if (bitmap) {
    // Each thread reads out, in order, the set bits of its run of words, visiting only the words
    // the summary marks: the selection sets about top_k words of the stream (with a read-out of
    // every word the finalize took 20 us per call at 1M tokens, H200). Runs of words rather than
    // of summary words, so that a short stream's few dense words are still spread over threads.
    const int per = (words + kFinalizeThreads - 1) / kFinalizeThreads;
    const int w0 = min(tid * per, words), w1 = min(w0 + per, words);
    const auto for_each_marked_word = [&](auto&& visit) {
      for (int w = w0; w < w1; w = (w | 31) + 1) {
        const int sw = w >> 5, lo = w & 31, hi = min(32, w1 - 32 * sw);
        const std::uint32_t in_run = (hi == 32 ? ~0u : (1u << hi) - 1u) & ~((1u << lo) - 1u);
        for (std::uint32_t marks = summary[sw] & in_run; marks != 0; marks &= marks - 1)
          visit(32 * sw + __ffs(marks) - 1);
      }
    };
    int mine = 0;
    for_each_marked_word([&](int w) { mine += __popc(bits[w]); });
    int total = 0;
    int at = BlockScan(scratch + kScratchScan).exclusive_sum(mine, total);
    for_each_marked_word([&](int w) {
      for (std::uint32_t b = bits[w]; b != 0; b &= b - 1) out[at++] = 32 * w + __ffs(b) - 1;
    });
    if (tid == 0) a.selected_count[s] = total;
    return;
  }
  for (int i = used + tid; i < m.sort_size; i += kFinalizeThreads) positions[i] = 0x7fffffff;
  __syncthreads();
  for (int k = 2; k <= m.sort_size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < m.sort_size; i += kFinalizeThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const bool ascending = (i & k) == 0;
          const int x = positions[i], y = positions[partner];
          if ((x > y) == ascending) {
            positions[i] = y;
            positions[partner] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  BlockScan scan(scratch + kScratchScan);
  int written = 0;
  for (int base = 0; base < used; base += kFinalizeThreads) {
    const int i = base + tid;
    const bool flag = i < used && (i == 0 || positions[i] != positions[i - 1]);
    int total = 0;
    const int pos = scan.exclusive_count(flag, total);
    if (flag) out[written + pos] = positions[i];
    written += total;
  }
  if (tid == 0) a.selected_count[s] = written;
}

using ScanKernel = void (*)(PlaneScanArgs, PlaneScanWorkspace, ScanSharedPlan);

// The kernel instance of every kScanVariants entry, in order (RESCAN: the seeded selection's
// second pass).
template <int MAX_HEADS, bool RESCAN, std::size_t... I>
constexpr std::array<ScanKernel, sizeof...(I)> scan_kernel_table(std::index_sequence<I...>) {
  return {
      &scan_select_kernel<kScanVariants[I].threads, scan_blocks_per_sm(kScanVariants[I], MAX_HEADS),
                          MAX_HEADS, 0, false, RESCAN>...};
}
constexpr auto kVariantIndices =
    std::make_index_sequence<static_cast<std::size_t>(kScanVariantCount)>();
template <bool RESCAN>
constexpr auto kScanKernelsUpTo4Heads = scan_kernel_table<4, RESCAN>(kVariantIndices);
template <bool RESCAN>
constexpr auto kScanKernelsUpTo8Heads = scan_kernel_table<kMaxGroupHeads, RESCAN>(kVariantIndices);
// Staged host planes: the default variant only (kStagedVariant).
template <int MAX_HEADS, int GROUP = 0>
constexpr ScanKernel kStagedScanKernel =
    &scan_select_kernel<kScanVariants[kStagedVariant].threads,
                        scan_blocks_per_sm(kScanVariants[kStagedVariant], MAX_HEADS), MAX_HEADS,
                        GROUP, true>;

// The default variant for the GQA group of 4 (Qwen3-8B, Llama-3-8B: 32 query / 8 KV heads).
template <bool RESCAN>
constexpr ScanKernel kScanKernelGroupOf4 =
    &scan_select_kernel<kScanVariants[0].threads, scan_blocks_per_sm(kScanVariants[0], 4), 4, 4,
                        false, RESCAN>;

ScanKernel scan_kernel_for(const PlaneScanArgs& args, int variant, bool staged,
                           bool rescan = false) {
  if (staged) {
    if (args.heads == 4) return kStagedScanKernel<4, 4>;
    return args.heads <= 4 ? kStagedScanKernel<4> : kStagedScanKernel<kMaxGroupHeads>;
  }
  const auto v = static_cast<std::size_t>(variant);
  if (rescan) {
    if (variant == 0 && args.heads == 4) return kScanKernelGroupOf4<true>;
    return args.heads <= 4 ? kScanKernelsUpTo4Heads<true>[v] : kScanKernelsUpTo8Heads<true>[v];
  }
  if (variant == 0 && args.heads == 4) return kScanKernelGroupOf4<false>;
  return args.heads <= 4 ? kScanKernelsUpTo4Heads<false>[v] : kScanKernelsUpTo8Heads<false>[v];
}

}  // namespace

int plane_scan_resident_blocks(const PlaneScanArgs& args, const PlaneScanWorkspace& ws) {
  check_scan_variant(ws.variant, "fathom scan: workspace variant");
  const ScanSharedPlan scan = plan_scan_shared(args, ws);
  const ScanKernel kernel = scan_kernel_for(args, ws.variant, ws.staging.enabled());
  allow_dynamic_shared(kernel, scan.total);
  int blocks = 0;
  HISPARSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, kernel, scan.threads, static_cast<std::size_t>(scan.total)));
  return blocks;
}

void launch_plane_scan_select(const PlaneScanArgs& args, const PlaneScanWorkspace& ws,
                              cudaStream_t stream) {
  if (args.streams == 0) return;
  check_scan_variant(ws.variant, "fathom scan: workspace variant");
  const ScanSharedPlan scan = plan_scan_shared(args, ws);
  if (reinterpret_cast<std::uintptr_t>(args.words) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(args.scales) % 16 != 0)
    throw Error("fathom scan: planes", "plane words or scales are not 16-byte aligned",
                "pass the PlaneStore's buffers (the scan copies them in 16-byte pieces)");
  if (ws.tile_blocks % kScanTileBlocksMin != 0)
    throw Error("fathom scan: workspace", "tile of " + std::to_string(ws.tile_blocks) + " blocks",
                "use plan_scan_workspace()");
  const MergeSmem merge = plan_merge_smem(args);
  const FinalizeSmem fin = plan_finalize_smem(args);
  if (fin.total > kFinalizeSharedMax || merge.total > kFinalizeSharedMax)
    throw Error("fathom scan: top_k",
                "the final merge of " + std::to_string(args.heads) + " heads x keep " +
                    std::to_string(args.keep) + " needs " +
                    std::to_string(std::max(fin.total, merge.total) / 1024) +
                    " KB of shared memory",
                "lower top_k");
  const ScanKernel kernel = scan_kernel_for(args, ws.variant, ws.staging.enabled());
  allow_dynamic_shared(kernel, scan.total);
  allow_dynamic_shared(finalize_kernel, fin.total);
  allow_dynamic_shared(merge_heads_kernel, merge.total);
  dim3 grid(static_cast<unsigned>(ws.chunks), static_cast<unsigned>(args.streams));
  if (ws.staging.enabled()) {
    check_staging(args, ws);
    if (stage_copy_shared_bytes(args, ws.staging) > scan.total)
      throw Error("fathom scan: staging",
                  "the copy blocks' stream tables do not fit the scan block's shared memory",
                  "use more copy blocks (PlaneScan::set_host_staging)");
    reset_staging(args, ws, stream);
    grid = dim3(static_cast<unsigned>(ws.chunks * args.streams + ws.staging.copy_blocks));
  }
  if (!ws.staging.enabled() && (ws.records == nullptr || ws.record_bytes != scan.record.bytes()))
    throw Error("fathom scan: workspace", "no scoring records of this plan's size",
                "use PlaneScan, or give PlaneScanWorkspace::records of record_bytes_total() bytes "
                "from plan_scan_workspace()");
  const bool seeded = args.seed_range != nullptr && !ws.staging.enabled();
  if (seeded &&
      (ws.seed_hits == nullptr || ws.rescan_candidates == nullptr || ws.rescan_counts == nullptr))
    throw Error("fathom scan: seed_range",
                "a seeded scan without the workspace's seed_hits and rescan lists",
                "use PlaneScan, or give PlaneScanWorkspace::seed_hits [streams][heads] zeroed and "
                "rescan_candidates / rescan_counts shaped like candidates / candidate_counts");
  // Seeded selection: the seeded pass, then a pass that rescans unseeded only the streams whose
  // seed some head's candidates did not prove, spread over the whole grid (every block returns
  // at once when all were proven), and the head merge of those streams' rescan lists.
  PlaneScanArgs first = args;
  if (!seeded) first.seed_range = nullptr;
  kernel<<<grid, static_cast<unsigned>(scan.threads), static_cast<std::size_t>(scan.total),
           stream>>>(first, ws, scan);
  HISPARSE_CUDA_CHECK_LAUNCH();
  PlaneScanWorkspace merged = ws;
  if (seeded) {
    PlaneScanArgs unseeded = args;
    unseeded.seed_range = nullptr;
    PlaneScanWorkspace again = ws;
    again.candidates = ws.rescan_candidates;
    again.candidate_counts = ws.rescan_counts;
    const ScanKernel rescan = scan_kernel_for(args, ws.variant, false, true);
    allow_dynamic_shared(rescan, scan.total);
    rescan<<<grid, static_cast<unsigned>(scan.threads), static_cast<std::size_t>(scan.total),
             stream>>>(unseeded, again, scan);
    HISPARSE_CUDA_CHECK_LAUNCH();
  } else {
    merged.rescan_candidates = nullptr;  // no rescan lists to read
  }
  // One chunk per stream already holds each head's top `keep`, unless the stream was rescanned.
  if (ws.chunks > 1 || seeded) {
    merge_heads_kernel<<<dim3(static_cast<unsigned>(args.heads),
                              static_cast<unsigned>(args.streams)),
                         kFinalizeThreads, static_cast<std::size_t>(merge.total), stream>>>(
        args, merged, merge);
    HISPARSE_CUDA_CHECK_LAUNCH();
  }
  finalize_kernel<<<static_cast<unsigned>(args.streams), kFinalizeThreads,
                    static_cast<std::size_t>(fin.total), stream>>>(args, merged, fin);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
