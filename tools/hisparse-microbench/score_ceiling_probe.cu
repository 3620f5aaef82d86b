#include "score_ceiling_probe.hpp"

#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/common/cp_async.cuh"
#include "kernels/fathom/plane_scan_fragments.hpp"

namespace hisparse::microbench {
namespace {
namespace kf = kernels::fathom;
namespace mma = kernels::fathom::mma;
using kernels::cp_async16;
using kernels::cp_async_commit;
using kernels::cp_async_wait;

// WARPS warps per block share each staged 16-block superblock, so a warp scores 16 / WARPS blocks
// of it as independent MMA chains: 8 warps (the full scan's shape) take 2, 4 warps take 4. Either
// way the register cap is 128 (512 threads per SM).
constexpr int kSb = kf::kSuperblockBlocks;
template <int WARPS>
constexpr int kThreadsOf = 32 * WARPS;

// Shared memory: the int8 weights (mma::weight_index layout), then two stages of one superblock's
// words ([slot][mma::tile_column(block, slot % 4)]: bank-swizzled) and scales ([slot][16]).
struct CeilingSmem {
  int weights = 0, words = 0, scales = 0, stage = 0, total = 0;
};
__host__ __device__ inline CeilingSmem ceiling_smem(int slots) {
  CeilingSmem m;
  m.weights = 0;
  m.words = (kCeilingHeads * slots + 15) / 16 * 16;
  m.scales = m.words + slots * kSb * 8;
  m.stage = slots * kSb * 10;
  m.total = m.words + 2 * m.stage;
  return m;
}

template <CeilingWork WORK, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, 16 / WARPS)
    score_ceiling_kernel(ScoreCeilingArgs a, int chunks) {
  constexpr int kThreads = kThreadsOf<WARPS>, kPerWarp = kSb / WARPS;
  extern __shared__ __align__(16) unsigned char smem[];
  const CeilingSmem m = ceiling_smem(a.slots);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int s = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.x);
  const int slots = a.slots;
  const auto superblocks = static_cast<int>(a.tokens / (kSb * kf::kBlockTokens));
  const int sb_begin = static_cast<int>(static_cast<std::int64_t>(superblocks) * chunk / chunks);
  const int sb_end =
      static_cast<int>(static_cast<std::int64_t>(superblocks) * (chunk + 1) / chunks);

  std::uint8_t* wts = smem + m.weights;
  for (int i = tid; i < kCeilingHeads * slots; i += kThreads) {
    const int h = i / slots, sl = i % slots;
    reinterpret_cast<std::int8_t*>(wts)[mma::weight_index(h, sl, slots)] = a.weights[i];
  }
  const std::uint64_t* words = a.words + static_cast<std::int64_t>(s) * a.layout.words_per_stream();
  const std::uint16_t* scales =
      a.scales + static_cast<std::int64_t>(s) * a.layout.scales_per_stream();
  // One superblock: 8 pieces of 16 bytes per slot's plane-0 unit (128 B), 2 per slot's scales.
  auto stage = [&](int sb, int st) {
    auto* dw = reinterpret_cast<std::uint64_t*>(smem + m.words + st * m.stage);
    auto* ds = reinterpret_cast<std::uint16_t*>(smem + m.scales + st * m.stage);
    const std::int64_t b0 = static_cast<std::int64_t>(sb) * kSb;
    for (int i = tid; i < slots * 10; i += kThreads) {
      if (i < slots * 8) {
        const int sl = i >> 3, c = i & 7;
        cp_async16(dw + sl * kSb + mma::tile_column(2 * c, sl & 3),
                   words + a.layout.word_index(b0 + 2 * c, sl, 0));
      } else {
        const int j = i - slots * 8, sl = j >> 1, c = j & 1;
        cp_async16(ds + sl * kSb + 8 * c, scales + a.layout.scale_index(b0 + 8 * c, sl));
      }
    }
    cp_async_commit();
  };

