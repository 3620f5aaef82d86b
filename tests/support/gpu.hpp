// GPU tests call HISPARSE_REQUIRE_GPU() first: without a usable CUDA device the test is skipped
// with a message saying why, and ctest reports it as skipped (not passed).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/device.hpp"

#define HISPARSE_REQUIRE_GPU()                               \
  do {                                                       \
    std::string hisparse_why_;                               \
    if (!::hisparse::cuda_available(&hisparse_why_))         \
      GTEST_SKIP() << "GPU test skipped: " << hisparse_why_; \
  } while (0)
