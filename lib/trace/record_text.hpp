// A compact, line-oriented text form of TraceRecords: one record per line, `type key=value ...`,
// strings in double quotes. It is how CPU tests get recorded activity (tests/fixtures/trace/) and
// how a real GPU session can be saved for later (TraceSession -> write_records_text).
//
//   hisparse-trace-records 1
//   label text="iota demo"
//   stats dropped=0 buffers=1
//   clock cupti=1000000 host=5000000
//   api start=1000100 end=1000900 pid=7 tid=7 corr=5 cbid=211 name="cudaLaunchKernel" ret=0
//   kernel start=1002000 end=1004000 device=0 context=1 stream=13 corr=5 name="_Z4iotaPf"
//          grid=4,1,1 block=256,1,1 regs=16 smem=0 dsmem=0          (one line in the file)
//   marker kind=start ts=1000050 id=1 pid=7 tid=7 name="step" domain="hisparse"
//   markerdata id=1 colour=0xff455a64 category=1 payload=0
//
// Lines starting with '#' and blank lines are ignored. Errors name the source, the line and the
// key.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "trace/records.hpp"

namespace hisparse::trace {

/// Parses the text form; `source` names the input in error messages (a path or "<string>").
/// Throws hisparse::Error naming source:line and the offending key or value.
[[nodiscard]] TraceRecords parse_records_text(std::string_view text, const std::string& source);
/// Reads and parses a file; throws Error naming the path when it cannot be read.
[[nodiscard]] TraceRecords read_records_text(const std::filesystem::path& path);

/// The text form of `records`; parse_records_text(records_to_text(r)) == r field by field.
[[nodiscard]] std::string records_to_text(const TraceRecords& records);
void write_records_text(const TraceRecords& records, const std::filesystem::path& path);

}  // namespace hisparse::trace
