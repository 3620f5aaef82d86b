#include "kernels/fathom/plane_scan.hpp"

#include <algorithm>

#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/fathom/plane_scan_config.hpp"

namespace hisparse::kernels::fathom {
namespace {

// Shared-memory plan of the scan block (byte offsets; computed on the host, passed by value).
struct ScanSmem {
  int units_cap = 0;  ///< plane units one tile holds (the budget)
  int cap = 0;        ///< candidate buffer entries per head
  int tile_blocks = 16;
  std::int64_t qa = 0, slot_channel = 0, slot_depth = 0, slot_base = 0, unit_code = 0,
               tile_words = 0, tile_scales = 0, buf = 0, counts = 0, thr = 0, hist = 0, scratch = 0,
               total = 0;
};

std::int64_t align16(std::int64_t x) {
  return (x + 15) / 16 * 16;
}

ScanSmem plan_scan_smem(const PlaneScanArgs& a, const PlaneScanWorkspace& ws, int budget) {
  ScanSmem m;
  const std::int64_t d = a.layout.channels;
  m.units_cap = std::max(1, budget);
  m.tile_blocks = ws.tile_blocks;
  std::int64_t off = 0;
  auto take = [&](std::int64_t bytes) {
    const std::int64_t at = off;
    off = align16(off + bytes);
    return at;
  };
  m.qa = take(static_cast<std::int64_t>(a.heads) * d * 4);
  m.slot_channel = take(d * 4);
  m.slot_depth = take(d * 4);
  m.slot_base = take(d * 4);
  m.unit_code = take(4 * d * 4);
  m.tile_words = take(static_cast<std::int64_t>(m.units_cap) * m.tile_blocks * 8);
  m.tile_scales = take(d * m.tile_blocks * 4);
  m.counts = take(kMaxGroupHeads * 4);
  m.thr = take(kMaxGroupHeads * 8);
  m.hist = take(256 * 4);
  m.scratch = take(64 * 8);
  // Candidate buffers: keep + slack entries per head. The slack (between 2 and 4 rounds, about
  // keep) sets how often the buffer is compacted; keeping the whole block near 50 KB lets 4 scan
  // blocks share an SM, which the latency-bound scan loop needs (one 200 KB block per SM ran at
  // about 1% of HBM bandwidth).
  const std::int64_t left = kScanSharedBudget - off;
  const std::int64_t per_head = left / (8 * std::max(1, a.heads));
  const std::int64_t slack = std::min<std::int64_t>(
      per_head - a.keep,
      std::clamp<std::int64_t>(a.keep, 2 * kScanRoundTokens, 4 * kScanRoundTokens));
  if (slack < 2 * kScanRoundTokens)
    throw Error("fathom scan: top_k",
                std::to_string(a.heads) + " query heads x keep " + std::to_string(a.keep) +
                    " do not fit the fused selection's shared memory (" +
                    std::to_string(left / 1024) + " KB left after the tile)",
                "lower top_k or the plane budget");
  m.cap = static_cast<int>(a.keep + slack);
  m.buf = take(static_cast<std::int64_t>(a.heads) * m.cap * 8);
  m.total = off;
  return m;
}

// Block-wide exclusive prefix count of `flag` (THREADS a multiple of 32, <= 1024). `warp_totals`
// holds 32 ints of shared memory. Returns the prefix; *total gets the block's sum.
template <int THREADS>
__device__ int block_exclusive_count(bool flag, int* warp_totals, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) {
    const int v = warp_totals[w];
    before += w < warp ? v : 0;
    sum += v;
  }
  __syncthreads();  // warp_totals may be reused right after
  *total = sum;
  return before + in_warp;
}

// Keeps the `keep` largest of the `*count` unique keys in buf (ordered in-place compaction after an
// 8-pass MSB radix select); returns the smallest kept key. All threads of the block must call it.
template <int THREADS>
__device__ std::uint64_t compact_top(std::uint64_t* buf, int* count, int keep, int* hist,
                                     int* scratch) {
  const int n = *count;
  std::uint64_t prefix = 0, mask = 0;
  int remaining = keep;
  auto* shared_u64 = reinterpret_cast<std::uint64_t*>(scratch + 32);
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
      int inclusive = mine;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += v;
      }
      const int before = inclusive - mine;
      const bool here = before < remaining && inclusive >= remaining;
      const int total = __shfl_sync(0xffffffffu, inclusive, 31);
      if (__ballot_sync(0xffffffffu, here) == 0u) {
        if (lane == 0) {  // fewer keys than asked for (not reached: callers hold more)
          shared_u64[0] = prefix;
          scratch[0] = remaining - total;
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
      }
    }
    __syncthreads();
    prefix = shared_u64[0];
    remaining = scratch[0];
    mask |= std::uint64_t{255} << shift;
    __syncthreads();
  }
  const std::uint64_t kth = prefix;
  int out = 0;
  for (int base = 0; base < n; base += THREADS) {
    const int i = base + threadIdx.x;
    const std::uint64_t key = i < n ? buf[i] : 0;
    const bool flag = i < n && key >= kth;
    int total = 0;
    const int pos = block_exclusive_count<THREADS>(flag, scratch + 2, &total);  // syncs: reads done
    if (flag) buf[out + pos] = key;
    out += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = out;
  __syncthreads();
  return kth;
}

