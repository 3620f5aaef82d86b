// ResolvePath::cluster: the swap-in resolve of one batch row by a cluster of kClusterBlocks
// blocks on as many SMs (calls below kLargeBatch). The one-block resolve is bound by what one SM
// issues for its 32 warps, about 1 us per phase at batch 1; here every block holds one share of
// the selection, the slot table and the LRU order (blocked, so a block scan numbers its entries
// in order) and one share of the selection's hash table. A token's table entry lives in the block
// picked by the low bits of its hash and is reached through distributed shared memory. Counts
// that a phase needs from every block (valid entries, hits, misses, evictable slots) are
// published by each block into every block's `parts` table; cluster barriers order the phases:
//   1 tables cleared   2 selection inserted   3 hits recorded   4 misses counted
//   5 evictable slots counted (and the misses marked)   6 evicted slots known   7 done
// Results are those of the twin, byte for byte; the plan lists the misses in miss order.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.hpp"
#include "kernels/hotcache/swap_in.hpp"
#include "kernels/hotcache/swap_in_cluster.hpp"
#include "kernels/hotcache/swap_in_config.hpp"
#include "kernels/hotcache/swap_in_device.cuh"

namespace hisparse::kernels {
namespace {
namespace cg = cooperative_groups;
namespace cfg = swap_in_config;
using namespace swap_in_detail;

constexpr int kBlocks = cfg::kClusterBlocks;
constexpr int kThreads = cfg::kClusterThreads;
constexpr int kItems = cfg::kClusterItems;
static_assert((kBlocks & (kBlocks - 1)) == 0, "the block of a token is picked by hash bits");
constexpr int kOwnerBits = kBlocks == 8 ? 3 : kBlocks == 4 ? 2 : kBlocks == 2 ? 1 : 0;

// Rows of `parts`: one int per block of the cluster.
enum Part { kValid = 0, kHits = 1, kMisses = 2, kEvictable = 3 };

// Where token `key` lives: the owning block (low hash bits) and its home slot in that block's
// table (the next bits).
struct Home {
  int owner;
  std::uint32_t slot;
};
__device__ __forceinline__ Home home_of(std::int32_t key, std::uint32_t mask) {
  const std::uint32_t x = hash_mix(key);
  return {static_cast<int>(x & (kBlocks - 1)), (x >> kOwnerBits) & mask};
}

// The selection table spread over the cluster: keys and value words (swap_in_device.cuh) of every
// block, addressed through distributed shared memory.
struct ClusterTable {
  cg::cluster_group cluster;
  std::int32_t* keys;  // this block's; map() reaches another's
  std::uint32_t* vals;
  std::uint32_t mask;

