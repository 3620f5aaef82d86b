// The copy role of the host-plane staging (PlaneStaging in plane_scan.hpp), as a device routine:
// run by the scan kernel's first `copy_blocks` blocks to start (their role comes from a ticket,
// so the copy is always resident before any scan block can wait for it) and by the diagnostic
// copy-only kernel of plane_stage.cu. Every copy block serves a few streams (or, with more
// blocks than streams, one share of one stream): one warp per stream plans or loads its depths
// and orders its plane units with mma::order_slots_warp, the scan's own function, so that unit
// ordinal u means the same (channel, plane) on both sides. Then, stream by stream and
// rounds_per_copy rounds at a time, the block copies its share of every active unit's run and
// every active channel's scales, 16 bytes per load with kStageUnroll loads in flight per thread,
// and adds 1 to each of those rounds' flags with release semantics.
#pragma once

#include <cstdint>

#include "kernels/common/global_timer.cuh"
#include "kernels/fathom/depth_plan_warp.cuh"
#include "kernels/fathom/plane_scan_config.hpp"
#include "kernels/fathom/plane_scan_fragments.hpp"
#include "kernels/fathom/plane_stage.hpp"

namespace hisparse::kernels::fathom::stage_detail {

// Shared memory of one stream's unit table: unit codes (up to 4 per channel), slot channels,
// slot infos (order_slots writes them), the counts, and the depths.
struct StreamTable {
  int* unit_code;
  int* slot_channel;
  int* slot_info;
  int* counts;  // [0] slots that read scales, [1] units (0 when the depths exceed the budget)
  std::uint8_t* depths;
};
__device__ inline StreamTable stream_table(unsigned char* smem, int local, int channels) {
  unsigned char* at = smem + local * stage_table_bytes(channels);
  auto* ints = reinterpret_cast<int*>(at);
  return {ints, ints + kPlanes * channels, ints + (kPlanes + 1) * channels,
          ints + (kPlanes + 2) * channels,
          at + (static_cast<std::int64_t>(kPlanes + 2) * channels + 4) * 4};
}

// Share `part` of `parts` of runs x pieces 16-byte pieces: piece k of run r comes from
// source(r, k) and goes to dest[r * dest_stride + k] (strides and offsets in 16-byte pieces, so
// the kStageUnroll destinations in flight are 32-bit offsets).
template <int THREADS, class Source>
__device__ __forceinline__ void copy_runs(int runs, int pieces, int part, int parts, Source source,
                                          uint4* dest, std::int64_t dest_stride) {
  const int total = runs * pieces;
  const int begin = static_cast<int>(static_cast<std::int64_t>(total) * part / parts);
  const int end = static_cast<int>(static_cast<std::int64_t>(total) * (part + 1) / parts);
  const auto stride = static_cast<unsigned>(dest_stride);
  for (int base = begin + static_cast<int>(threadIdx.x); base < end;
       base += THREADS * kStageUnroll) {
    uint4 v[kStageUnroll];
    unsigned to[kStageUnroll];
#pragma unroll
    for (int j = 0; j < kStageUnroll; ++j) {
      const int p = base + j * THREADS;
      if (p >= end) continue;
      const int r = p / pieces, k = p - r * pieces;
      v[j] = *reinterpret_cast<const uint4*>(source(r, k));
      to[j] = static_cast<unsigned>(r) * stride + static_cast<unsigned>(k);
    }
#pragma unroll
    for (int j = 0; j < kStageUnroll; ++j)
      if (base + j * THREADS < end) dest[to[j]] = v[j];
  }
}

// Inlined: as a called function (its own registers, no spills) the staged scan took 1.83 ms
// instead of 1.42 ms (1M tokens x 8 streams, budget 48, H200).
template <int THREADS>
__device__ __forceinline__ void stage_copy_block(const PlaneScanArgs& a, const PlaneStaging& st,
                                                 int chunks, int tile_blocks, int index,
                                                 unsigned char* smem) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int d = a.layout.channels;
  if (st.copy_clock != nullptr && tid == 0) atomicMin(st.copy_clock, global_timer_ns());
  // Block g serves streams g % lanes, + lanes, ... and share g / lanes of each of their rounds
  // (with more blocks than streams, lanes = streams and every block has one stream).
  const int lanes = st.copy_blocks / st.parts;
  const int first = index % lanes, part = index / lanes;
  const int local = (a.streams - first + lanes - 1) / lanes;

