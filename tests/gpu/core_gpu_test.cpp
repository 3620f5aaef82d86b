// CUDA foundation on a real GPU: device buffers, pinned mapped memory, streams, events and a
// trivial kernel checked against its CPU twin.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stream.hpp"
#include "kernels/common/host_gather.hpp"
#include "kernels/common/iota.hpp"
#include "support/gpu.hpp"

namespace hisparse {
namespace {

TEST(CoreGpu, DeviceBufferRoundTrip) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  const std::size_t n = (1u << 20) + 13;
  auto host = Buffer<std::uint32_t>::host(n, "src");
  for (std::size_t i = 0; i < n; ++i)
    host.host_data()[i] = static_cast<std::uint32_t>(i * 2654435761u);
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
    EXPECT_NE(msg.find("hot buffer: cannot allocate 1048576.00 GiB of GPU memory"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("reduce concurrency"), std::string::npos) << msg;
  }
}

// Both ways of reading mapped pinned memory gather exactly the twin's bytes: random rows (with
// repeats) of 656, 1152 and 4096 bytes into a strided destination, over more rows than lanes
// and blocks so that every lane runs several stages; the gaps between rows stay untouched.
TEST(CoreGpu, HostGatherMethodsMatchTheTwin) {
  HISPARSE_REQUIRE_GPU();
#if HISPARSE_WITH_CUDA
  Rng rng(5);
  for (const std::size_t row : {std::size_t{656}, std::size_t{1152}, std::size_t{4096}}) {
    const std::size_t src_stride = row + 32, dst_stride = row + 16;
    const std::int64_t src_rows = 20000, rows = 7777;
    auto src = Buffer<std::uint8_t>::pinned(src_rows * src_stride, Backend::cuda, "src rows");
    for (std::size_t i = 0; i < src.size(); ++i)
      src.host_data()[i] = static_cast<std::uint8_t>(rng.next_bits());
    std::vector<std::int32_t> which(static_cast<std::size_t>(rows));
    for (auto& w : which) w = static_cast<std::int32_t>(rng.below(src_rows));
    auto d_which = Buffer<std::int32_t>::device(which.size(), Backend::cuda, "rows");
    copy_bytes(d_which.device_data(), which.data(), which.size() * 4, Backend::cuda);
    std::vector<std::uint8_t> want(rows * dst_stride, 0xa5);
    kernels::HostGatherArgs ref{src.host_data(), src_stride, which.data(), want.data(),
                                dst_stride,      row,        rows};
    kernels::host_gather_ref(ref);
    auto dst = Buffer<std::uint8_t>::device(want.size(), Backend::cuda, "gathered");
    Stream stream(Backend::cuda);
    for (const auto method :
         {kernels::HostReadMethod::sm_loads, kernels::HostReadMethod::bulk_async})
      for (const int blocks : {0, 3}) {
        SCOPED_TRACE(std::string(kernels::host_read_method_name(method)) + ", row " +
                     std::to_string(row) + ", blocks " + std::to_string(blocks));
        copy_bytes(dst.device_data(), std::vector<std::uint8_t>(want.size(), 0xa5).data(),
                   want.size(), Backend::cuda);
        kernels::HostGatherArgs a = ref;
        a.src = src.device_data();
        a.src_rows = d_which.device_data();
        a.dst = dst.device_data();
        kernels::launch_host_gather(a, method, blocks, stream.native());
        stream.synchronize();
        std::vector<std::uint8_t> got(want.size());
        copy_bytes(got.data(), dst.device_data(), got.size(), Backend::cuda);
        EXPECT_EQ(got, want);
      }
  }
#endif
}

}  // namespace
}  // namespace hisparse