  __device__ __forceinline__ std::int32_t* keys_of(int owner) const {
    return cluster.map_shared_rank(keys, owner);
  }
  __device__ __forceinline__ std::uint32_t* vals_of(int owner) const {
    return cluster.map_shared_rank(vals, owner);
  }
  __device__ __forceinline__ void insert(std::int32_t key, int index) const {
    const Home h = home_of(key, mask);
    std::int32_t* k = keys_of(h.owner);
    std::uint32_t s = h.slot;
    while (true) {
      const std::int32_t prev = atomicCAS(&k[s], -1, key);
      if (prev == -1 || prev == key) {
        atomicMin(&vals_of(h.owner)[s], (static_cast<std::uint32_t>(index) << 16) | kNoSlot);
        return;
      }
      s = (s + 1) & mask;
    }
  }
  // The value word of `key`, or null when it is not in the table.
  __device__ __forceinline__ std::uint32_t* find(std::int32_t key) const {
    const Home h = home_of(key, mask);
    const std::int32_t* k = keys_of(h.owner);
    std::uint32_t s = h.slot;
    while (true) {
      const std::int32_t at = k[s];
      if (at == key) return vals_of(h.owner) + s;
      if (at == -1) return nullptr;
      s = (s + 1) & mask;
    }
  }
};

// Thread 0 writes this block's `value` into row `part` of every block's parts table.
__device__ __forceinline__ void publish(const cg::cluster_group& cluster, int* parts, int part,
                                        int rank, int value) {
  if (threadIdx.x != 0) return;
  for (int q = 0; q < kBlocks; ++q)
    *cluster.map_shared_rank(parts + part * kBlocks + rank, q) = value;
}
// Sum of a published row over the blocks before `rank`, and over all of them.
__device__ __forceinline__ int parts_before(const int* parts, int part, int rank, int* total) {
  int before = 0, all = 0;
#pragma unroll
  for (int q = 0; q < kBlocks; ++q) {
    const int v = parts[part * kBlocks + q];
    before += q < rank ? v : 0;
    all += v;
  }
  *total = all;
  return before;
}

// A block's share [begin, end) of n entries split in shares of `share`, and how many consecutive
// entries each thread holds (blocked: thread t holds begin + t * per + j).
struct Share {
  int begin, end, per;
  __device__ __forceinline__ Share(int rank, int share, int n)
      : begin(min(n, rank * share)),
        end(min(n, (rank + 1) * share)),
        per((share + kThreads - 1) / kThreads) {}
  // Entry j of this thread, or -1 when it has none.
  __device__ __forceinline__ int entry(int j) const {
    const int i = begin + static_cast<int>(threadIdx.x) * per + j;
    return j < per && i < end ? i : -1;
  }
};

__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    swap_in_resolve_cluster(SwapInArgs a, SwapInClusterLayout m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ __align__(16) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int b = static_cast<int>(blockIdx.x) / kBlocks;
  const int tid = static_cast<int>(threadIdx.x);
  const int top_k = a.top_k, hot = a.hot;
  auto* parts = reinterpret_cast<int*>(smem + m.parts);
  int* scratch = reinterpret_cast<int*>(smem + m.scratch);
  int parity = 0;

  // Inputs first: this block's entries of the selection (the slot table and LRU order follow
  // once the request is known).
  const int num_real = *a.num_real;
  const int r = a.request_of_row ? a.request_of_row[b] : b;
  const std::int64_t seq_len = a.seq_lens_int64 ? static_cast<const std::int64_t*>(a.seq_lens)[b]
                                                : static_cast<const std::int32_t*>(a.seq_lens)[b];
  const std::int32_t* sel = a.selected + static_cast<std::size_t>(b) * top_k;
  std::int32_t* out = a.physical_rows + static_cast<std::size_t>(b) * top_k;
  const Share sel_share(rank, m.sel_share, top_k);
  std::int32_t pos[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = sel_share.entry(j);
    pos[j] = i >= 0 ? sel[i] : -1;
  }

  if (b >= num_real) {  // padding row (uniform across the cluster; no block touches another)
#pragma unroll
    for (int j = 0; j < kItems; ++j)
      if (const int i = sel_share.entry(j); i >= 0) out[i] = -1;
    if (rank == 0 && tid == 0) write_row_stats(a, b, 0, 0);
    return;
  }
  const std::int32_t base = r * (hot + 1);
  int total = 0;

  if (seq_len <= hot) {  // short sequence: token t in slot t
    int my_valid = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int i = sel_share.entry(j);
      if (i < 0) continue;
      const bool ok = pos[j] >= 0 && pos[j] < seq_len;
      my_valid += ok ? 1 : 0;
      out[i] = ok ? base + pos[j] : -1;
    }
    block_exclusive_sum(my_valid, scratch, parity, total);
    publish(cluster, parts, kValid, rank, total);
    cluster.sync();  // block 0 reads the counts; the others may leave
    if (rank == 0 && tid == 0) {
      int valid = 0;
      parts_before(parts, kValid, 0, &valid);
      write_row_stats(a, b, valid, 0);
    }
    return;
  }

  std::int32_t* slot_token = a.hot_buffer.slot_token + static_cast<std::size_t>(r) * hot;
  std::int32_t* lru = a.hot_buffer.lru + static_cast<std::size_t>(r) * hot;
  const Share slot_share(rank, m.slot_share, hot), lru_share(rank, m.lru_share, hot);
  std::int32_t slot_tok[kItems], lru_slot[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int s = slot_share.entry(j), p = lru_share.entry(j);
    slot_tok[j] = s >= 0 ? slot_token[s] : -1;
    lru_slot[j] = p >= 0 ? lru[p] : -1;
  }
  const auto newest = static_cast<std::int32_t>(seq_len - 1);
  const ClusterTable table{cluster, reinterpret_cast<std::int32_t*>(smem + m.keys),
                           reinterpret_cast<std::uint32_t*>(smem + m.vals),
                           static_cast<std::uint32_t>(m.capacity - 1)};
  auto* hit_bits = reinterpret_cast<std::uint32_t*>(smem + m.hit_bits);
  for (int i = tid; i < m.capacity; i += kThreads) {
    table.keys[i] = -1;
    table.vals[i] = 0xffffffffu;
  }
  for (int i = tid; i < m.slot_share / 32; i += kThreads) hit_bits[i] = 0;
  cluster.sync();  // 1: every table is empty before any block inserts

