#include "model/mode.hpp"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse {
namespace {
constexpr std::array<std::pair<Mode, std::string_view>, 5> kModeNames{{
    {Mode::dense, "dense"},
    {Mode::sparse_gpu, "sparse-gpu"},
    {Mode::hisparse, "hisparse"},
    {Mode::fathom, "fathom"},
    {Mode::hisparse_fathom, "hisparse+fathom"},
}};
}  // namespace

std::string_view name_of(Mode m) noexcept {
  for (const auto& [mode, name] : kModeNames)
    if (mode == m) return name;
  return "unknown";
}

Mode parse_mode(std::string_view name, const std::string& where) {
  for (const auto& [mode, known] : kModeNames)
    if (known == name) return mode;
  throw Error(where, fmt::format("unknown mode '{}'", name),
              "use one of dense, sparse-gpu, hisparse, fathom, hisparse+fathom");
}

}  // namespace hisparse