__global__ void __launch_bounds__(kScanThreads)
    scan_select_kernel(PlaneScanArgs a, PlaneScanWorkspace ws, ScanSmem m) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* qa = reinterpret_cast<float*>(smem + m.qa);
  int* slot_channel = reinterpret_cast<int*>(smem + m.slot_channel);
  int* slot_depth = reinterpret_cast<int*>(smem + m.slot_depth);
  int* slot_base = reinterpret_cast<int*>(smem + m.slot_base);
  int* unit_code = reinterpret_cast<int*>(smem + m.unit_code);
  std::uint64_t* tile_words = reinterpret_cast<std::uint64_t*>(smem + m.tile_words);
  float* tile_scales = reinterpret_cast<float*>(smem + m.tile_scales);
  std::uint64_t* buf = reinterpret_cast<std::uint64_t*>(smem + m.buf);
  int* counts = reinterpret_cast<int*>(smem + m.counts);
  std::uint64_t* thr = reinterpret_cast<std::uint64_t*>(smem + m.thr);
  int* hist = reinterpret_cast<int*>(smem + m.hist);
  int* scratch = reinterpret_cast<int*>(smem + m.scratch);

  const int s = blockIdx.y, chunk = blockIdx.x, tid = threadIdx.x;
  const int d = a.layout.channels, heads = a.heads, tb = m.tile_blocks;
  const std::int64_t n = a.lengths[s];
  const std::int64_t nb = (n + kBlockTokens - 1) / kBlockTokens;
  const std::int64_t tiles = (nb + tb - 1) / tb;
  const std::int64_t tile_begin = tiles * chunk / ws.chunks,
                     tile_end = tiles * (chunk + 1) / ws.chunks;
  const std::int64_t first_eligible = n < a.sinks ? n : a.sinks;
  const std::int64_t end_eligible = n - a.recent > first_eligible ? n - a.recent : first_eligible;
  const std::uint64_t* words = a.words + s * a.layout.words_per_stream();
  const std::uint16_t* scales = a.scales + s * a.layout.scales_per_stream();
  const std::int64_t count_base = (static_cast<std::int64_t>(s) * heads) * ws.chunks + chunk;

  // Active channels in ascending order (the twin's summation order) and their plane units.
  for (int j = tid; j < d; j += kScanThreads)
    slot_depth[j] = a.depths[static_cast<std::int64_t>(s) * d + j];
  __syncthreads();
  if (tid == 0) {
    int slots = 0, units = 0;
    for (int j = 0; j < d; ++j) {
      const int t = slot_depth[j];
      if (t == 0) continue;
      for (int p = 0; p < t && units + p < 4 * d; ++p) unit_code[units + p] = (j << 2) | p;
      slot_channel[slots] = j;
      slot_base[slots] = units;
      units += t;
      ++slots;
    }
    scratch[0] = slots;
    scratch[1] = units;
  }
  __syncthreads();
  const int n_slots = scratch[0], n_units = scratch[1];
  __syncthreads();
  if (tid == 0) {  // slot_depth now becomes per slot (slot_channel[sl] >= sl: no overwrite hazard)
    for (int sl = 0; sl < n_slots; ++sl) slot_depth[sl] = slot_depth[slot_channel[sl]];
  }
  for (int h = tid; h < kMaxGroupHeads; h += kScanThreads) {
    counts[h] = 0;
    thr[h] = 0;
  }
  __syncthreads();
  if (n_units > m.units_cap) {  // depths exceed the budget the launch was sized for
    for (int h = tid; h < heads; h += kScanThreads)
      ws.candidate_counts[count_base + h * ws.chunks] = -1;
    return;
  }
  for (int i = tid; i < heads * n_slots; i += kScanThreads) {
    const int h = i / n_slots, sl = i % n_slots;
    qa[h * d + sl] = a.queries[(static_cast<std::int64_t>(s) * heads + h) * d + slot_channel[sl]];
  }

  for (std::int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const std::int64_t b0 = tile * tb;
    // Stage the tile: runs of tb words per active (channel, plane), tb scales per active channel.
    for (int i = tid; i < n_units * tb; i += kScanThreads) {
      const int u = i / tb, w = i % tb;
      const int code = unit_code[u];
      const std::int64_t block = b0 + w;
      tile_words[i] = block < nb ? words[a.layout.word_index(block, code >> 2, code & 3)] : 0ull;
    }
    for (int i = tid; i < n_slots * tb; i += kScanThreads) {
      const int sl = i / tb, w = i % tb;
      const std::int64_t block = b0 + w;
      tile_scales[i] =
          block < nb ? f16_to_float(scales[a.layout.scale_index(block, slot_channel[sl])]) : 0.0f;
    }
    __syncthreads();
    const int rounds = tb * kBlockTokens / kScanRoundTokens;
    for (int r = 0; r < rounds; ++r) {
      const int local = r * kScanRoundTokens + tid;
      const std::int64_t token = b0 * kBlockTokens + local;
      const int w = local / kBlockTokens, bit = local % kBlockTokens;
      float acc[kMaxGroupHeads];
#pragma unroll
      for (int h = 0; h < kMaxGroupHeads; ++h) acc[h] = 0.0f;
      if (token < n) {
        for (int sl = 0; sl < n_slots; ++sl) {
          const int t = slot_depth[sl];
          const std::uint64_t* uw = tile_words + slot_base[sl] * tb + w;
          std::uint32_t code = 0;
          for (int p = 0; p < t; ++p)
            code = (code << 1) | static_cast<std::uint32_t>((uw[p * tb] >> bit) & 1u);
          const float v = tile_scales[sl * tb + w] * partial_multiplier(code, t);
#pragma unroll
          for (int h = 0; h < kMaxGroupHeads; ++h)
            if (h < heads) acc[h] = fused_multiply_add(qa[h * d + sl], v, acc[h]);
        }
        if (a.scores) {
#pragma unroll
          for (int h = 0; h < kMaxGroupHeads; ++h)
            if (h < heads)
              a.scores[(static_cast<std::int64_t>(s) * heads + h) * a.max_tokens + token] = acc[h];
        }
      }
      if (token >= first_eligible && token < end_eligible) {
#pragma unroll
        for (int h = 0; h < kMaxGroupHeads; ++h) {
          if (h >= heads) break;
          const std::uint64_t key = selection_key(acc[h], static_cast<std::uint32_t>(token));
          if (key > thr[h]) buf[h * m.cap + atomicAdd(&counts[h], 1)] = key;
        }
      }
      __syncthreads();
      for (int h = 0; h < heads; ++h) {
        if (counts[h] > m.cap - kScanRoundTokens) {
          const std::uint64_t kth =
              compact_top<kScanThreads>(buf + h * m.cap, &counts[h], a.keep, hist, scratch);
          if (tid == 0) thr[h] = kth;
          __syncthreads();
        }
      }
      __syncthreads();  // every thread has read counts[] before the next round appends
    }
    __syncthreads();
  }
  for (int h = 0; h < heads; ++h) {
    if (counts[h] > a.keep)
      compact_top<kScanThreads>(buf + h * m.cap, &counts[h], a.keep, hist, scratch);
    const int c = counts[h];
    std::uint64_t* out =
        ws.candidates + (count_base + static_cast<std::int64_t>(h) * ws.chunks) * a.keep;
    for (int i = tid; i < c; i += kScanThreads) out[i] = buf[h * m.cap + i];
    if (tid == 0) ws.candidate_counts[count_base + h * ws.chunks] = c;
  }
}

