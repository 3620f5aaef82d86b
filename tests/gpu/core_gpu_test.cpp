// CUDA foundation on a real GPU: device buffers, pinned mapped memory, streams, events and a
// trivial kernel checked against its CPU twin.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/common/iota.hpp"
#include "support/gpu.hpp"

namespace hisparse {
namespace {

TEST(CoreGpu, DeviceBufferRoundTrip) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  const std::size_t n = (1u << 20) + 13;
  auto host = Buffer<std::uint32_t>::host(n, "src");
  for (std::size_t i = 0; i < n; ++i) host.host_data()[i] = static_cast<std::uint32_t>(i * 2654435761u);
  auto dev = Buffer<std::uint32_t>::device(n, Backend::cuda, "dev");
  auto back = Buffer<std::uint32_t>::host(n, "back");
  copy_bytes(dev.device_data(), host.host_data(), host.bytes(), Backend::cuda);
  copy_bytes(back.host_data(), dev.device_data(), dev.bytes(), Backend::cuda);
  EXPECT_EQ(std::memcmp(host.host_data(), back.host_data(), host.bytes()), 0);
#endif
}

TEST(CoreGpu, IotaKernelMatchesCpuTwinThroughMappedPinnedMemory) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  const std::size_t n = 1'000'003;
  // The kernel writes straight into mapped pinned memory (zero copy).
  auto pinned = Buffer<float>::pinned(n, Backend::cuda, "iota out");
  std::memset(pinned.host_data(), 0xff, pinned.bytes());  // poison: NaN everywhere
  Stream stream(Backend::cuda);
  Event start(Backend::cuda), stop(Backend::cuda);
  start.record(stream);
  kernels::launch_iota({pinned.device_data(), n, -3.5f, 0.25f}, stream.native());
  stop.record(stream);
  stream.synchronize();
  EXPECT_GE(Event::elapsed_ms(start, stop), 0.0);
  std::vector<float> expected(n);
  kernels::iota_ref({expected.data(), n, -3.5f, 0.25f});
  EXPECT_EQ(std::memcmp(expected.data(), pinned.host_data(), pinned.bytes()), 0);
#endif
}

TEST(CoreGpu, OversizedDeviceAllocationNamesTheBuffer) {
  HISPARSE_REQUIRE_GPU();
  try {
    auto huge = Allocation::device(std::size_t{1} << 50, Backend::cuda, "hot buffer");
    FAIL() << "allocated 1 PiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("hot buffer: cannot allocate 1048576.00 GiB of GPU memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reduce concurrency"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace hisparse
