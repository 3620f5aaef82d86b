// Register-level pieces of the tensor-core plane scan (mma.sync m16n8k32, u8 codes x s8 weights
// -> s32), as plain host/device functions so that the CPU tests can emulate a warp with them.
//
// One warp scores one 64-token block. Per MMA, K = 32 = 8 channel slots x 4 sub-tokens, M = 16
// rows, N = 8 = 2 heads x 4 sub-tokens, with token(row m, sub i) = (m / 8) * 32 + m % 8 + 8 i and
// B block-diagonal over the sub-token: B[(slot c, sub i)][(head e, sub i')] = W[e][c] if i == i'.
// That choice lets a lane build its A registers straight from 32-bit halves of plane words (bytes
// = tokens x, x+8, x+16, x+24 of one channel) with no byte transpose: 2 instructions per plane
// and half word. Lane (g = lane/4, t = lane%4):
//   a0/a1 = slot t, rows g / g + 8 (half 0 / half 1 of the block, x = g); a2/a3 = slot 4 + t;
//   b0/b1 = W[head 2P + g/4][slot t / 4 + t] in byte g % 4, zero elsewhere;
//   c0..c3 = head 2P + t/2, tokens g + 16 (t & 1) + {0, 8, 32, 40}.
// Slots are the active channels ordered by depth (deepest first, then by channel; sign reads last
// of all), so that the four slots a warp builds together have about equal depths; padding slots
// have depth 0 and weight 0. Weights of one scale group live in shared memory as
// [head][t][slot / 4] bytes (slot % 4 = t), so that one 32-bit load gives a lane its b0/b1 of two
// consecutive k-steps. Weights belong to a scale group of 16 blocks; each block's scales enter as
// byte multipliers of its codes. Each slot's plane rows are precomputed (plane_row_offsets), so
// the A registers cost a 16-byte row load per half and 2 instructions per plane and half word.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/fathom/fathom_math.hpp"

#if defined(__CUDA_ARCH__)
#define HISPARSE_FRAGMENT_UNROLL _Pragma("unroll")
#else
#define HISPARSE_FRAGMENT_UNROLL
#endif