struct FinalizeSmem {
  int cap = 0, sort_size = 0;
  std::int64_t buf = 0, positions = 0, counts = 0, hist = 0, scratch = 0, total = 0;
};

FinalizeSmem plan_finalize_smem(const PlaneScanArgs& a) {
  FinalizeSmem m;
  int p = 1;
  while (p < a.max_selected()) p <<= 1;
  m.sort_size = p;
  m.cap = a.keep + std::max(a.keep, 4 * kFinalizeThreads);
  std::int64_t off = 0;
  auto take = [&](std::int64_t bytes) {
    const std::int64_t at = off;
    off = align16(off + bytes);
    return at;
  };
  m.buf = take(static_cast<std::int64_t>(m.cap) * 8);
  m.positions = take(static_cast<std::int64_t>(p) * 4);
  m.counts = take(16);
  m.hist = take(256 * 4);
  m.scratch = take(64 * 8);
  m.total = off;
  return m;
}

// One block per stream: merge the chunks' candidates per head into the top `keep`, add sinks and
// the recent window, sort, deduplicate.
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(PlaneScanArgs a, PlaneScanWorkspace ws, FinalizeSmem m) {
  extern __shared__ __align__(16) unsigned char smem[];
  std::uint64_t* buf = reinterpret_cast<std::uint64_t*>(smem + m.buf);
  int* positions = reinterpret_cast<int*>(smem + m.positions);
  int* counts = reinterpret_cast<int*>(smem + m.counts);
  int* hist = reinterpret_cast<int*>(smem + m.hist);
  int* scratch = reinterpret_cast<int*>(smem + m.scratch);
  auto* thr_shared = reinterpret_cast<std::uint64_t*>(scratch + 48);
  const int s = blockIdx.x, tid = threadIdx.x;
  const std::int64_t n = a.lengths[s];
  const std::int64_t first_eligible = n < a.sinks ? n : a.sinks;
  const std::int64_t end_eligible = n - a.recent > first_eligible ? n - a.recent : first_eligible;
  const int fixed = static_cast<int>(first_eligible + (n - end_eligible));
  for (int i = tid; i < fixed; i += kFinalizeThreads)
    positions[i] = i < first_eligible ? i : static_cast<int>(end_eligible + (i - first_eligible));
  int used = fixed;
  bool failed = false;
  for (int h = 0; h < a.heads; ++h) {
    if (tid == 0) {
      counts[0] = 0;
      thr_shared[0] = 0;
    }
    __syncthreads();
    for (int c = 0; c < ws.chunks; ++c) {
      const std::int64_t entry = (static_cast<std::int64_t>(s) * a.heads + h) * ws.chunks + c;
      const int cnt = ws.candidate_counts[entry];
      if (cnt < 0) failed = true;
      const std::uint64_t* cand = ws.candidates + entry * a.keep;
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
    if (counts[0] > a.keep) compact_top<kFinalizeThreads>(buf, &counts[0], a.keep, hist, scratch);
    const int c = counts[0];
    for (int i = tid; i < c; i += kFinalizeThreads)
      positions[used + i] = static_cast<int>(selection_key_position(buf[i]));
    used += c;
    __syncthreads();
  }
  if (failed) {
    if (tid == 0) a.selected_count[s] = -1;
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
  std::int32_t* out = a.selected + s * a.max_selected();
  int written = 0;
  for (int base = 0; base < used; base += kFinalizeThreads) {
    const int i = base + tid;
    const bool flag = i < used && (i == 0 || positions[i] != positions[i - 1]);
    int total = 0;
    const int pos = block_exclusive_count<kFinalizeThreads>(flag, scratch + 2, &total);
    if (flag) out[written + pos] = positions[i];
    written += total;
  }
  if (tid == 0) a.selected_count[s] = written;
}

}  // namespace

void launch_plane_scan_select(const PlaneScanArgs& args, const PlaneScanWorkspace& ws,
                              cudaStream_t stream) {
  if (args.streams == 0) return;
  const ScanSmem scan = plan_scan_smem(args, ws, ws.budget);
  const FinalizeSmem fin = plan_finalize_smem(args);
  if (fin.total > 227 * 1024)
    throw Error("fathom scan: top_k",
                "the final merge of " + std::to_string(args.heads) + " heads x keep " +
                    std::to_string(args.keep) + " needs " + std::to_string(fin.total / 1024) +
                    " KB of shared memory",
                "lower top_k");
  HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(scan_select_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(scan.total)));
  HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(
      finalize_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fin.total)));
  const dim3 grid(static_cast<unsigned>(ws.chunks), static_cast<unsigned>(args.streams));
  scan_select_kernel<<<grid, kScanThreads, static_cast<std::size_t>(scan.total), stream>>>(args, ws,
                                                                                           scan);
  HISPARSE_CUDA_CHECK_LAUNCH();
  finalize_kernel<<<static_cast<unsigned>(args.streams), kFinalizeThreads,
                    static_cast<std::size_t>(fin.total), stream>>>(args, ws, fin);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
