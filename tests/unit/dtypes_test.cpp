#include "core/dtypes.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"

namespace hisparse {
namespace {

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const auto b = static_cast<std::uint8_t>(code);
    const float v = fp8e4m3_to_float(b);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << code;
      EXPECT_EQ(float_to_fp8e4m3(v), 0x7f) << code;
    } else {
      EXPECT_EQ(float_to_fp8e4m3(v), b) << "code " << code << " value " << v;
    }
  }
}

TEST(Fp8E4m3, KnownValuesAndSaturation) {
  EXPECT_EQ(fp8e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_float(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(fp8e4m3_to_float(0x08), 0.015625f);     // smallest normal 2^-6
  EXPECT_EQ(fp8e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(float_to_fp8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(float_to_fp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8e4m3(1e-9f), 0x00);
}

TEST(Fp8E4m3, RoundsHalfToEven) {
  // 1.0625 lies halfway between 1.0 (0x38, even mantissa) and 1.125 (0x39): goes to 1.0.
  EXPECT_EQ(float_to_fp8e4m3(1.0625f), 0x38);
  // 1.1875 lies halfway between 1.125 (0x39) and 1.25 (0x3a, even): goes to 1.25.
  EXPECT_EQ(float_to_fp8e4m3(1.1875f), 0x3a);
  // Subnormal halfway: 1.5 * 2^-9 between codes 1 and 2 -> 2; 2.5 * 2^-9 -> 2.
  EXPECT_EQ(float_to_fp8e4m3(1.5f * 0.001953125f), 0x02);
  EXPECT_EQ(float_to_fp8e4m3(2.5f * 0.001953125f), 0x02);
  // Just above 448's rounding range still saturates, just below rounds down to 448.
  EXPECT_EQ(float_to_fp8e4m3(460.0f), 0x7e);
}

TEST(Bf16, RoundTripAndRounding) {
  for (std::uint32_t h = 0; h < 0x10000; h += 7) {
    const auto b = static_cast<std::uint16_t>(h);
    const float v = bf16_to_float(b);
    if (std::isnan(v)) continue;
    EXPECT_EQ(float_to_bf16(v), b) << h;
  }
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: goes up.
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(F16, RoundTripAndRounding) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float v = f16_to_float(b);
    if (std::isnan(v)) continue;
    EXPECT_EQ(float_to_f16(v), b) << h;
  }
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_f16(5.9604644775390625e-8f), 0x0001);
  EXPECT_EQ(float_to_f16(2.98023223876953125e-8f),
            0x0000);  // half the smallest subnormal: tie to 0
}

TEST(DType, ParsesNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("BF16", "t"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp8_e4m3", "t"), DType::fp8_e4m3);
  EXPECT_EQ(size_of(DType::fp8_e4m3), 1u);
  try {
    (void)parse_dtype("bf17", "weights.safetensors: tensor x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "weights.safetensors: tensor x: unknown dtype 'bf17'; use one of f32, bf16, f16, "
              "fp8_e4m3, i32, i64, u8");
  }
}

}  // namespace
}  // namespace hisparse
