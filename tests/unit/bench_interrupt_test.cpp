// SIGINT / SIGTERM handling and the point watchdog, in this process and in death tests (a child
// process each, so that the exits they cause can be checked).
#include "bench/interrupt.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <thread>

namespace hisparse {
namespace {

TEST(BenchInterrupt, TheFirstSignalAsksToStopAndTheGuardRestoresTheHandler) {
  {
    const InterruptGuard guard;
    EXPECT_EQ(InterruptGuard::signal(), 0);
    EXPECT_NO_THROW(InterruptGuard::check());
    std::raise(SIGTERM);  // handled: the process goes on
    EXPECT_EQ(InterruptGuard::signal(), SIGTERM);
    try {
      InterruptGuard::check();
      FAIL() << "no StopRequested";
    } catch (const StopRequested& stop) {
      EXPECT_EQ(stop.signal, SIGTERM);
    }
    EXPECT_EQ(InterruptGuard::exit_status(SIGTERM), 143);
    EXPECT_EQ(InterruptGuard::exit_status(SIGINT), 130);
    EXPECT_STREQ(InterruptGuard::name(SIGINT), "SIGINT");
  }
  const InterruptGuard again;  // a new guard starts with no signal
  EXPECT_EQ(InterruptGuard::signal(), 0);
}

TEST(BenchInterruptDeathTest, ASecondSignalExitsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const InterruptGuard guard;
        std::raise(SIGINT);
        std::raise(SIGINT);
        std::_Exit(0);  // not reached
      },
      testing::ExitedWithCode(130), "second signal: exiting now");
}

TEST(BenchInterruptDeathTest, TheWatchdogEndsARunWhosePointDoesNotReturn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        PointWatchdog watchdog;
        watchdog.arm(0.05, "point 3 hangs");
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(0);
      },
      testing::ExitedWithCode(124), "error: point 3 hangs");
}

TEST(BenchInterrupt, ADisarmedWatchdogDoesNothing) {
  PointWatchdog watchdog;
  watchdog.arm(0.05, "would fire");
  watchdog.disarm();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  watchdog.arm(0, "0 watches nothing");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  SUCCEED();  // still running: neither fired
}

}  // namespace
}  // namespace hisparse
