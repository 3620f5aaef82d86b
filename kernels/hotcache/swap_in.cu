// CUDA swap-in in two kernels:
//  resolve: one block per batch row. Shared-memory open-addressing hash of the selection (2 x top_k
//           entries, each key with its first selection index and its slot), a scan of the slot
//           table marks hits, block-wide ballot scans number the misses and the evictable slots in
//           LRU order, and the new LRU order is built in shared memory. Writes a miss plan.
//  copy:    a fixed grid (sized to the GPU, not to the misses, so the launch is graph-replayable)
//           cuts every request's plan into chunks of R rows (R from the total miss count) and
//           copies each chunk with several vector loads in flight per thread straight from mapped
//           pinned memory. A chunk never spans two requests, so a block's loads stay within one
//           request's host region (REFERENCE.md section 4: host address translation is the wall).
// The copy kernel is launched with programmatic dependent launch, so its launch overlaps the
// resolve kernel; it waits on griddepcontrol before reading the plan.
#include <cstdint>

#include "core/cuda_check.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "kernels/hotcache/swap_in_config.hpp"

namespace hisparse::kernels {
namespace {
namespace cfg = swap_in_config;

constexpr std::uint32_t kNoSlot = 0xffffu;
constexpr std::uint32_t kMissFlag = 0x8000u;

__device__ __forceinline__ int hash_capacity(int top_k) {
  int capacity = 32;
  while (capacity < 2 * top_k) capacity *= 2;
  return capacity;
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

// Exclusive prefix count of `flag` over the block (all threads must call it); `total` gets the
// block's count. Two barriers: the warp totals are reused by the next call.
__device__ __forceinline__ int block_exclusive_count(bool flag, int* warp_totals, int& total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  total = 0;
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int w = 0; w < warps; ++w) {
    const int t = warp_totals[w];
    before += w < warp ? t : 0;
    total += t;
  }
  __syncthreads();
  return before + __popc(ballot & ((1u << lane) - 1u));
}

__device__ __forceinline__ void write_row_stats(const SwapInArgs& a, int row, int hits,
                                                int misses) {
  if (a.stats) {
    a.stats[2 * row] = hits;
    a.stats[2 * row + 1] = misses;
  }
  a.plan.count[row] = misses;
}

__global__ void __launch_bounds__(cfg::kResolveThreads) swap_in_resolve(SwapInArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the copy kernel's blocks be scheduled now; they wait for this grid before reading.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  extern __shared__ __align__(16) unsigned char smem[];
  const int b = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);
  const int top_k = a.top_k;
  const int hot = a.hot;
  const std::int32_t* sel = a.selected + static_cast<std::size_t>(b) * top_k;
  std::int32_t* out = a.physical_rows + static_cast<std::size_t>(b) * top_k;

  if (b >= *a.num_real) {  // padding row (uniform across the block)
    for (int i = tid; i < top_k; i += nt) out[i] = -1;
    if (tid == 0) write_row_stats(a, b, 0, 0);
    return;
  }
  const int r = a.request_of_row ? a.request_of_row[b] : b;
  const std::int64_t seq_len = a.seq_lens_int64 ? static_cast<const std::int64_t*>(a.seq_lens)[b]
                                                : static_cast<const std::int32_t*>(a.seq_lens)[b];
  const std::int32_t base = r * (hot + 1);

  if (seq_len <= hot) {  // short sequence: token t in slot t
    int valid = 0;
    for (int c = 0; c < top_k; c += nt) {
      const int i = c + tid;
      bool v = false;
      if (i < top_k) {
        const std::int32_t pos = sel[i];
        v = pos >= 0 && pos < seq_len;
        out[i] = v ? base + pos : -1;
      }
      valid += __syncthreads_count(v);
    }
    if (tid == 0) write_row_stats(a, b, valid, 0);
    return;
  }

  const int capacity = hash_capacity(top_k);
  const auto mask = static_cast<std::uint32_t>(capacity - 1);
  const int words = (hot + 31) / 32;
  auto* keys = reinterpret_cast<std::int32_t*>(smem);
  auto* vals = reinterpret_cast<std::uint32_t*>(keys + capacity);
  auto* hit_bits = vals + capacity;
  auto* warp_totals = reinterpret_cast<int*>(hit_bits + words);
  auto* new_lru = reinterpret_cast<std::uint16_t*>(warp_totals + 40);
  auto* evict_slot = new_lru + hot;

  std::int32_t* slot_token = a.hot_buffer.slot_token + static_cast<std::size_t>(r) * hot;
  std::int32_t* lru = a.hot_buffer.lru + static_cast<std::size_t>(r) * hot;
  std::int32_t* plan_token = a.plan.token + static_cast<std::size_t>(b) * top_k;
  std::int32_t* plan_slot = a.plan.slot + static_cast<std::size_t>(b) * top_k;
  const auto newest = static_cast<std::int32_t>(seq_len - 1);

