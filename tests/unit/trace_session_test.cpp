// TraceSession on any machine: it steps aside (inactive, with a message) when a profiler owns
// CUPTI or no GPU is present, and allows one session at a time.
#include "trace/trace_session.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "core/device.hpp"
#include "core/error.hpp"
#include "trace/trace_file.hpp"

namespace hisparse::trace {
namespace {

/// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TraceSession, DetectsProfilersFromTheirEnvironment) {
  if (other_profiler()) GTEST_SKIP() << "this test runs under a profiler: " << *other_profiler();
  {
    ScopedEnv env("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so");
    EXPECT_EQ(other_profiler(),
              "CUDA_INJECTION64_PATH=/opt/nsight/libToolsInjection64.so (a profiler such as "
              "Nsight Systems or Nsight Compute is attached)");
  }
  {
    ScopedEnv env("NSYS_PROFILING_SESSION_ID", "7");
    EXPECT_EQ(other_profiler(),
              "NSYS_PROFILING_SESSION_ID is set (Nsight Systems is profiling this process)");
  }
  {
    ScopedEnv env("NVTX_INJECTION64_PATH", "/opt/other/libnvtxtool.so");
    EXPECT_EQ(
        other_profiler(),
        "NVTX_INJECTION64_PATH=/opt/other/libnvtxtool.so (NVTX is injected into another tool)");
  }
  {
    ScopedEnv env("NVTX_INJECTION64_PATH", "/usr/local/cuda/lib64/libcupti.so.13");
    EXPECT_FALSE(other_profiler().has_value()) << "CUPTI as the NVTX injection is ours";
  }
  EXPECT_FALSE(other_profiler().has_value());
}

TEST(TraceSession, StepsAsideWhenAProfilerOwnsCupti) {
  ScopedEnv env("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so");
  TraceSession session({.label = "p"});
  EXPECT_FALSE(session.active());
  EXPECT_EQ(session.message(),
            "trace disabled: CUDA_INJECTION64_PATH=/opt/nsight/libToolsInjection64.so (a profiler "
            "such as Nsight "
            "Systems or Nsight Compute is attached); its own timeline shows the same work");
  const auto records = session.stop();
  EXPECT_EQ(records.label, "p");
  EXPECT_TRUE(records.kernels.empty());
  EXPECT_TRUE(records.markers.empty());
}

TEST(TraceSession, TraceFileSkipsInactiveSessions) {
  ScopedEnv env("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so");
  const auto path = std::filesystem::temp_directory_path() / "hisparse_trace_file_test.json";
  std::filesystem::remove(path);
  TraceFile file(path);
  auto session = file.begin("point 1");
  EXPECT_FALSE(session->active());
  EXPECT_TRUE(file.end(*session).empty());
  EXPECT_EQ(file.sessions(), 0u);
  EXPECT_FALSE(std::filesystem::exists(path)) << "an inactive session writes no trace.json";
  auto next = file.begin("point 2");  // the slot was released by end()
  EXPECT_FALSE(next->active());
}

TEST(TraceSession, WithoutGpuItIsInactiveWithAReason) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present: covered by gpu.TraceSessionGpu";
  TraceSession session;
  EXPECT_FALSE(session.active());
  if (cuda_compiled())
    EXPECT_EQ(session.message(),
              "trace disabled: no CUDA device (" + why + "); no GPU trace is collected");
  else
    EXPECT_EQ(session.message(), "trace disabled: this build has no CUDA backend (no CUPTI)");
}

TEST(TraceSession, OnlyOneSessionAtATime) {
  TraceSession first;
  try {
    TraceSession second;
    FAIL() << "two sessions at once";
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "trace session: another TraceSession is already active in this process; stop() the "
        "running session before starting the next (CUPTI's activity API is process-wide)");
  }
  (void)first.stop();
  std::optional<TraceSession> third;
  EXPECT_NO_THROW(third.emplace()) << "the slot is free again after stop()";
}

}  // namespace
}  // namespace hisparse::trace