  // Selection into the tables (newest and invalid positions excluded); valid entries counted.
  int my_valid = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = sel_share.entry(j);
    if (i < 0 || pos[j] < 0 || pos[j] >= seq_len) continue;
    ++my_valid;
    if (pos[j] != newest) table.insert(pos[j], i);
  }
  block_exclusive_sum(my_valid, scratch, parity, total);
  publish(cluster, parts, kValid, rank, total);
  cluster.sync();  // 2: the selection is in the tables

  // Hits: this block's resident tokens found in the tables record their slot.
  int my_hits = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int s = slot_share.entry(j);
    if (s < 0 || slot_tok[j] < 0 || slot_tok[j] >= seq_len) continue;
    std::uint32_t* w = table.find(slot_tok[j]);
    if (w == nullptr) continue;
    *w = (*w & 0xffff0000u) | static_cast<std::uint32_t>(s);  // one slot per token: no race
    const int local = s - slot_share.begin;
    atomicOr(&hit_bits[local >> 5], 1u << (local & 31));
    ++my_hits;
  }
  block_exclusive_sum(my_hits, scratch, parity, total);
  publish(cluster, parts, kHits, rank, total);
  cluster.sync();  // 3: hits recorded

  // Misses, numbered in selection order (first occurrences): this block's count first.
  std::uint32_t* word[kItems];
  bool miss[kItems];
  int count = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = sel_share.entry(j);
    word[j] = nullptr;
    miss[j] = false;
    if (i < 0 || pos[j] < 0 || pos[j] >= seq_len || pos[j] == newest) continue;
    word[j] = table.find(pos[j]);
    const std::uint32_t w = *word[j];
    miss[j] = (w >> 16) == static_cast<std::uint32_t>(i) && (w & 0xffffu) == kNoSlot;
    count += miss[j] ? 1 : 0;
  }
  const int local_ordinal = block_exclusive_sum(count, scratch, parity, total);
  publish(cluster, parts, kMisses, rank, total);
  cluster.sync();  // 4: every block's miss count is known

  int n_miss = 0, n_hit = 0, valid = 0;
  const int miss_base = parts_before(parts, kMisses, rank, &n_miss);
  parts_before(parts, kHits, rank, &n_hit);
  parts_before(parts, kValid, rank, &valid);
  const int my_misses = parts[kMisses * kBlocks + rank];
  // The cluster fetches the row itself when every block's misses fit its staging (uniform).
  bool fetch = m.fetch_rows > 0 && a.plan.fetched != nullptr;