namespace hisparse::kernels::fathom::mma {

inline constexpr int kSlotsPerStep = 8;   ///< channel slots per k-step
inline constexpr int kSlotsPerWord = 16;  ///< channel slots per 32-bit weight load (2 k-steps)
inline constexpr int kMaxPairs = kMaxGroupHeads / 2;

/// Slot metadata word: sign read << 20 | depth << 16 | first plane unit of the slot in the tile.
HISPARSE_HD int slot_depth(int info) {
  return (info >> 16) & 0xf;
}
HISPARSE_HD int slot_unit(int info) {
  return info & 0xffff;
}

/// Slot classes in slot order: depth bytes 4, 3, 2, 1, then kSignRead. Depths never rise along
/// the slots (the fragment build takes the first of four slots as the deepest), and the slots
/// that read scales come first, so a scale row per slot serves exactly those.
inline constexpr int kSlotClasses = kPlanes + 1;
HISPARSE_HD std::uint8_t slot_class_byte(int c) {
  return c < kPlanes ? static_cast<std::uint8_t>(kPlanes - c) : kSignRead;
}
/// Classes 0..2 (depths 4, 3, 2) are the deep slots; from class 3 on (depth 1 and sign reads) a
/// slot reads one plane, so the fragment build of a k-step whose slots all lie there needs no
/// plane count (a_fragments' SHALLOW form).
inline constexpr int kDeepSlotClasses = kPlanes - 1;
HISPARSE_HD int slot_info_word(std::uint8_t depth, int unit) {
  return (depth == kSignRead ? 1 << 20 : 0) | (read_planes(depth) << 16) | unit;
}

/// Plane unit code: bank swizzle (slot % 4) << 10 | channel << 2 | plane.
HISPARSE_HD int unit_code_word(int channel, int plane, int slot) {
  return ((slot & 3) << 10) | (channel << 2) | plane;
}
HISPARSE_HD int unit_channel(int code) {
  return (code >> 2) & 0xff;
}
HISPARSE_HD int unit_plane(int code) {
  return code & 3;
}
/// channel x kPlanes + plane: the run's ordinal in PlaneLayout::word_index.
HISPARSE_HD int unit_run(int code) {
  return code & 0x3ff;
}
HISPARSE_HD int unit_swizzle(int code) {
  return code >> 10;
}
/// Column of block w in a tile row of a unit with bank swizzle `swizzle` (its slot % 4). The four
/// lanes t of a warp read the rows of slots 4i + t at the same block, and rows lie a multiple of
/// 128 bytes apart: unswizzled, all four 8-byte loads hit one bank pair (ncu, H200: shared loads
/// 6.6-way conflicted, L1 89-92% busy). XOR by 2 t words keeps cp.async's 16-byte pieces whole
/// and puts the four in distinct bank pairs.
HISPARSE_HD int tile_column(int w, int swizzle) {
  return w ^ (2 * swizzle);
}

/// Orders the active channels of `depths` into slots (classes in slot order, ascending channel
/// within a class; bytes of no class, such as 0, are no slot). Writes slot_channel[slot],
/// slot_info[slot] and unit_code[unit] (unit_code_word); returns the number of slots,
/// *units the number of plane units and *scaled the number of slots that read scales.
HISPARSE_HD int order_slots(const std::uint8_t* depths, int channels, int* slot_channel,
                            int* slot_info, int* unit_code, int* units, int* scaled) {
  int slots = 0, u = 0;
  for (int c = 0; c < kSlotClasses; ++c) {
    if (c == kPlanes) *scaled = slots;
    const std::uint8_t byte = slot_class_byte(c);
    const int d = read_planes(byte);
    for (int j = 0; j < channels; ++j) {
      if (depths[j] != byte) continue;
      slot_channel[slots] = j;
      slot_info[slots] = slot_info_word(byte, u);
      for (int p = 0; p < d; ++p) unit_code[u + p] = unit_code_word(j, p, slots);
      u += d;
      ++slots;
    }
  }
  *units = u;
  return slots;
}

#if defined(__CUDACC__)
/// order_slots by one warp (every lane calls it; same outputs): ballots count the channels of
/// each class, and each channel's slot is the number of channels in earlier classes plus its rank
/// among the channels of its own class. The single-thread loop took about 512 dependent steps at
/// head_dim 128, a fixed cost of every scan block. Unit codes from `unit_cap` on are not written
/// (*units still counts them): a plan over the budget is refused, never staged. *deep (when
/// given): the slots that read two planes or more, which come first (kDeepSlotClasses).
__device__ __forceinline__ int order_slots_warp(const std::uint8_t* depths, int channels,
                                                int* slot_channel, int* slot_info, int* unit_code,
                                                int unit_cap, int* units, int* scaled, int lane,
                                                int* deep = nullptr) {
  int count[kSlotClasses] = {};
  for (int c0 = 0; c0 < channels; c0 += 32) {
    const int j = c0 + lane;
    const std::uint8_t dj = j < channels ? depths[j] : 0;
#pragma unroll
    for (int c = 0; c < kSlotClasses; ++c)
      count[c] += __popc(__ballot_sync(0xffffffffu, dj == slot_class_byte(c)));
  }
  int slot_base[kSlotClasses] = {}, unit_base[kSlotClasses] = {};
  int slots = 0, u = 0;
#pragma unroll
  for (int c = 0; c < kSlotClasses; ++c) {
    slot_base[c] = slots;
    unit_base[c] = u;
    slots += count[c];
    u += count[c] * read_planes(slot_class_byte(c));
  }
  *scaled = slot_base[kPlanes];
  if (deep != nullptr) *deep = slot_base[kDeepSlotClasses];
  const unsigned below = (1u << lane) - 1u;
  for (int c0 = 0; c0 < channels; c0 += 32) {
    const int j = c0 + lane;
    const std::uint8_t dj = j < channels ? depths[j] : 0;
#pragma unroll
    for (int c = 0; c < kSlotClasses; ++c) {
      const std::uint8_t byte = slot_class_byte(c);
      const int d = read_planes(byte);
      const unsigned mask = __ballot_sync(0xffffffffu, dj == byte);
      if (dj == byte) {
        const int rank = __popc(mask & below);
        const int slot = slot_base[c] + rank, unit = unit_base[c] + rank * d;
        slot_channel[slot] = j;
        slot_info[slot] = slot_info_word(byte, unit);
        for (int p = 0; p < d && unit + p < unit_cap; ++p)
          unit_code[unit + p] = unit_code_word(j, p, slot);
      }
      slot_base[c] += __popc(mask);
      unit_base[c] += __popc(mask) * d;
    }
  }
  *units = u;
  return slots;
}
#endif

#if defined(__CUDACC__)
/// c += a x b: one m16n8k32 MMA of unsigned code bytes (A, row) by signed weights (B, col).
__device__ __forceinline__ void mma_u8s8(int (&c)[4], const std::uint32_t (&a)[4],
                                         const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

/// Byte offset of W[head][slot] inside one scale group's weights (slots_pad a multiple of 16).
HISPARSE_HD int weight_index(int head, int slot, int slots_pad) {
  return (head * 4 + slot % 4) * (slots_pad / 4) + slot / 4;
}

/// Rotate right (a funnel shift of the word with itself on the GPU).
HISPARSE_HD std::uint32_t rotate_right(std::uint32_t v, int k) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(v, v, static_cast<unsigned>(k));
#else
  k &= 31;
  return k == 0 ? v : (v >> k) | (v << (32 - k));
#endif
}
/// Adds plane p of the 4 codes in `acc` (bytes = tokens x + 8 i of a 32-token half): bit x + 8 i
/// of the plane lands on bit 8 i + 3 - p. The rotation by x + p - 3 never wraps a bit that is
/// kept (8 i + x lies in 0..31), so one funnel shift and one LOP3 do it.
HISPARSE_HD std::uint32_t add_code_plane(std::uint32_t acc, std::uint32_t half_word, int x, int p) {
  return acc | (rotate_right(half_word, (x + p - 3) & 31) & (0x01010101u << (3 - p)));
}

HISPARSE_HD std::uint32_t byte_permute(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const std::uint64_t v = (static_cast<std::uint64_t>(b) << 32) | a;
  std::uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const unsigned s = (selector >> (4 * k)) & 7u;
    r |= static_cast<std::uint32_t>((v >> (8 * s)) & 0xffu) << (8 * k);
  }
  return r;
#endif
}
/// Selector that moves byte `i` of a word into byte `q` and zeroes the other bytes.
HISPARSE_HD std::uint32_t weight_selector(int i, int q) {
  return (0x4444u & ~(0xFu << (4 * q))) | (static_cast<std::uint32_t>(i) << (4 * q));
}

