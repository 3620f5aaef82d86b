#include "bench/interrupt.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

namespace hisparse {
namespace {

volatile std::sig_atomic_t received = 0;
struct sigaction previous_int, previous_term;

extern "C" void on_signal(int sig) {
  if (received == 0) {
    received = sig;
    return;
  }
  // A second signal: the user wants out now. Only async-signal-safe calls here.
  static const char message[] =
      "\nsecond signal: exiting now; results.json holds every point completed before it\n";
  (void)!write(STDERR_FILENO, message, sizeof message - 1);
  _exit(128 + sig);
}

}  // namespace

InterruptGuard::InterruptGuard() {
  received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

int InterruptGuard::signal() noexcept {
  return received;
}

void InterruptGuard::check() {
  if (received != 0) throw StopRequested{received};
}

const char* InterruptGuard::name(int sig) noexcept {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

PointWatchdog::PointWatchdog() : thread_([this] { watch(); }) {}

PointWatchdog::~PointWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void PointWatchdog::arm(double seconds, std::string message) {
  {
    std::lock_guard lock(mutex_);
    armed_ = seconds > 0;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(seconds));
    message_ = std::move(message);
  }
  changed_.notify_all();
}

void PointWatchdog::disarm() {
  {
    std::lock_guard lock(mutex_);
    armed_ = false;
  }
  changed_.notify_all();
}

void PointWatchdog::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!armed_) {
      changed_.wait(lock);
      continue;
    }
    if (changed_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
        std::chrono::steady_clock::now() >= deadline_) {
      std::fprintf(stderr, "error: %s\n", message_.c_str());
      std::fflush(stderr);
      _exit(124);
    }
  }
}

}  // namespace hisparse
