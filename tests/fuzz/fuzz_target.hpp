// What every harness of tests/fuzz/ shares (see tests/fuzz/README.md). A harness defines
// LLVMFuzzerTestOneInput and hands the input to one reader inside fuzz_one(): returning or
// throwing hisparse::Error (the reader's clear rejection) is expected; any other exception, a
// failed consistency check, a sanitizer report or a hang is a finding. Built with libFuzzer
// (-fsanitize=fuzzer, the `fuzz` preset) or with replay_main.cpp (the normal test suite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include <unistd.h>

#include "core/error.hpp"

namespace hisparse::fuzz {

/// Aborts (a finding) with `what` unless `ok`.
inline void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz finding: %s\n", what);
  std::abort();
}

/// Runs `read`; hisparse::Error is a rejection, anything else thrown aborts naming its type.
template <class F>
void fuzz_one(F&& read) {
  try {
    read();
  } catch (const Error&) {
    // The reader refused the input with a message: what it should do.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz finding: %s thrown instead of hisparse::Error: %s\n",
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz finding: a non-std exception thrown\n");
    std::abort();
  }
}

/// The input as text.
inline std::string as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Writes the input to `name` in this process's own temporary folder (the same file every call)
/// for readers that take a path; returns the path.
inline std::filesystem::path as_file(const std::uint8_t* data, std::size_t size,
                                     std::string_view name) {
  // Removed at a normal exit ($TMPDIR holds it otherwise: .ci/fuzz points that into build/).
  static const struct Folder {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("hisparse-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    Folder() { std::filesystem::create_directories(path); }
    ~Folder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } dir;
  const std::filesystem::path file = dir.path / name;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  check(static_cast<bool>(out), "cannot write the input to a temporary file");
  return file;
}

}  // namespace hisparse::fuzz