/// Byte offsets, from a stage's first word, of the tile rows of planes 0..kPlanes-1 of slot
/// `info`: planes past its depth (all four for a padding slot) point at row `zero_row`, a row of
/// zeros that no stage copy writes. The scan keeps them per slot, so that a lane's 16-byte load
/// replaces the slot decoding, row arithmetic and per-lane masks of reading a slot's depth.
HISPARSE_HD void plane_row_offsets(int info, int tile_blocks, int zero_row, int rows[kPlanes]) {
  const int depth = slot_depth(info), unit = slot_unit(info);
  for (int p = 0; p < kPlanes; ++p) rows[p] = 8 * tile_blocks * (p < depth ? unit + p : zero_row);
}

/// sizeof(T) bytes from p (aligned to them) as a little-endian T: one load on the GPU.
template <class T>
HISPARSE_HD T load_little_endian(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  T v = 0;
  for (std::size_t k = 0; k < sizeof(T); ++k) v |= static_cast<T>(p[k]) << (8 * k);
  return v;
#endif
}

/// A registers of `lane` for k-step `ks` of K blocks w0 + k x W_STEP of a tile, each code byte
/// times the block's scale multiplier of its slot (block_mult[k * mult_step + slot], 0..16; the
/// product is at most 240, so a 32-bit multiply scales the four bytes without carries). Rows as
/// plane_row_offsets lays them out (plane_rows[4 slot + p]; stage: the tile's first word;
/// column_bytes: 8 x tile_column(w0, lane % 4)). Slots are ordered deepest first, so a half's
/// plane count is its first slot's depth, the same for the whole warp. Every plane of that
/// count is loaded; a slot that is shallower reads zeros there, so a plane costs one load per
/// block and a funnel shift and a LOP3 per half word, with no per-lane selects. The K blocks lie
/// W_STEP apart; W_STEP is a multiple of 8 (or K is 1), so that their columns w ^ 2 t lie
/// 8 x W_STEP bytes apart too: the XOR changes bits 1-2 of w and the step only bits from 3 up.
/// The K blocks share the slots, so one set of row loads serves them all. SHALLOW: every slot
/// of the k-step reads at most one plane (no slot of kDeepSlotClasses), so the plane count is not
/// read and no branch is taken. At budget 48 about two thirds of a 1M-token scan's halves read
/// one plane (ncu, H200, PERF_LOG 2026-12-04), and there the count, its test and the branch's
/// bookkeeping were about a quarter of a half's instructions.
template <int K, int W_STEP, bool SHALLOW = false>
HISPARSE_HD void a_fragments(const unsigned char* stage, int column_bytes, const int* plane_rows,
                             const int* slot_info, const std::uint8_t* block_mult, int mult_step,
                             int ks, int lane, std::uint32_t (*a)[4]) {
  static_assert(K == 1 || W_STEP % 8 == 0, "the blocks' columns must lie a fixed step apart");
  const int x = lane / 4, t = lane % 4;
  const unsigned char* column = stage + column_bytes;  // one add per plane row below
  HISPARSE_FRAGMENT_UNROLL
  for (int half_slot = 0; half_slot < 2; ++half_slot) {
    const int first = ks * kSlotsPerStep + 4 * half_slot;
    const int planes = SHALLOW ? 1 : slot_depth(slot_info[first]);
    int rows[kPlanes];
    if constexpr (SHALLOW) {
      rows[0] = plane_rows[4 * (first + t)];
    } else {
#if defined(__CUDA_ARCH__)
      const int4 r4 = *reinterpret_cast<const int4*>(plane_rows + 4 * (first + t));
      rows[0] = r4.x;
      rows[1] = r4.y;
      rows[2] = r4.z;
      rows[3] = r4.w;
#else
      for (int p = 0; p < kPlanes; ++p) rows[p] = plane_rows[4 * (first + t) + p];
#endif
    }
    std::uint32_t lo[K], hi[K];
    HISPARSE_FRAGMENT_UNROLL
    for (int k = 0; k < K; ++k) lo[k] = hi[k] = 0;
    const auto add_plane = [&](int p) {
      const unsigned char* row = column + rows[p];
      HISPARSE_FRAGMENT_UNROLL
      for (int k = 0; k < K; ++k) {
        const auto word = load_little_endian<std::uint64_t>(row + 8 * W_STEP * k);
        lo[k] = add_code_plane(lo[k], static_cast<std::uint32_t>(word), x, p);
        hi[k] = add_code_plane(hi[k], static_cast<std::uint32_t>(word >> 32), x, p);
      }
    };
    add_plane(0);  // a padding half (no plane) reads the zero row
    if (!SHALLOW && planes > 1) {
      add_plane(1);
      if (planes > 2) {
        add_plane(2);
        if (planes > 3) add_plane(3);
      }
    }
    HISPARSE_FRAGMENT_UNROLL
    for (int k = 0; k < K; ++k) {
      const std::uint32_t m = block_mult[k * mult_step + first + t];
      a[k][2 * half_slot] = lo[k] * m;
      a[k][2 * half_slot + 1] = hi[k] * m;
    }
  }
}

