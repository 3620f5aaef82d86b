// Scratch space for tests that write files: a directory of their own, and whole-file reads.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace hisparse::test {

/// <tmp>/hisparse_<suite>.<test>_<pid>_<n>: empty when made, removed with everything in it when
/// destroyed. The counter keeps two directories of one test apart.
struct TempDir {
  std::filesystem::path path;

  TempDir() : path(std::filesystem::temp_directory_path() / unique_name()) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// Writes `text` to the file `name` in the directory (made first when missing); its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories(path);
    const auto file = path / name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  static std::string unique_name() {
    static std::atomic<int> made{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return "hisparse_" + std::string(info ? info->test_suite_name() : "none") + "." +
           (info ? info->name() : "none") + "_" + std::to_string(getpid()) + "_" +
           std::to_string(made++);
  }
};

/// The whole file as text ("" when it cannot be opened).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  return nlohmann::json::parse(read_text(p));
}

}  // namespace hisparse::test
