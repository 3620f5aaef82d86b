#include "report/atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse {

void write_file_atomically(const std::filesystem::path& path, std::string_view content) {
  const std::filesystem::path tmp =
      path.parent_path() / fmt::format(".{}.tmp{}", path.filename().string(), getpid());
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return Error(path.string(), fmt::format("{} ({})", what, reason),
                 "check that the output folder exists and is writable (--out DIR)");
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw fail("cannot create a temporary file beside it");
  const bool written = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const bool flushed = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !written || !flushed) throw fail("cannot write it");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw fail("cannot replace it");
}

}  // namespace hisparse