/// a_fragments for one block (column_bytes: 8 x tile_column(w, lane % 4)).
HISPARSE_HD void a_fragment(const unsigned char* stage, int column_bytes, const int* plane_rows,
                            const int* slot_info, const std::uint8_t* block_mult, int ks, int lane,
                            std::uint32_t a[4]) {
  std::uint32_t one[1][4];
  a_fragments<1, 8>(stage, column_bytes, plane_rows, slot_info, block_mult, 0, ks, lane, one);
  for (int i = 0; i < 4; ++i) a[i] = one[0][i];
}

/// Four bytes from p (4-byte aligned) as a little-endian word: one 32-bit load on the GPU.
HISPARSE_HD std::uint32_t load_word(const std::uint8_t* p) {
  return load_little_endian<std::uint32_t>(p);
}
/// Where `lane`'s weight words of head-pair `pair` start: the word of k-steps 2 ks2, 2 ks2 + 1
/// lies 4 ks2 bytes on (slot 16 ks2 + t sits at byte ks2 x 4 of row (head, t)).
HISPARSE_HD const std::uint8_t* weight_row(const std::uint8_t* block_weights, int slots_pad,
                                           int pair, int lane) {
  return block_weights + weight_index(2 * pair + (lane / 4) / 4, lane % 4, slots_pad);
}
/// The 32-bit weight word of `lane` for head-pair `pair` and k-steps 2 ks2, 2 ks2 + 1.
HISPARSE_HD std::uint32_t weight_word(const std::uint8_t* block_weights, int slots_pad, int pair,
                                      int ks2, int lane) {
  return load_word(weight_row(block_weights, slots_pad, pair, lane) + 4 * ks2);
}
/// b0/b1 of k-step 2 ks2 + odd from that word.
HISPARSE_HD void b_fragment(std::uint32_t word, int odd, int lane, std::uint32_t b[2]) {
  const int q = (lane / 4) % 4;
  b[0] = byte_permute(word, 0u, weight_selector(2 * odd, q));
  b[1] = byte_permute(word, 0u, weight_selector(2 * odd + 1, q));
}

