// One exception type for every user-facing failure: it names the input (file:line:column, key or
// flag), says what is wrong, and says what would fix it. Tools print what() and exit with
// exit_code::bad_input.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace hisparse {

/// Process exit codes shared by every tool (documented in --help).
namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int point_failed = 1;  ///< a sweep point (or a benchmark) failed; others completed
inline constexpr int bad_input = 2;     ///< bad flags, YAML, files or sizes; nothing was run
}  // namespace exit_code

class Error : public std::runtime_error {
 public:
  /// `where`: the input at fault (e.g. "scenarios/x.yaml:3:5: sweep.concurrency", "--backend").
  /// `problem`: what is wrong with it. `fix`: what the user should do instead (may be empty).
  Error(std::string where, std::string problem, std::string fix = {});

  [[nodiscard]] const std::string& where() const noexcept { return where_; }
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }
  [[nodiscard]] const std::string& fix() const noexcept { return fix_; }

 private:
  std::string where_;
  std::string problem_;
  std::string fix_;
};

enum class MemoryKind;

/// An allocation that did not fit: what it was for (where()), how much it asked and how much of
/// that kind was free. The Runner turns it into the scenario keys that would make a point fit.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string label, std::string problem, std::string fix, MemoryKind kind,
                   std::size_t bytes, std::size_t free_bytes)
      : Error(std::move(label), std::move(problem), std::move(fix)),
        kind_(kind),
        bytes_(bytes),
        free_bytes_(free_bytes) {}
  [[nodiscard]] MemoryKind kind() const noexcept { return kind_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_bytes_; }

 private:
  MemoryKind kind_;
  std::size_t bytes_;
  std::size_t free_bytes_;
};

/// A failure of the CUDA runtime or driver that is not the user's input (out of memory is
/// reported as an Error naming the size instead).
class CudaError : public Error {
 public:
  CudaError(const char* call, const char* file, int line, int code, const std::string& name,
            const std::string& description);
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace hisparse
