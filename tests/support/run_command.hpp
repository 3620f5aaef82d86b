// Runs a command line through the shell and captures its exit status and combined output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace hisparse::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe))
    r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// The built hisparse-bench with arguments appended.
inline CommandResult run_bench(const std::string& args) {
  return run_command(std::string(HISPARSE_BENCH_EXE) + " " + args);
}

}  // namespace hisparse::test
