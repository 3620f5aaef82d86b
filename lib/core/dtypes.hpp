// Element types and exact scalar conversions (round to nearest even), usable from CUDA kernels
// and their CPU twins alike so that both produce identical bits.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/config.hpp"

namespace hisparse {

enum class DType : std::uint8_t { f32, bf16, f16, fp8_e4m3, i32, i64, u8 };

[[nodiscard]] constexpr std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::fp8_e4m3:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}
[[nodiscard]] std::string_view name_of(DType t) noexcept;
/// Parses "f32", "bf16", "f16", "fp8_e4m3" (also the safetensors names F32, BF16, F16, F8_E4M3,
/// I32, I64, U8). Throws Error naming `where` when the name is unknown.
[[nodiscard]] DType parse_dtype(std::string_view name, const std::string& where);

namespace detail {
HISPARSE_HD std::uint32_t float_bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
HISPARSE_HD float bits_float(std::uint32_t u) {
  return std::bit_cast<float>(u);
}
/// Round to nearest even for |v| < 2^22 using the float adder's own rounding.
HISPARSE_HD float round_half_even_small(float v) {
  const float big = 12582912.0f;  // 1.5 * 2^23: the sum's exponent stays fixed for |v| < 2^22
  const float t = v + big;
  return t - big;
}
}  // namespace detail

// ---- bf16 ---------------------------------------------------------------------------------
HISPARSE_HD float bf16_to_float(std::uint16_t h) {
  return detail::bits_float(static_cast<std::uint32_t>(h) << 16);
}
HISPARSE_HD std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + bias) >> 16);
}

// ---- fp16 ---------------------------------------------------------------------------------
HISPARSE_HD float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return detail::bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}
HISPARSE_HD std::uint16_t float_to_f16(float f) {
  const std::uint32_t x = detail::float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {                        // below 2^-14: subnormal, man = RNE(|f| * 2^24)
    const float m = detail::round_half_even_small(detail::bits_float(a) * 16777216.0f);
    return sign | static_cast<std::uint16_t>(m);
  }
  a += 0xfffu + ((a >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((a - 0x38000000u) >> 13);
}

// ---- fp8 e4m3 (OCP "fn": no infinities, NaN = S.1111.111, max 448) ---------------------------
HISPARSE_HD float fp8e4m3_to_float(std::uint8_t b) {
  const std::uint32_t exp = (b >> 3) & 0xfu;
  const std::uint32_t man = b & 0x7u;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = detail::bits_float(0x7fc00000u);
  } else if (exp == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
  } else {
    v = detail::bits_float(((exp + 120u) << 23) | (man << 20));
  }
  return (b & 0x80u) ? -v : v;
}
/// Saturating conversion (like __NV_SATFINITE): |f| > 448 and infinities give +-448, NaN gives 0x7f.
HISPARSE_HD std::uint8_t float_to_fp8e4m3(float f) {
  const std::uint32_t x = detail::float_bits(f);
  const std::uint8_t sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a > 0x43e00000u) return sign | 0x7e;  // > 448
  if (a < 0x3c800000u) {                    // below 2^-6: subnormal, man = RNE(|f| * 2^9)
    const float m = detail::round_half_even_small(detail::bits_float(a) * 512.0f);
    return sign | static_cast<std::uint8_t>(m);
  }
  a += 0x7ffffu + ((a >> 20) & 1u);
  const std::uint32_t exp = (a >> 23) - 120u;
  return sign | static_cast<std::uint8_t>((exp << 3) | ((a >> 20) & 0x7u));
}

}  // namespace hisparse