// The constant term of the partial reads, sum_j W_j m_bj o_j per block and head, is one MMA per
// 32 slots for a whole scale group: A'[block][slot] = m_bj |o_j| (u8: at most 16 x 15),
// B'[slot][head] = W[head][slot]; C' is minus the term of each of the group's 16 blocks (rows)
// and 8 heads (columns). K position 4t + i of lane (g, t) holds slot k0 + t + 4i (and 16 + 4t + i
// holds slot k0 + 16 + t + 4i), so that the lane's B' registers are 32-bit words of the weights'
// [head][t][slot / 4] layout. One MMA per group replaces a reduction per block and head.

/// |o| of a slot's depth (slot_info): the byte the kernel keeps per slot for the A' bytes.
HISPARSE_HD std::uint8_t offset_magnitude(int slot_info) {
  return static_cast<std::uint8_t>(-code_offset(slot_depth(slot_info)));
}
/// Bytes m |o| of one block (block_mult: its multiplier per slot; magnitude: |o| per slot) for
/// slots first + 4i, i < 4.
HISPARSE_HD std::uint32_t offset_a_register(const std::uint8_t* block_mult,
                                            const std::uint8_t* magnitude, int first) {
  std::uint32_t v = 0;
  HISPARSE_FRAGMENT_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int slot = first + 4 * i;
    v |= static_cast<std::uint32_t>(block_mult[slot] * magnitude[slot]) << (8 * i);
  }
  return v;
}
/// A' and B' registers of `lane` for slots [k0, k0 + 32) of a scale group whose multipliers are
/// group_mult[block * slots_pad + slot] (16 blocks) and whose weights are group_weights
/// (weight_index). Slots from slots_read on (a multiple of 16) enter as zeros; heads from
/// heads_pad on have no weights (zero columns).
HISPARSE_HD void offset_fragments(const std::uint8_t* group_mult, const std::uint8_t* magnitude,
                                  const std::uint8_t* group_weights, int slots_pad, int heads_pad,
                                  int k0, int slots_read, int lane, std::uint32_t a[4],
                                  std::uint32_t b[2]) {
  const int g = lane / 4, t = lane % 4;
  const bool upper = k0 + kSlotsPerWord < slots_read;
  const std::uint8_t* row0 = group_mult + g * slots_pad;
  const std::uint8_t* row1 = group_mult + (g + 8) * slots_pad;
  a[0] = offset_a_register(row0, magnitude, k0 + t);
  a[1] = offset_a_register(row1, magnitude, k0 + t);
  a[2] = upper ? offset_a_register(row0, magnitude, k0 + kSlotsPerWord + t) : 0u;
  a[3] = upper ? offset_a_register(row1, magnitude, k0 + kSlotsPerWord + t) : 0u;
  b[0] = g < heads_pad ? load_word(group_weights + weight_index(g, k0 + t, slots_pad)) : 0u;
  b[1] = g < heads_pad && upper
             ? load_word(group_weights + weight_index(g, k0 + kSlotsPerWord + t, slots_pad))
             : 0u;
}

/// Token (within the block) of accumulator i of `lane`, and its head within the pair.
HISPARSE_HD int lane_token(int lane, int i) {
  return lane / 4 + 16 * (lane % 2) + 8 * (i & 1) + 32 * (i >> 1);
}
HISPARSE_HD int lane_head(int lane, int pair) {
  return 2 * pair + (lane % 4) / 2;
}

}  // namespace hisparse::kernels::fathom::mma
