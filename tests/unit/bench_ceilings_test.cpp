#include <gtest/gtest.h>

#include "bench/ceilings.hpp"
#include "core/device.hpp"

namespace hisparse {
namespace {

// On the CPU backend only the host copy is measured; the GPU fields stay zero, so no figure can
// pass for a GPU ceiling, and the JSON names the backend.
TEST(BenchCeilings, CpuBackendMeasuresOnlyTheHostCopy) {
  const Ceilings c = measure_ceilings(Device::for_backend(Backend::cpu), std::size_t{8} << 20, 2);
  EXPECT_GT(c.host_copy_gbps, 0.0);
  EXPECT_EQ(c.h2d_gbps, 0.0);
  EXPECT_EQ(c.d2h_gbps, 0.0);
  EXPECT_EQ(c.hbm_copy_gbps, 0.0);
  EXPECT_EQ(c.sm_read_gbps, 0.0);
  const nlohmann::json j = c;
  EXPECT_EQ(j.at("backend"), "cpu");
  EXPECT_EQ(j.at("bytes"), std::size_t{8} << 20);
  EXPECT_EQ(j.at("h2d_gbps"), 0.0);
  EXPECT_EQ(j.at("sm_read_gbps"), 0.0);
  EXPECT_GT(j.at("host_copy_gbps").get<double>(), 0.0);
}

}  // namespace
}  // namespace hisparse
