// What keeps a sweep's results whole when a scheduler stops it: SIGINT / SIGTERM handling and the
// watchdog of a step that never returns. results.json on disk is always a complete document
// (every write replaces it atomically), so any exit below leaves it valid and resumable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace hisparse {

/// Thrown out of a point (by its progress callback) when a stop was requested.
struct StopRequested {
  int signal = 0;
};

/// Installs SIGINT and SIGTERM handlers for its lifetime (the previous ones come back after).
/// The first signal asks the sweep to stop after the current step; a second one exits at once
/// with 128 + its number. A SIGINT that the parent ignores (a background job of a script) is
/// handled too: whoever sends it to the sweep means it to stop.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  /// The first signal received (0: none).
  [[nodiscard]] static int signal() noexcept;
  /// Throws StopRequested when a signal was received.
  static void check();
  /// "SIGINT" or "SIGTERM".
  [[nodiscard]] static const char* name(int signal) noexcept;
  /// The exit status of a run stopped by `signal`: 130 or 143.
  [[nodiscard]] static int exit_status(int signal) noexcept { return 128 + signal; }
};

/// Ends the process when one point runs past its hard deadline: a step that never returns (a
/// hung kernel, a deadlock) cannot be stopped from inside, so the run exits with 124 and says
/// how to continue it. Armed per point; disarmed when the point ends.
class PointWatchdog {
 public:
  PointWatchdog();
  ~PointWatchdog();
  PointWatchdog(const PointWatchdog&) = delete;
  PointWatchdog& operator=(const PointWatchdog&) = delete;

  /// Watch the next `seconds` (0: do not watch); `message` is printed if they pass.
  void arm(double seconds, std::string message);
  void disarm();

 private:
  void watch();
  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::string message_;
  std::thread thread_;
};

}  // namespace hisparse
