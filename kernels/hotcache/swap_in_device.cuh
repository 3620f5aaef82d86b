// Device pieces shared by the swap-in resolve kernels (swap_in.cu: one block per row;
// swap_in_cluster.cu: one cluster of blocks per row): the selection table's value words, its
// hash, the row statistics, 16-byte async copies and a block-wide exclusive sum.
#pragma once

#include <cstdint>

#include "kernels/hotcache/swap_in.hpp"

namespace hisparse::kernels::swap_in_detail {

constexpr std::uint32_t kNoSlot = 0xffffu;
constexpr std::uint32_t kMissFlag = 0x8000u;

__device__ __forceinline__ int hash_capacity(int top_k) {
  int capacity = 32;
  while (capacity < 2 * top_k) capacity *= 2;
  return capacity;
}

// A 32-bit integer mix of the token: its low bits pick a slot of the hash (and, in the cluster
// resolve, the block whose table holds it).
__device__ __forceinline__ std::uint32_t hash_mix(std::int32_t key) {
  std::uint32_t x = static_cast<std::uint32_t>(key);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ std::uint32_t hash_home(std::int32_t key, std::uint32_t mask) {
  return hash_mix(key) & mask;
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

__device__ __forceinline__ void write_row_stats(const SwapInArgs& a, int row, int hits, int misses,
                                                bool fetched = false) {
  if (a.stats) {
    a.stats[2 * row] = hits;
    a.stats[2 * row + 1] = misses;
  }
  a.plan.count[row] = misses;
  if (a.plan.fetched) a.plan.fetched[row] = fetched ? 1 : 0;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
}

// Exclusive prefix sum of `value` over the block (every thread calls it); `total` gets the sum.
// `scratch` holds two areas of 33 ints used in turn (`parity` counts the calls), so back-to-back
// calls need no extra barrier: an area is rewritten only after two more barriers.
__device__ __forceinline__ int block_exclusive_sum(int value, int* scratch, int& parity,
                                                   int& total) {
  int* area = scratch + 33 * (parity & 1);
  ++parity;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int warps = static_cast<int>(blockDim.x >> 5);
  int inclusive = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  if (lane == 31) area[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? area[lane] : 0;
    int w_inclusive = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, w_inclusive, o);
      if (lane >= o) w_inclusive += up;
    }
    area[lane] = w_inclusive - w;
    if (lane == 31) area[32] = w_inclusive;
  }
  __syncthreads();
  total = area[32];
  return area[warp] + inclusive - value;
}

}  // namespace hisparse::kernels::swap_in_detail
