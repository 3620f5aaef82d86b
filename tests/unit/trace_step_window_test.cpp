// StepWindowTrace opens its session after the warm-up and closes it after the traced steps,
// whatever the backend (without a GPU the session is inactive and says why).
#include "trace/step_window_trace.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "core/device.hpp"
#include "core/error.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::trace {
namespace {

namespace fs = std::filesystem;

fs::path trace_path() {
  return fs::temp_directory_path() /
         ("hisparse_step_window_" + std::to_string(getpid()) + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json");
}

TEST(TraceStepWindow, OpensAfterWarmupAndClosesAfterTheTracedSteps) {
  TraceFile file(trace_path());
  StepWindowTrace w(file, "point 0", /*warmup_steps=*/2, /*steps=*/3);
  w.start();
  EXPECT_FALSE(w.open());
  w.step_done(1);
  EXPECT_FALSE(w.open());
  w.step_done(2);
  EXPECT_TRUE(w.open());
  EXPECT_EQ(w.began_after(), 2);
  w.step_done(3);
  w.step_done(4);
  EXPECT_TRUE(w.open());
  w.step_done(5);
  EXPECT_FALSE(w.open());
  EXPECT_EQ(w.ended_after(), 5);
  w.step_done(6);  // later steps are not traced
  EXPECT_FALSE(w.open());
  EXPECT_EQ(w.began_after(), 2);
  w.finish();
  EXPECT_EQ(w.ended_after(), 5);
  fs::remove(file.path());
}

TEST(TraceStepWindow, WithoutWarmupItOpensAtStart) {
  TraceFile file(trace_path());
  StepWindowTrace w(file, "point 0", 0, 1);
  w.start();
  EXPECT_TRUE(w.open());
  EXPECT_EQ(w.began_after(), 0);
  w.step_done(1);
  EXPECT_FALSE(w.open());
  EXPECT_EQ(w.ended_after(), 1);
  fs::remove(file.path());
}

TEST(TraceStepWindow, FinishClosesAPointThatStoppedEarly) {
  TraceFile file(trace_path());
  StepWindowTrace w(file, "point 0", 1, 4);
  w.start();
  w.step_done(1);
  w.step_done(2);
  ASSERT_TRUE(w.open());
  w.finish();
  EXPECT_FALSE(w.open());
  EXPECT_EQ(w.ended_after(), 2);
  // The process-wide session slot is free again.
  StepWindowTrace next(file, "point 1", 0, 1);
  EXPECT_NO_THROW(next.start());
  next.finish();
  fs::remove(file.path());
}

TEST(TraceStepWindow, DestructorReleasesTheSession) {
  TraceFile file(trace_path());
  {
    StepWindowTrace w(file, "point 0", 0, 5);
    w.start();
    ASSERT_TRUE(w.open());
  }
  TraceSession session;  // would throw if the window had kept the slot
  (void)session.stop();
  fs::remove(file.path());
}

TEST(TraceStepWindow, WithoutAGpuNothingIsTracedAndTheMessageSaysWhy) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  TraceFile file(trace_path());
  StepWindowTrace w(file, "point 0", 0, 2);
  w.start();
  w.step_done(1);
  w.step_done(2);
  EXPECT_FALSE(w.traced());
  EXPECT_TRUE(w.steps().empty());
  EXPECT_EQ(w.message().rfind("trace disabled: ", 0), 0u) << w.message();
  EXPECT_EQ(file.sessions(), 0u);
  EXPECT_FALSE(fs::exists(file.path()));
}

TEST(TraceStepWindow, RejectsAnEmptyWindow) {
  TraceFile file(trace_path());
  try {
    StepWindowTrace w(file, "p", 1, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "trace window: 0 traced steps; trace at least one step (--trace-steps N, N >= 1)");
  }
  EXPECT_THROW(StepWindowTrace(file, "p", -1, 1), Error);
}

}  // namespace
}  // namespace hisparse::trace