  for (int i = tid; i < capacity; i += nt) {
    keys[i] = -1;
    vals[i] = 0xffffffffu;
  }
  for (int i = tid; i < words; i += nt) hit_bits[i] = 0;
  __syncthreads();

  // 1. Hash the selection (newest and invalid positions excluded).
  int valid = 0;
  for (int c = 0; c < top_k; c += nt) {
    const int i = c + tid;
    bool v = false;
    if (i < top_k) {
      const std::int32_t pos = sel[i];
      v = pos >= 0 && pos < seq_len;
      if (v && pos != newest) hash_insert(keys, vals, mask, pos, i);
    }
    valid += __syncthreads_count(v);
  }

  // 2. Hits: resident tokens found in the hash record their slot.
  int n_hit = 0;
  for (int c = 0; c < hot; c += nt) {
    const int s = c + tid;
    bool hit = false;
    if (s < hot) {
      const std::int32_t token = slot_token[s];
      if (token >= 0) {
        const int h = hash_find(keys, mask, token);
        if (h >= 0) {
          vals[h] = (vals[h] & 0xffff0000u) | static_cast<std::uint32_t>(s);
          atomicOr(&hit_bits[s >> 5], 1u << (s & 31));
          hit = true;
        }
      }
    }
    n_hit += __syncthreads_count(hit);
  }

  // 3. Misses, numbered in selection order (first occurrences only).
  int n_miss = 0;
  for (int c = 0; c < top_k; c += nt) {
    const int i = c + tid;
    bool miss = false;
    int h = -1;
    std::int32_t pos = -1;
    if (i < top_k) {
      pos = sel[i];
      if (pos >= 0 && pos < seq_len && pos != newest) {
        h = hash_find(keys, mask, pos);
        const std::uint32_t v = vals[h];
        miss = (v >> 16) == static_cast<std::uint32_t>(i) && (v & 0xffffu) == kNoSlot;
      }
    }
    int total = 0;
    const int ordinal = n_miss + block_exclusive_count(miss, warp_totals, total);
    if (miss) {
      plan_token[ordinal] = pos;
      vals[h] =
          (static_cast<std::uint32_t>(i) << 16) | kMissFlag | static_cast<std::uint32_t>(ordinal);
    }
    n_miss += total;
  }

  // 4. Walk the LRU order: the m-th evictable slot goes to the m-th miss; build the new order.
  const int n_evictable = hot - n_hit;
  const int n_untouched = n_evictable - n_miss;
  int evictable_before = 0;
  for (int c = 0; c < hot; c += nt) {
    const int p = c + tid;
    bool evictable = false;
    int s = 0;
    if (p < hot) {
      s = lru[p];
      evictable = ((hit_bits[s >> 5] >> (s & 31)) & 1u) == 0;
    }
    int total = 0;
    const int e = evictable_before + block_exclusive_count(evictable, warp_totals, total);
    if (p < hot) {
      const auto slot = static_cast<std::uint16_t>(s);
      if (!evictable) {
        new_lru[n_evictable + (p - e)] = slot;
      } else if (e < n_miss) {
        evict_slot[e] = slot;
        new_lru[n_untouched + e] = slot;
      } else {
        new_lru[e - n_miss] = slot;
      }
    }
    evictable_before += total;
  }
  __syncthreads();

