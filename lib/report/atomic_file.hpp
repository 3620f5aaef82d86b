// Files that are never seen half-written: write a temporary file in the same folder, then rename
// it over the target (rename is atomic within one file system).
#pragma once

#include <filesystem>
#include <string_view>

namespace hisparse {

/// Replaces `path` with `content` atomically. Throws Error naming the path on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

}  // namespace hisparse
