// Decode modes (names used in scenarios): how a step selects and places the KV rows it reads.
#pragma once

#include <string>
#include <string_view>

namespace hisparse {

enum class Mode { dense, sparse_gpu, hisparse, fathom, hisparse_fathom };

/// "dense", "sparse-gpu", "hisparse", "fathom", "hisparse+fathom"
[[nodiscard]] std::string_view name_of(Mode m) noexcept;
/// Throws Error naming `where` for an unknown name.
[[nodiscard]] Mode parse_mode(std::string_view name, const std::string& where);

}  // namespace hisparse