  int passed = 0;  // wraps modulo 2^32 in expand_only, like the twin's sum
  std::uint64_t checksum = 0;
  if (sb_begin < sb_end) stage(sb_begin, 0);
  for (int sb = sb_begin, it = 0; sb < sb_end; ++sb, ++it) {
    const int st = it & 1;
    if (sb + 1 < sb_end) {
      stage(sb + 1, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const auto* tw = reinterpret_cast<const std::uint64_t*>(smem + m.words + st * m.stage);
    const auto* ts = reinterpret_cast<const std::uint16_t*>(smem + m.scales + st * m.stage);
    if constexpr (WORK == CeilingWork::stage_only) {
      for (int i = tid; i < slots * kSb; i += kThreads) {  // any order: every word once
        passed += (tw[i] != 0) + (ts[i] != 0);
        checksum ^= tw[i];
      }
    } else {
      // Warp `warp` scores blocks warp + k * WARPS of the superblock (independent chains).
      const int x = lane / 4, t = lane % 4;
      int acc[kPerWarp][2][4] = {};
      for (int ks2 = 0; ks2 < slots / mma::kSlotsPerWord; ++ks2) {
        std::uint32_t wword[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) wword[p] = mma::weight_word(wts, slots, p, ks2, lane);
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          std::uint32_t af[kPerWarp][4];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int slot = (2 * ks2 + odd) * mma::kSlotsPerStep + 4 * half + t;
#pragma unroll
            for (int k = 0; k < kPerWarp; ++k) {
              const int w = warp + k * WARPS;
              const std::uint64_t word = tw[slot * kSb + mma::tile_column(w, t)];
              if constexpr (WORK == CeilingWork::mask_only) {
                const std::uint32_t keep = 0x01010101u << x;
                af[k][2 * half] = static_cast<std::uint32_t>(word) & keep;
                af[k][2 * half + 1] = static_cast<std::uint32_t>(word >> 32) & keep;
                continue;
              }
              const auto mult =
                  WORK == CeilingWork::unscaled
                      ? 1u
                      : static_cast<std::uint32_t>(ceiling_multiplier(ts[slot * kSb + w]));
              af[k][2 * half] =
                  mma::add_code_plane(0u, static_cast<std::uint32_t>(word), x, 0) * mult;
              af[k][2 * half + 1] =
                  mma::add_code_plane(0u, static_cast<std::uint32_t>(word >> 32), x, 0) * mult;
            }
          }
          if constexpr (WORK == CeilingWork::expand_only) {
            // Every (token, slot) byte is in exactly one lane's register: their sum is exact.
#pragma unroll
            for (int k = 0; k < kPerWarp; ++k)
#pragma unroll
              for (int r = 0; r < 4; ++r)
                passed = __dp4a(af[k][r], 0x01010101u, static_cast<unsigned>(passed));
          } else {
#pragma unroll
            for (int p = 0; p < 2; ++p) {
              std::uint32_t bf[2];
              mma::b_fragment(wword[p], odd, lane, bf);
#pragma unroll
              for (int k = 0; k < kPerWarp; ++k) mma::mma_u8s8(acc[k][p], af[k], bf);
            }
          }
        }
      }
      if constexpr (WORK != CeilingWork::expand_only) {
#pragma unroll
        for (int k = 0; k < kPerWarp; ++k)
#pragma unroll
          for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              // mask_only: every sum of this lane's rows (x = lane / 4) is 2^x / 8 times the
              // unscaled one, exactly (|sum| < 2^23, so the products fit).
              const bool pass = WORK == CeilingWork::mask_only
                                    ? acc[k][p][i] * 8 >= a.threshold * (1 << x)
                                    : acc[k][p][i] >= a.threshold;
              passed += pass ? 1 : 0;
            }
      }
    }
    __syncthreads();  // every warp has read this stage before it is refilled
  }
  if constexpr (WORK == CeilingWork::stage_only)
    passed += (checksum == 0x0123456789abcdefull) ? 1 : 0;  // keeps the reads (never true here)
  passed = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(passed));
  if (lane == 0 && passed != 0) atomicAdd(a.counts + s, passed);
}

template <CeilingWork WORK, int WARPS>
void configure(const CeilingSmem& m) {
  HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(score_ceiling_kernel<WORK, WARPS>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, m.total));
}

void check(const ScoreCeilingArgs& a) {
  if (a.slots <= 0 || a.slots % 16 != 0 || a.slots > kf::kMaxChannels ||
      a.slots > a.layout.channels)
    throw Error("score ceiling probe: slots", std::to_string(a.slots),
                "use a multiple of 16 up to the layout's channels");
  if (a.tokens <= 0 || a.tokens % (kSb * kf::kBlockTokens) != 0 ||
      a.layout.kind != kf::PlaneLayoutKind::hbm)
    throw Error("score ceiling probe: planes", "not whole superblocks in the HBM layout",
                "use tokens that are a multiple of 1024 and the hbm layout");
  if (a.layout.capacity_blocks * kf::kBlockTokens < a.tokens)
    throw Error("score ceiling probe: planes",
                std::to_string(a.tokens) + " tokens in a layout of " +
                    std::to_string(a.layout.capacity_blocks) + " blocks",
                "give the layout at least tokens / 64 blocks");
  if (a.warps != 4 && a.warps != 8)
    throw Error("score ceiling probe: warps", std::to_string(a.warps), "use 4 or 8");
}

template <CeilingWork WORK, int WARPS>
void launch_work(const ScoreCeilingArgs& a, int chunks, cudaStream_t stream) {
  const CeilingSmem m = ceiling_smem(a.slots);
  configure<WORK, WARPS>(m);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(a.streams));
  score_ceiling_kernel<WORK, WARPS>
      <<<grid, kThreadsOf<WARPS>, static_cast<std::size_t>(m.total), stream>>>(a, chunks);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

template <CeilingWork WORK>
void launch_warps(const ScoreCeilingArgs& a, int chunks, cudaStream_t stream) {
  if (a.warps == 4) return launch_work<WORK, 4>(a, chunks, stream);
  launch_work<WORK, 8>(a, chunks, stream);
}

template <int WARPS>
int resident_blocks(const CeilingSmem& m) {
  configure<CeilingWork::score, WARPS>(m);
  int blocks = 0;
  HISPARSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, score_ceiling_kernel<CeilingWork::score, WARPS>, kThreadsOf<WARPS>,
      static_cast<std::size_t>(m.total)));
  return blocks;
}

}  // namespace

void launch_score_ceiling(const ScoreCeilingArgs& a, int chunks, cudaStream_t stream) {
  check(a);
  switch (a.work) {
    case CeilingWork::score:
      return launch_warps<CeilingWork::score>(a, chunks, stream);
    case CeilingWork::unscaled:
      return launch_warps<CeilingWork::unscaled>(a, chunks, stream);
    case CeilingWork::mask_only:
      return launch_warps<CeilingWork::mask_only>(a, chunks, stream);
    case CeilingWork::expand_only:
      return launch_warps<CeilingWork::expand_only>(a, chunks, stream);
    case CeilingWork::stage_only:
      return launch_warps<CeilingWork::stage_only>(a, chunks, stream);
  }
}

int score_ceiling_resident_blocks(const ScoreCeilingArgs& a) {
  check(a);
  const CeilingSmem m = ceiling_smem(a.slots);
  return a.warps == 4 ? resident_blocks<4>(m) : resident_blocks<8>(m);
}

}  // namespace hisparse::microbench
