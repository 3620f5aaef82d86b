// The text form of trace records: round trip and error messages.
#include "trace/record_text.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.hpp"
#include "support/error_message.hpp"

namespace hisparse::trace {
namespace {

std::string error_of(std::string_view text) {
  return test::error_message([&] { (void)parse_records_text(text, "t.records"); });
}

TEST(TraceRecordText, FixtureRoundTripsExactly) {
  const auto path =
      std::filesystem::path(HISPARSE_TEST_FIXTURES) / "trace/decode_two_steps.records";
  const auto records = read_records_text(path);
  EXPECT_EQ(records.label, "fixture hisparse c=2");
  EXPECT_EQ(records.kernels.size(), 8u);
  EXPECT_EQ(records.memcpys.size(), 1u);
  EXPECT_EQ(records.memsets.size(), 1u);
  EXPECT_EQ(records.runtime_calls.size(), 8u);
  EXPECT_EQ(records.markers.size(), 21u);
  EXPECT_EQ(records.marker_data.size(), 9u);
  EXPECT_EQ(records.clock.size(), 2u);
  EXPECT_EQ(records.buffers, 2u);
  const auto& k = records.kernels[1];
  EXPECT_EQ(k.name, "_Z14indexer_kernelPKfPfi");
  EXPECT_EQ(k.grid, (std::array<std::int32_t, 3>{132, 1, 1}));
  EXPECT_EQ(k.dynamic_shared_bytes, 4096);
  EXPECT_EQ(records.memcpys[0].kind, CopyKind::htod);
  EXPECT_EQ(records.memcpys[0].src, MemorySpace::pinned);
  EXPECT_EQ(records.marker_data[0].colour, 0xff455a64u);
  EXPECT_EQ(records.environment[1].power_limit_mw, 700000u);
  const std::string text = records_to_text(records);
  EXPECT_EQ(records_to_text(parse_records_text(text, "again")), text);
}

TEST(TraceRecordText, StringsWithQuotesAndNewlinesSurvive) {
  TraceRecords r;
  r.label = "a \"label\" with \\ and\nnewline";
  r.markers.push_back({MarkerKind::start, 5, 1, 2, 3, "name with = and spaces", "dom"});
  const auto back = parse_records_text(records_to_text(r), "s");
  EXPECT_EQ(back.label, r.label);
  ASSERT_EQ(back.markers.size(), 1u);
  EXPECT_EQ(back.markers[0].name, "name with = and spaces");
  EXPECT_EQ(back.markers[0].thread, 3u);
}

TEST(TraceRecordText, ErrorsNameTheLineAndKey) {
  const std::string head = "hisparse-trace-records 1\n";
  EXPECT_EQ(error_of(head + "kernel start=1 colour=3\n"),
            "t.records:2: kernel colour: unknown key; a kernel record has the keys: start, end, "
            "device, context, "
            "stream, corr, name, grid, block, regs, smem, dsmem, local, graph");
  EXPECT_EQ(
      error_of(head + "\n# c\nkernel start=-1\n"),
      "t.records:4: kernel start: '-1' is not a valid 64-bit unsigned integer; write a decimal (or "
      "0x-prefixed hexadecimal) integer in range");
  EXPECT_EQ(error_of(head + "memcpy kind=sideways\n"),
            "t.records:2: memcpy kind: unknown value 'sideways'; use one of: unknown, HtoD, DtoH, "
            "HtoA, AtoH, AtoA, "
            "AtoD, DtoA, DtoD, HtoH, PtoP");
  EXPECT_EQ(error_of(head + "kernel grid=1,2\n"),
            "t.records:2: kernel grid: needs three values x,y,z; write e.g. 128,1,1");
  EXPECT_EQ(error_of(head + "kernel name=\"open\n"),
            "t.records:2: kernel name: unterminated string; close the string with \"");
  EXPECT_EQ(error_of(head + "kernel start\n"),
            "t.records:2: kernel start: expected key=value; write every field as key=value");
  EXPECT_EQ(error_of(head + "bogus a=1\n"),
            "t.records:2: unknown record type 'bogus'; use one of: label, stats, clock, device, "
            "env, api, kernel, "
            "memcpy, memset, marker, markerdata");
  EXPECT_EQ(error_of("kernel start=1\n"),
            "t.records:1: not a hisparse trace-records file; start the file with the line "
            "'hisparse-trace-records 1'");
  EXPECT_EQ(error_of("hisparse-trace-records 2\n"),
            "t.records:1: unsupported format version; this build reads version 1");
  EXPECT_EQ(error_of("# nothing\n"),
            "t.records: empty trace-records file; start the file with the line "
            "'hisparse-trace-records 1'");
}

TEST(TraceRecordText, MissingFileIsNamed) {
  EXPECT_EQ(test::error_message([] { (void)read_records_text("/no/such/file.records"); }),
            "/no/such/file.records: cannot open the trace-records file; check the path and "
            "its permissions");
}

}  // namespace
}  // namespace hisparse::trace
