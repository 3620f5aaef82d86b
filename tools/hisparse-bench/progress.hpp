// Progress of a sweep on stderr: a redrawn bar when stderr is a terminal, one line per finished
// point otherwise (CI logs), nothing with --quiet or --json.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace hisparse::cli {

class ProgressBar {
 public:
  ProgressBar(std::size_t points, bool enabled)
      : points_(points), enabled_(enabled), terminal_(enabled && isatty(STDERR_FILENO) != 0) {}

  /// Redraws the bar while a point runs (terminal only).
  void step(std::size_t point, const std::string& label, int step, int steps) {
    if (!terminal_) return;
    const double done = (static_cast<double>(point) + static_cast<double>(step) / steps) /
                        static_cast<double>(points_);
    const int width = 30;
    const int filled = static_cast<int>(done * width);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %s step %d/%d\x1b[K", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), point + 1, points_, label.c_str(), step,
                 steps);
    std::fflush(stderr);
  }
  /// Reports a finished point.
  void finished(std::size_t point, const std::string& label, const std::string& outcome) {
    if (!enabled_) return;
    if (terminal_) std::fprintf(stderr, "\r\x1b[K");
    std::fprintf(stderr, "[%zu/%zu] %s: %s\n", point + 1, points_, label.c_str(), outcome.c_str());
    std::fflush(stderr);
  }

 private:
  std::size_t points_;
  bool enabled_;
  bool terminal_;
};

}  // namespace hisparse::cli
