// Warp-level tensor-core helpers (mma.sync, sm_80+), shared by the kernels that multiply bf16
// fragments: the MLA decode attention and the MoE experts.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtypes.hpp"

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

/// Four 8x8 bf16 matrices from shared memory (ldmatrix.x4): lane l gives the address of row l % 8 of
/// matrix l / 8 (16 contiguous bytes, 16-byte aligned), and r[i] is matrix i's fragment: for lane
/// 4 g + c, row g, columns 2c..2c+1 (the A / B register layout of mma_bf16_m16n8k16).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

/// ldmatrix_x4 transposed: r[i] holds, for lane 4 g + c, rows 2c..2c+1 of column g of matrix i
/// (the B register layout when the matrix is stored k-major, as V rows are).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

/// Two fp32 values as a bf16 pair for an MMA register (x0 in the low half) plus the bf16 pair of
/// their residuals: hi + lo keeps about 16 bits of each mantissa, so an MMA pair over (hi, lo)
/// multiplies by fp32 activations to within fp32-sized rounding.
__device__ __forceinline__ void split_bf16_pair(float x0, float x1, std::uint32_t& hi,
                                                std::uint32_t& lo) {
  const std::uint16_t h0 = float_to_bf16(x0), h1 = float_to_bf16(x1);
  const std::uint16_t r0 = float_to_bf16(x0 - bf16_to_float(h0));
  const std::uint16_t r1 = float_to_bf16(x1 - bf16_to_float(h1));
  hi = static_cast<std::uint32_t>(h0) | static_cast<std::uint32_t>(h1) << 16;
  lo = static_cast<std::uint32_t>(r0) | static_cast<std::uint32_t>(r1) << 16;
}

}  // namespace hisparse::kernels