#pragma unroll
  for (int q = 0; q < kBlocks; ++q) fetch = fetch && parts[kMisses * kBlocks + q] <= m.fetch_rows;
  auto* fetch_token = reinterpret_cast<std::int32_t*>(smem + m.fetch_token);
  int ordinal = miss_base + local_ordinal;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (!miss[j]) continue;
    const int i = sel_share.entry(j);
    *word[j] =
        (static_cast<std::uint32_t>(i) << 16) | kMissFlag | static_cast<std::uint32_t>(ordinal);
    if (fetch) fetch_token[ordinal - miss_base] = pos[j];
    ++ordinal;
  }
  const auto units_per_row = static_cast<int>(a.copy_bytes / 16);
  auto* staged = reinterpret_cast<uint4*>(smem + m.staged);
  if (fetch) {  // host reads in flight through the LRU walk (a warp on 512 contiguous bytes)
    __syncthreads();
    const std::uint8_t* host_row0 =
        a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride;
    for (int u = tid; u < my_misses * units_per_row; u += kThreads) {
      const int k = u / units_per_row;
      cp_async16(staged + u, host_row0 +
                                 static_cast<std::size_t>(fetch_token[k]) * a.host_pool.row_stride +
                                 16 * static_cast<std::size_t>(u - k * units_per_row));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }

  // Evictable slots of this block's share of the LRU order (hit bits live with the slot's block).
  bool evictable[kItems];
  count = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    evictable[j] = false;
    if (lru_share.entry(j) < 0) continue;
    const int s = lru_slot[j];
    const int owner = s / m.slot_share, local = s - owner * m.slot_share;
    const std::uint32_t bits = *cluster.map_shared_rank(hit_bits + (local >> 5), owner);
    evictable[j] = ((bits >> (local & 31)) & 1u) == 0;
    count += evictable[j] ? 1 : 0;
  }
  const int local_evictable = block_exclusive_sum(count, scratch, parity, total);
  publish(cluster, parts, kEvictable, rank, total);
  cluster.sync();  // 5: evictable counts known; the miss marks are visible

  // New LRU order (untouched oldest first, then this step's misses, then the hits in their old
  // order), written straight to the request's table: every block read its share before step 1.
  // The m-th evictable slot goes to the m-th miss (block 0 holds that list).
  auto* evict = reinterpret_cast<std::uint16_t*>(smem + m.evict);
  std::uint16_t* evict0 = cluster.map_shared_rank(evict, 0);
  const int n_evictable = hot - n_hit, n_untouched = n_evictable - n_miss;
  int e = parts_before(parts, kEvictable, rank, &total) + local_evictable;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int p = lru_share.entry(j);
    if (p < 0) continue;
    const int s = lru_slot[j];
    int to = 0;
    if (!evictable[j]) {
      to = n_evictable + (p - e);
    } else {
      if (e < n_miss) {
        evict0[e] = static_cast<std::uint16_t>(s);
        to = n_untouched + e;
      } else {
        to = e - n_miss;
      }
      ++e;
    }
    lru[to] = s;
  }
  cluster.sync();  // 6: every miss's slot is in block 0's list

  std::uint8_t* rows = a.hot_buffer.rows;
  if (fetch) {  // this block's fetched rows land in their slots
    for (int k = tid; k < my_misses; k += kThreads) fetch_token[k] = evict0[miss_base + k];
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    for (int u = tid; u < my_misses * units_per_row; u += kThreads) {
      const int k = u / units_per_row;
      const std::size_t row = static_cast<std::size_t>(base) + fetch_token[k];
      *reinterpret_cast<uint4*>(rows + row * a.hot_buffer.row_stride +
                                16 * static_cast<std::size_t>(u - k * units_per_row)) = staged[u];
    }
  }

  // Commit: slot table, plan (miss order) and physical rows of this block's selection entries.
  std::int32_t* plan_token = a.plan.token + static_cast<std::size_t>(b) * top_k;
  std::int32_t* plan_slot = a.plan.slot + static_cast<std::size_t>(b) * top_k;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = sel_share.entry(j);
    if (i < 0) continue;
    std::int32_t row = -1;
    if (pos[j] >= 0 && pos[j] < seq_len) {
      if (pos[j] == newest) {
        row = base + hot;
      } else {
        const std::uint32_t w = *table.find(pos[j]);
        if (w & kMissFlag) {
          const int k = static_cast<int>(w & 0x7fffu);
          const int slot = evict0[k];
          row = base + slot;
          if ((w >> 16) == static_cast<std::uint32_t>(i)) {  // the first occurrence commits
            slot_token[slot] = pos[j];
            plan_token[k] = pos[j];
            plan_slot[k] = slot;
          }
        } else {
          row = base + static_cast<std::int32_t>(w & 0xffffu);
        }
      }
    }
    out[i] = row;
  }
  if (rank == 0 && tid == 0) write_row_stats(a, b, valid - n_miss, n_miss, fetch);
  cluster.sync();  // 7: no block leaves while another may still read its shared memory
#else
  (void)a;
  (void)m;
#endif
}

}  // namespace

SwapInClusterLayout swap_in_cluster_launch_layout(const SwapInArgs& a) {
  const bool whole_vectors = a.copy_bytes % 16 == 0 && a.host_pool.row_stride % 16 == 0 &&
                             a.host_pool.request_stride % 16 == 0 &&
                             a.hot_buffer.row_stride % 16 == 0 &&
                             reinterpret_cast<std::uintptr_t>(a.host_pool.base) % 16 == 0 &&
                             reinterpret_cast<std::uintptr_t>(a.hot_buffer.rows) % 16 == 0;
  const int fetch_bytes = a.plan.fetched == nullptr || !whole_vectors ? 0
                          : a.cluster_fetch_bytes > 0                 ? a.cluster_fetch_bytes
                                                                      : cfg::kClusterFetchBytes;
  return swap_in_cluster_layout(a.top_k, a.hot, a.copy_bytes, fetch_bytes);
}

bool swap_in_uses_cluster(const SwapInArgs& a) {
  const int sort_from = a.sort_misses_from >= 0
                            ? a.sort_misses_from
                            : (a.batch >= cfg::kLargeBatch ? cfg::kSortMissesFrom : 0);
  return a.resolve == ResolvePath::cluster && a.batch < cfg::kLargeBatch && sort_from == 0 &&
         a.phase_stamps == nullptr && swap_in_cluster_fits(a.top_k, a.hot);
}

void configure_swap_in_cluster() {
  HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(swap_in_resolve_cluster,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           cfg::kMaxResolveSharedBytes));
}

void launch_swap_in_resolve_cluster(const SwapInArgs& a, cudaStream_t stream) {
  const SwapInClusterLayout m = swap_in_cluster_launch_layout(a);
  swap_in_resolve_cluster<<<static_cast<unsigned>(a.batch * kBlocks), kThreads, m.total, stream>>>(
      a, m);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels
