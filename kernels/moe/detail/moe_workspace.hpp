// The tensor-core MoE path's scratch, carved from MoeExpertsArgs::workspace in one order by the
// host (to size it) and by the kernels (to find their parts).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/config.hpp"

namespace hisparse::kernels::detail {

struct MoeWorkspace {
  std::uint64_t* masks = nullptr;     ///< [experts]: bit t set where token t is routed to e
  int* offsets = nullptr;             ///< [experts]: first pair of expert e (pairs in expert order)
  int* pair_tokens = nullptr;         ///< [tokens x experts]: the token of each pair
  std::uint16_t* h_bf16 = nullptr;    ///< [tokens x hidden]: the input rounded to bf16
  std::uint16_t* act_bf16 = nullptr;  ///< [pairs x width]: SwiGLU outputs rounded to bf16
  float* partial = nullptr;           ///< [pairs x hidden]: each pair's down projection
  std::size_t bytes = 0;              ///< the whole carve, every part 256-byte aligned
};

/// Carves `base` (nullptr: only the size is wanted) for up to tokens x experts pairs.
HISPARSE_HD MoeWorkspace carve_moe_workspace(void* base, int tokens, int experts, int hidden,
                                             int width) {
  const auto pairs = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(experts);
  std::size_t at = 0;
  auto* bytes = static_cast<unsigned char*>(base);
  auto take = [&](std::size_t size) {
    unsigned char* p = bytes == nullptr ? nullptr : bytes + at;
    at += (size + 255) / 256 * 256;
    return p;
  };
  MoeWorkspace w;
  w.masks = reinterpret_cast<std::uint64_t*>(take(sizeof(std::uint64_t) * experts));
  w.offsets = reinterpret_cast<int*>(take(sizeof(int) * experts));
  w.pair_tokens = reinterpret_cast<int*>(take(sizeof(int) * pairs));
  w.h_bf16 = reinterpret_cast<std::uint16_t*>(
      take(sizeof(std::uint16_t) * static_cast<std::size_t>(tokens) * hidden));
  w.act_bf16 = reinterpret_cast<std::uint16_t*>(take(sizeof(std::uint16_t) * pairs * width));
  w.partial = reinterpret_cast<float*>(take(sizeof(float) * pairs * hidden));
  w.bytes = at;
  return w;
}

}  // namespace hisparse::kernels::detail