  // 5. Commit the order, the slot table and the plan; output the physical rows.
  for (int p = tid; p < hot; p += nt) lru[p] = new_lru[p];
  for (int m = tid; m < n_miss; m += nt) {
    const int s = evict_slot[m];
    slot_token[s] = plan_token[m];
    plan_slot[m] = s;
  }
  for (int i = tid; i < top_k; i += nt) {
    const std::int32_t pos = sel[i];
    std::int32_t row = -1;
    if (pos >= 0 && pos < seq_len) {
      if (pos == newest) {
        row = base + hot;
      } else {
        const std::uint32_t v = vals[hash_find(keys, mask, pos)] & 0xffffu;
        row = base + static_cast<std::int32_t>((v & kMissFlag) ? evict_slot[v & 0x7fffu] : v);
      }
    }
    out[i] = row;
  }
  if (tid == 0) write_row_stats(a, b, valid - n_miss, n_miss);
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

template <int W>
__global__ void __launch_bounds__(cfg::kCopyThreads, cfg::kCopyBlocksPerSm)
    swap_in_copy(SwapInArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  using Vec = typename VecOf<W>::type;
  extern __shared__ int chunk_start[];  // [batch + 1]
  __shared__ int rows_per_chunk;
  const int batch = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int nt = static_cast<int>(blockDim.x);

  if (tid < 32) {  // warp 0: chunk size from the total miss count, then each row's first chunk
    int total = 0;
    for (int c = 0; c < batch; c += 32) {
      int n = c + tid < batch ? a.plan.count[c + tid] : 0;
      for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
      total += n;
    }
    const int grid = static_cast<int>(gridDim.x);
    const int rows = total > 0 ? (total + grid - 1) / grid : 1;
    int running = 0;
    for (int c = 0; c < batch; c += 32) {
      const int n = c + tid < batch ? a.plan.count[c + tid] : 0;
      const int chunks = (n + rows - 1) / rows;
      int inclusive = chunks;
      for (int o = 1; o < 32; o <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (tid >= o) inclusive += up;
      }
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
  const std::size_t units_per_row = a.copy_bytes / W;

  for (int k = static_cast<int>(blockIdx.x); k < total_chunks; k += static_cast<int>(gridDim.x)) {
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
    const int r = a.request_of_row ? a.request_of_row[b] : b;
    const std::uint8_t* host =
        a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride;
    std::uint8_t* dst = a.hot_buffer.rows + static_cast<std::size_t>(r) *
                                                static_cast<std::size_t>(a.hot + 1) *
                                                a.hot_buffer.row_stride;
    const std::int32_t* tokens = a.plan.token + static_cast<std::size_t>(b) * a.top_k + first_row;
    const std::int32_t* slots = a.plan.slot + static_cast<std::size_t>(b) * a.top_k + first_row;
    const std::size_t units = static_cast<std::size_t>(rows) * units_per_row;

    for (std::size_t u0 = static_cast<std::size_t>(tid); u0 < units;
         u0 += static_cast<std::size_t>(nt) * cfg::kCopyUnroll) {
      Vec v[cfg::kCopyUnroll];
      std::size_t to[cfg::kCopyUnroll];
#pragma unroll
      for (int j = 0; j < cfg::kCopyUnroll; ++j) {
        const std::size_t u = u0 + static_cast<std::size_t>(j) * nt;
        if (u < units) {
          const std::size_t row = u / units_per_row;
          const std::size_t col = (u - row * units_per_row) * W;
          v[j] = *reinterpret_cast<const Vec*>(
              host + static_cast<std::size_t>(tokens[row]) * a.host_pool.row_stride + col);
          to[j] = static_cast<std::size_t>(slots[row]) * a.hot_buffer.row_stride + col;
        }
      }
#pragma unroll
      for (int j = 0; j < cfg::kCopyUnroll; ++j) {
        const std::size_t u = u0 + static_cast<std::size_t>(j) * nt;
        if (u < units) *reinterpret_cast<Vec*>(dst + to[j]) = v[j];
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
void launch_copy(const SwapInArgs& a, int blocks, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(cfg::kCopyThreads);
  config.dynamicSmemBytes = static_cast<std::size_t>(a.batch + 1) * sizeof(int);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = a.use_pdl ? 1 : 0;
  HISPARSE_CUDA_CHECK(cudaLaunchKernelEx(&config, swap_in_copy<W>, a));
}
}  // namespace

void configure_swap_in(int top_k, int hot) {
  const auto needed = static_cast<int>(swap_in_shared_bytes(top_k, hot));
  cudaFuncAttributes attributes{};
  HISPARSE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, swap_in_resolve));
  if (attributes.maxDynamicSharedSizeBytes < needed)
    HISPARSE_CUDA_CHECK(
        cudaFuncSetAttribute(swap_in_resolve, cudaFuncAttributeMaxDynamicSharedMemorySize, needed));
}

void launch_swap_in(const SwapInArgs& a, cudaStream_t stream) {
  if (a.batch <= 0 || a.top_k <= 0) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  HISPARSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) configure_swap_in(a.top_k, a.hot);

  swap_in_resolve<<<static_cast<unsigned>(a.batch), cfg::kResolveThreads,
                    swap_in_shared_bytes(a.top_k, a.hot), stream>>>(a);
  HISPARSE_CUDA_CHECK_LAUNCH();

  int blocks = a.copy_blocks;
  if (blocks <= 0) {
    int device = 0, sms = 0;
    HISPARSE_CUDA_CHECK(cudaGetDevice(&device));
    HISPARSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = sms * cfg::kCopyBlocksPerSm;
  }
  switch (vector_width(a)) {
    case 16:
      launch_copy<16>(a, blocks, stream);
      break;
    case 8:
      launch_copy<8>(a, blocks, stream);
      break;
    case 4:
      launch_copy<4>(a, blocks, stream);
      break;
    case 2:
      launch_copy<2>(a, blocks, stream);
      break;
    default:
      launch_copy<1>(a, blocks, stream);
      break;
  }
}

}  // namespace hisparse::kernels
