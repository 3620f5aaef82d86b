#include "bench/ceilings.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/memory.hpp"
#include "core/stream.hpp"
#include "kernels/common/host_gather.hpp"

namespace hisparse {
namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

#if HISPARSE_WITH_CUDA
// Median bandwidth in GB/s of `repeats` timed calls of `move(stream)` (after one warm-up), each
// counted as `counted` bytes.
template <typename Move>
double time_moves(double counted, int repeats, Move move) {
  Stream stream(Backend::cuda);
  Event start(Backend::cuda), stop(Backend::cuda);
  std::vector<double> gbps;
  for (int r = -1; r < repeats; ++r) {
    start.record(stream);
    move(stream.native());
    stop.record(stream);
    stop.synchronize();
    if (r >= 0) gbps.push_back(counted / (Event::elapsed_ms(start, stop) * 1e-3) / 1e9);
  }
  return median(gbps);
}
double time_copies(void* dst, const void* src, std::size_t bytes, double counted, int repeats) {
  return time_moves(counted, repeats, [&](cudaStream_t s) {
    HISPARSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  });
}
// SM loads of mapped pinned memory: contiguous 4 KiB rows, the host-gather kernel's defaults.
double time_sm_reads(const Allocation& host, const Allocation& dev, std::size_t bytes,
                     int repeats) {
  constexpr std::size_t kRow = 4096;
  kernels::HostGatherArgs g;
  g.src = static_cast<const std::uint8_t*>(host.device_data());
  g.src_stride = kRow;
  g.dst = static_cast<std::uint8_t*>(dev.device_data());
  g.dst_stride = kRow;
  g.row_bytes = kRow;
  g.rows = static_cast<std::int64_t>(bytes / kRow);
  if (g.rows == 0) return 0.0;
  kernels::check_host_gather(g);
  return time_moves(static_cast<double>(g.rows) * kRow, repeats, [&](cudaStream_t s) {
    kernels::launch_host_gather(g, kernels::HostReadMethod::sm_loads, 0, s);
  });
}
#endif
}  // namespace

Ceilings measure_ceilings(const Device& device, std::size_t bytes, int repeats) {
  Ceilings c;
  c.backend = device.backend();
  c.bytes = bytes;
  c.device = device.properties().name;
  if (device.backend() == Backend::cpu) {
    auto a = Allocation::host(bytes, "host copy probe");
    auto b = Allocation::host(bytes, "host copy probe");
    std::memset(a.host_data(), 1, bytes);
    std::memset(b.host_data(), 2, bytes);
    std::vector<double> gbps;
    for (int r = -1; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.host_data(), a.host_data(), bytes);
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 0)
        gbps.push_back(2.0 * static_cast<double>(bytes) /
                       std::chrono::duration<double>(t1 - t0).count() / 1e9);
    }
    c.host_copy_gbps = median(gbps);
    return c;
  }
#if HISPARSE_WITH_CUDA
  device.activate();
  auto host = Allocation::pinned(bytes, Backend::cuda, "PCIe probe (pinned host)");
  auto dev_a = Allocation::device(bytes, Backend::cuda, "PCIe/HBM probe (device)");
  auto dev_b = Allocation::device(bytes, Backend::cuda, "HBM probe (device)");
  std::memset(host.host_data(), 0x5a, bytes);
  HISPARSE_CUDA_CHECK(cudaMemset(dev_a.device_data(), 0x3c, bytes));
  HISPARSE_CUDA_CHECK(cudaMemset(dev_b.device_data(), 0x7e, bytes));
  const double n = static_cast<double>(bytes);
  c.h2d_gbps = time_copies(dev_a.device_data(), host.host_data(), bytes, n, repeats);
  c.d2h_gbps = time_copies(host.host_data(), dev_a.device_data(), bytes, n, repeats);
  c.sm_read_gbps = time_sm_reads(host, dev_a, bytes, repeats);
  c.hbm_copy_gbps = time_copies(dev_b.device_data(), dev_a.device_data(), bytes, 2.0 * n, repeats);
#endif
  return c;
}

void to_json(nlohmann::json& j, const Ceilings& c) {
  j = nlohmann::json{{"device", c.device},
                     {"backend", std::string(name_of(c.backend))},
                     {"bytes", c.bytes},
                     {"h2d_gbps", c.h2d_gbps},
                     {"d2h_gbps", c.d2h_gbps},
                     {"hbm_copy_gbps", c.hbm_copy_gbps},
                     {"sm_read_gbps", c.sm_read_gbps},
                     {"host_copy_gbps", c.host_copy_gbps}};
}

}  // namespace hisparse
