#include "core/dtypes.hpp"

#include <array>
#include <utility>

#include "core/error.hpp"

namespace hisparse {
namespace {
constexpr std::array<std::pair<std::string_view, DType>, 14> kNames{{
    {"f32", DType::f32},
    {"bf16", DType::bf16},
    {"f16", DType::f16},
    {"fp8_e4m3", DType::fp8_e4m3},
    {"i32", DType::i32},
    {"i64", DType::i64},
    {"u8", DType::u8},
    {"F32", DType::f32},
    {"BF16", DType::bf16},
    {"F16", DType::f16},
    {"F8_E4M3", DType::fp8_e4m3},
    {"I32", DType::i32},
    {"I64", DType::i64},
    {"U8", DType::u8},
}};
}  // namespace

std::string_view name_of(DType t) noexcept {
  for (const auto& [name, type] : kNames)
    if (type == t) return name;
  return "?";
}

DType parse_dtype(std::string_view name, const std::string& where) {
  for (const auto& [n, type] : kNames)
    if (n == name) return type;
  throw Error(where, "unknown dtype '" + std::string(name) + "'",
              "use one of f32, bf16, f16, fp8_e4m3, i32, i64, u8");
}

}  // namespace hisparse
