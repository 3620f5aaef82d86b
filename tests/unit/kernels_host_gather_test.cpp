#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/common/host_gather.hpp"
#include "kernels/common/host_gather_config.hpp"

namespace hisparse::kernels {
namespace {

TEST(KernelsHostGather, TwinGathersListedRowsByHand) {
  // Source rows of 16 bytes at a stride of 32: byte k of row r is 10 r + k.
  alignas(16) std::uint8_t src[4 * 32] = {};
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 32; ++k) src[r * 32 + k] = static_cast<std::uint8_t>(10 * r + k);
  const std::int32_t rows[] = {2, 0, 2};
  alignas(16) std::uint8_t dst[3 * 48];
  std::fill(std::begin(dst), std::end(dst), 0xee);
  host_gather_ref({src, 32, rows, dst, 48, 16, 3});
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 48; ++k)
      EXPECT_EQ(dst[i * 48 + k], k < 16 ? 10 * rows[i] + k : 0xee) << "row " << i << " byte " << k;
  // Without a list, row i comes from row i.
  host_gather_ref({src, 32, nullptr, dst, 48, 16, 2});
  EXPECT_EQ(dst[48], 10);
}

void expect_rejected(const HostGatherArgs& a, const std::string& what) {
  try {
    host_gather_ref(a);
    FAIL() << "accepted: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(KernelsHostGather, RejectsRowsTheBulkCopyCannotMove) {
  alignas(16) std::uint8_t buf[256] = {};
  expect_rejected({buf, 32, nullptr, buf, 32, 24, 1}, "row of 24 bytes");
  expect_rejected({buf, 16, nullptr, buf, 32, 32, 1}, "strides 16 / 32");
  expect_rejected({buf + 8, 32, nullptr, buf, 32, 16, 1}, "not 16-byte aligned");
  expect_rejected({nullptr, 32, nullptr, buf, 32, 16, 1}, "null");
  expect_rejected({buf, 32, nullptr, buf, 32, 16, -1}, "negative row count");
  EXPECT_NO_THROW(host_gather_ref({nullptr, 0, nullptr, nullptr, 0, 0, 0}));  // nothing to do
}

TEST(KernelsHostGather, BulkLanesShrinkForLargeRows) {
  namespace cfg = host_gather_config;
  EXPECT_EQ(cfg::bulk_lanes(656), 32);
  EXPECT_LT(cfg::bulk_lanes(4096), 32);
  EXPECT_GT(cfg::bulk_lanes(4096), 0);
  EXPECT_LE(cfg::bulk_shared_bytes(cfg::bulk_lanes(4096), 4096), cfg::kBulkSharedMax);
  EXPECT_GT(cfg::bulk_shared_bytes(cfg::bulk_lanes(4096) + 1, 4096), cfg::kBulkSharedMax);
  EXPECT_EQ(cfg::bulk_lanes(std::size_t{1} << 20), 0);
}

}  // namespace
}  // namespace hisparse::kernels
