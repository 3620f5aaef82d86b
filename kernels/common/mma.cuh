// Warp-level tensor-core helpers (mma.sync, sm_80+), shared by the kernels that multiply bf16
// fragments: the MLA decode attention and the MoE experts.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace hisparse::kernels {

/// d += a b for one m16n8k16 bf16 fragment with fp32 accumulators. For lane = 4 g + c:
/// a = {(row g, k 2c..2c+1), (row g + 8, k 2c..), (row g, k 2c + 8..), (row g + 8, k 2c + 8..)},
/// b0 = (k 2c..2c+1, column g), b1 = (k 2c + 8.., column g), two bf16 per register (lower k in
/// the low half); d = {(row g, column 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1)}.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace hisparse::kernels