  for (int i = warp; i < local; i += THREADS / 32) {
    const int s = first + i * lanes;
    const StreamTable t = stream_table(smem, i, d);
    if (a.plan_variances != nullptr) {
      plan_stream_warp_lean_any(a.plan_args(nullptr), s, lane, t.depths);
    } else {
      for (int j = lane; j < d; j += 32)
        t.depths[j] = a.depths[static_cast<std::int64_t>(s) * d + j];
    }
    __syncwarp();
    int units = 0, scaled = 0;
    mma::order_slots_warp(t.depths, d, t.slot_channel, t.slot_info, t.unit_code, kPlanes * d,
                          &units, &scaled, lane);
    if (lane == 0) {
      // Over budget: the scan reports the failure; nothing is copied (the rounds still land).
      // Scales: only the slots that read them (the first `scaled`; sign reads have none).
      t.counts[0] = units <= st.units_cap ? scaled : 0;
      t.counts[1] = units <= st.units_cap ? units : 0;
    }
  }
  __syncthreads();

  // Stream by stream, each one's rounds in order: the scan blocks start in stream order (their
  // tickets), so with more streams than fit one wave of scan blocks the first wave's streams
  // land first and the later waves' scan runs beside the copy instead of after it. (With one
  // stream per copy block the order is the same either way.)
  const std::int64_t round_blocks = static_cast<std::int64_t>(chunks) * tile_blocks;
  for (int i = 0; i < local; ++i) {
    const int s = first + i * lanes;
    const std::int64_t nb = (a.lengths[s] + kBlockTokens - 1) / kBlockTokens;
    for (int r = 0; r < st.rounds; r += st.rounds_per_copy) {
      const std::int64_t b0 = r * round_blocks;
      if (b0 >= nb) break;  // no scan block of this stream waits for these rounds
      const std::int64_t b1 = min(b0 + st.rounds_per_copy * round_blocks, nb);
      // Whole 16-byte pieces, as the scan stages them: 2 blocks of words, 8 blocks of scales.
      const int word_pieces = static_cast<int>((b1 - b0 + 1) / 2);
      const int scale_pieces = static_cast<int>((b1 - b0 + 7) / 8);
      const StreamTable t = stream_table(smem, i, d);
      const int scaled_slots = t.counts[0], units = t.counts[1];
      // Run u of the words lies at unit_code[u]'s (channel, plane) on the host and at row u of
      // the staging; run sl of the scales at slot_channel[sl] and row sl. Each block copies its
      // contiguous share of both (whole runs where it can).
      const std::uint64_t* words = a.words + s * a.layout.words_per_stream();
      copy_runs<THREADS>(
          units, word_pieces, part, st.parts,
          [words, layout = a.layout, codes = t.unit_code, b0](int u, int k) {
            const int code = codes[u];
            return words +
                   layout.word_index(b0 + 2 * k, mma::unit_channel(code), mma::unit_plane(code));
          },
          reinterpret_cast<uint4*>(
              st.words + (static_cast<std::int64_t>(s) * st.units_cap) * st.blocks_cap + b0),
          st.blocks_cap / 2);
      const std::uint16_t* scales = a.scales + s * a.layout.scales_per_stream();
      copy_runs<THREADS>(
          scaled_slots, scale_pieces, part, st.parts,
          [scales, layout = a.layout, channels = t.slot_channel, b0](int sl, int k) {
            return scales + layout.scale_index(b0 + 8 * k, channels[sl]);
          },
          reinterpret_cast<uint4*>(
              st.scales + (static_cast<std::int64_t>(s) * st.slots_cap) * st.blocks_cap + b0),
          st.blocks_cap / 8);
      __syncthreads();  // every store of this share is issued (and ordered before the release)
      if (tid < st.rounds_per_copy && r + tid < st.rounds) {
        int* flag = st.landed + static_cast<std::int64_t>(s) * st.rounds + r + tid;
        asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
      }
    }
  }
  if (st.copy_clock != nullptr) {
    __syncthreads();  // the block's last stores are issued
    if (tid == 0) atomicMax(st.copy_clock + 1, global_timer_ns());
  }
}

}  // namespace hisparse::kernels::fathom::stage_detail
