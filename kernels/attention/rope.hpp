// Rotary position embedding, rotate-half (NeoX/Qwen) pairing: within the rotated part of width
// `dim` (even), channel i pairs with channel i + dim/2 and both turn by angle
// position * theta^(-2i/dim). The rotated part starts `offset` channels into each head, so the
// same kernel serves a whole GQA head (offset 0, dim = head_dim) and the rope tail of an MLA
// query head (offset = qk_nope_head_dim). Angles are computed in double (the CUDA version matches
// within float rounding).
#pragma once

#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

struct RopeArgs {
  float* x = nullptr;                       ///< [rows x heads x head_stride], in place
  const std::int64_t* positions = nullptr;  ///< [rows]
  int rows = 0;
  int heads = 0;
  int head_stride = 0;  ///< floats from one head to the next
  int row_stride = 0;   ///< floats from one row to the next; 0: heads * head_stride
  int offset = 0;       ///< first rotated channel within a head
  int dim = 0;          ///< rotated channels (even)
  float theta = 10000.0f;
};

#if HISPARSE_WITH_CUDA
void launch_rope(const RopeArgs& args, cudaStream_t stream);
#endif
void rope_ref(const RopeArgs& args);

}  // namespace hisparse::kernels
