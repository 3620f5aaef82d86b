#include "trace/record_text.hpp"

#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "core/error.hpp"

namespace hisparse::trace {

const char* name_of(CopyKind k) noexcept {
  switch (k) {
    case CopyKind::unknown:
      return "unknown";
    case CopyKind::htod:
      return "HtoD";
    case CopyKind::dtoh:
      return "DtoH";
    case CopyKind::htoa:
      return "HtoA";
    case CopyKind::atoh:
      return "AtoH";
    case CopyKind::atoa:
      return "AtoA";
    case CopyKind::atod:
      return "AtoD";
    case CopyKind::dtoa:
      return "DtoA";
    case CopyKind::dtod:
      return "DtoD";
    case CopyKind::htoh:
      return "HtoH";
    case CopyKind::ptop:
      return "PtoP";
  }
  return "unknown";
}

const char* name_of(MemorySpace m) noexcept {
  switch (m) {
    case MemorySpace::unknown:
      return "unknown";
    case MemorySpace::pageable:
      return "pageable";
    case MemorySpace::pinned:
      return "pinned";
    case MemorySpace::device:
      return "device";
    case MemorySpace::array:
      return "array";
    case MemorySpace::managed:
      return "managed";
    case MemorySpace::device_static:
      return "device_static";
    case MemorySpace::managed_static:
      return "managed_static";
  }
  return "unknown";
}

const char* name_of(MarkerKind k) noexcept {
  switch (k) {
    case MarkerKind::start:
      return "start";
    case MarkerKind::end:
      return "end";
    case MarkerKind::instant:
      return "instant";
  }
  return "instant";
}

const char* name_of(EnvironmentKind k) noexcept {
  switch (k) {
    case EnvironmentKind::speed:
      return "speed";
    case EnvironmentKind::temperature:
      return "temperature";
    case EnvironmentKind::power:
      return "power";
    case EnvironmentKind::cooling:
      return "cooling";
  }
  return "speed";
}

namespace {

constexpr std::string_view magic = "hisparse-trace-records";

/// Where a value came from, for error messages.
struct Where {
  const std::string& source;
  std::size_t line;
  std::string_view type;
  [[nodiscard]] std::string at(std::string_view key) const {
    return fmt::format("{}:{}: {} {}", source, line, type, key);
  }
};

template <class E, std::size_t N>
E parse_enum(std::string_view v, const Where& w, std::string_view key,
             const std::array<E, N>& all) {
  std::string names;
  for (E e : all) {
    if (v == name_of(e)) return e;
    names += names.empty() ? "" : ", ";
    names += name_of(e);
  }
  throw Error(w.at(key), fmt::format("unknown value '{}'", v),
              fmt::format("use one of: {}", names));
}

template <class T>
T parse_number(std::string_view v, const Where& w, std::string_view key) {
  T out{};
  int base = 10;
  if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
    v.remove_prefix(2);
    base = 16;
  }
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out, base);
  if (ec != std::errc{} || ptr != v.data() + v.size())
    throw Error(w.at(key),
                fmt::format("'{}' is not a valid {}-bit {} integer", v, sizeof(T) * 8,
                            std::is_signed_v<T> ? "signed" : "unsigned"),
                "write a decimal (or 0x-prefixed hexadecimal) integer in range");
  return out;
}

/// One key of a record type: how to read it from text and how to print it.
struct Field {
  const char* key;
  std::function<void(std::string_view, const Where&)> parse;
  std::function<void(std::string&)> print;
};

void append_quoted(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  out += '"';
}

template <class T>
Field bind(const char* key, T& member) {
  if constexpr (std::is_same_v<T, std::string>) {
    return {key, [&member](std::string_view v, const Where&) { member = std::string(v); },
            [&member](std::string& out) { append_quoted(out, member); }};
  } else if constexpr (std::is_same_v<T, bool>) {
    return {key,
            [&member, key](std::string_view v, const Where& w) {
              if (v != "0" && v != "1")
                throw Error(w.at(key), fmt::format("'{}' is not 0 or 1", v), "write 0 or 1");
              member = v == "1";
            },
            [&member](std::string& out) { out += member ? '1' : '0'; }};
  } else if constexpr (std::is_same_v<T, std::array<std::int32_t, 3>>) {
    return {key,
            [&member, key](std::string_view v, const Where& w) {
              std::size_t i = 0;
              while (i < 3) {
                const auto comma = v.find(',');
                member[i++] = parse_number<std::int32_t>(v.substr(0, comma), w, key);
                if (comma == std::string_view::npos) break;
                v.remove_prefix(comma + 1);
              }
              if (i != 3) throw Error(w.at(key), "needs three values x,y,z", "write e.g. 128,1,1");
            },
            [&member](std::string& out) {
              out += fmt::format("{},{},{}", member[0], member[1], member[2]);
            }};
  } else {
    return {
        key,
        [&member, key](std::string_view v, const Where& w) { member = parse_number<T>(v, w, key); },
        [&member](std::string& out) { out += fmt::format("{}", member); }};
  }
}

template <class E, std::size_t N>
Field bind_enum(const char* key, E& member, const std::array<E, N>& all) {
  return {key,
          [&member, key, all](std::string_view v, const Where& w) {
            member = parse_enum(v, w, key, all);
          },
          [&member](std::string& out) { out += name_of(member); }};
}

Field bind_hex(const char* key, std::uint32_t& member) {
  return {key,
          [&member, key](std::string_view v, const Where& w) {
            member = parse_number<std::uint32_t>(v, w, key);
          },
          [&member](std::string& out) { out += fmt::format("0x{:08x}", member); }};
}

constexpr std::array all_copy_kinds{CopyKind::unknown, CopyKind::htod, CopyKind::dtoh,
                                    CopyKind::htoa,    CopyKind::atoh, CopyKind::atoa,
                                    CopyKind::atod,    CopyKind::dtoa, CopyKind::dtod,
                                    CopyKind::htoh,    CopyKind::ptop};
constexpr std::array all_spaces{MemorySpace::unknown,       MemorySpace::pageable,
                                MemorySpace::pinned,        MemorySpace::device,
                                MemorySpace::array,         MemorySpace::managed,
                                MemorySpace::device_static, MemorySpace::managed_static};
constexpr std::array all_marker_kinds{MarkerKind::start, MarkerKind::end, MarkerKind::instant};
constexpr std::array all_env_kinds{EnvironmentKind::speed, EnvironmentKind::temperature,
                                   EnvironmentKind::power, EnvironmentKind::cooling};

std::vector<Field> fields(KernelRecord& r) {
  return {bind("start", r.start),
          bind("end", r.end),
          bind("device", r.device),
          bind("context", r.context),
          bind("stream", r.stream),
          bind("corr", r.correlation),
          bind("name", r.name),
          bind("grid", r.grid),
          bind("block", r.block),
          bind("regs", r.registers_per_thread),
          bind("smem", r.static_shared_bytes),
          bind("dsmem", r.dynamic_shared_bytes),
          bind("local", r.local_bytes_per_thread),
          bind("graph", r.graph_id)};
}
std::vector<Field> fields(MemcpyRecord& r) {
  return {bind("start", r.start),
          bind("end", r.end),
          bind("device", r.device),
          bind("context", r.context),
          bind("stream", r.stream),
          bind("corr", r.correlation),
          bind("bytes", r.bytes),
          bind_enum("kind", r.kind, all_copy_kinds),
          bind_enum("src", r.src, all_spaces),
          bind_enum("dst", r.dst, all_spaces),
          bind("graph", r.graph_id)};
}
std::vector<Field> fields(MemsetRecord& r) {
  return {bind("start", r.start),
          bind("end", r.end),
          bind("device", r.device),
          bind("context", r.context),
          bind("stream", r.stream),
          bind("corr", r.correlation),
          bind("bytes", r.bytes),
          bind("value", r.value),
          bind_enum("memory", r.memory, all_spaces),
          bind("graph", r.graph_id)};
}
std::vector<Field> fields(RuntimeApiRecord& r) {
  return {bind("start", r.start), bind("end", r.end),          bind("pid", r.process),
          bind("tid", r.thread),  bind("corr", r.correlation), bind("cbid", r.callback_id),
          bind("name", r.name),   bind("ret", r.return_value)};
}
std::vector<Field> fields(NvtxMarkerRecord& r) {
  return {bind_enum("kind", r.kind, all_marker_kinds),
          bind("ts", r.timestamp),
          bind("id", r.id),
          bind("pid", r.process),
          bind("tid", r.thread),
          bind("name", r.name),
          bind("domain", r.domain)};
}
std::vector<Field> fields(NvtxMarkerDataRecord& r) {
  return {bind("id", r.id), bind_hex("colour", r.colour), bind("category", r.category),
          bind("has_payload", r.has_payload), bind("payload", r.payload)};
}
std::vector<Field> fields(DeviceRecord& r) {
  return {bind("id", r.id),
          bind("name", r.name),
          bind("sms", r.multiprocessors),
          bind("cc_major", r.compute_major),
          bind("cc_minor", r.compute_minor),
          bind("memory", r.global_memory_bytes),
          bind("bandwidth_kbps", r.memory_bandwidth_kbps),
          bind("l2", r.l2_bytes),
          bind("clock_khz", r.core_clock_khz)};
}
std::vector<Field> fields(EnvironmentRecord& r) {
  return {bind("device", r.device),
          bind("ts", r.timestamp),
          bind_enum("kind", r.kind, all_env_kinds),
          bind("sm_mhz", r.sm_clock_mhz),
          bind("mem_mhz", r.memory_clock_mhz),
          bind("temp_c", r.temperature_c),
          bind("power_mw", r.power_mw),
          bind("limit_mw", r.power_limit_mw),
          bind("fan", r.fan_percent)};
}
std::vector<Field> fields(ClockSample& r) {
  return {bind("cupti", r.cupti_ns), bind("host", r.host_ns)};
}

/// Splits `key=value` tokens; values may be double-quoted with \" \\ \n escapes.
class Tokenizer {
 public:
  Tokenizer(std::string_view line, const Where& where) : s_(line), where_(where) {}

  /// Next key and value; false at the end of the line.
  bool next(std::string_view& key, std::string& value) {
    skip_space();
    if (pos_ >= s_.size()) return false;
    const std::size_t key_start = pos_;
    while (pos_ < s_.size() && s_[pos_] != '=' && !is_space(s_[pos_])) ++pos_;
    key = s_.substr(key_start, pos_ - key_start);
    if (pos_ >= s_.size() || s_[pos_] != '=')
      throw Error(where_.at(key), "expected key=value", "write every field as key=value");
    ++pos_;
    value.clear();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      ++pos_;
      while (true) {
        if (pos_ >= s_.size())
          throw Error(where_.at(key), "unterminated string", "close the string with \"");
        const char c = s_[pos_++];
        if (c == '"') break;
        if (c == '\\' && pos_ < s_.size()) {
          const char e = s_[pos_++];
          value += e == 'n' ? '\n' : e;
        } else {
          value += c;
        }
      }
    } else {
      const std::size_t v_start = pos_;
      while (pos_ < s_.size() && !is_space(s_[pos_])) ++pos_;
      value.assign(s_.substr(v_start, pos_ - v_start));
    }
    return true;
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  std::string_view s_;
  const Where& where_;
  std::size_t pos_ = 0;
};

void parse_fields(std::vector<Field> fs, Tokenizer& tok, const Where& w) {
  std::string_view key;
  std::string value;
  while (tok.next(key, value)) {
    bool found = false;
    for (auto& f : fs) {
      if (key == f.key) {
        f.parse(value, w);
        found = true;
        break;
      }
    }
    if (!found) {
      std::string keys;
      for (auto& f : fs) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", f.key);
      throw Error(w.at(key), "unknown key",
                  fmt::format("a {} record has the keys: {}", w.type, keys));
    }
  }
}

template <class R>
void parse_into(std::vector<R>& out, Tokenizer& tok, const Where& w) {
  R r{};
  parse_fields(fields(r), tok, w);
  out.push_back(std::move(r));
}

template <class R>
void print_records(std::string& out, const char* type, const std::vector<R>& records) {
  for (const R& record : records) {
    R copy = record;
    out += type;
    for (auto& f : fields(copy)) {
      out += ' ';
      out += f.key;
      out += '=';
      f.print(out);
    }
    out += '\n';
  }
}

}  // namespace

TraceRecords parse_records_text(std::string_view text, const std::string& source) {
  TraceRecords r;
  std::size_t line_no = 0;
  bool header = false;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#') continue;
    line.remove_prefix(first);
    const auto type_end = std::min(line.find_first_of(" \t\r"), line.size());
    const std::string_view type = line.substr(0, type_end);
    const Where w{source, line_no, type};
    if (!header) {
      if (type != magic)
        throw Error(fmt::format("{}:{}", source, line_no), "not a hisparse trace-records file",
                    fmt::format("start the file with the line '{} 1'", magic));
      if (line.substr(type_end).find_first_not_of(" \t\r") == std::string_view::npos ||
          line.substr(line.find_first_not_of(" \t\r", type_end)) != "1")
        throw Error(fmt::format("{}:{}", source, line_no), "unsupported format version",
                    "this build reads version 1");
      header = true;
      continue;
    }
    Tokenizer tok(line.substr(type_end), w);
    if (type == "label") {
      parse_fields({bind("text", r.label)}, tok, w);
    } else if (type == "stats") {
      parse_fields({bind("dropped", r.dropped_records), bind("buffers", r.buffers)}, tok, w);
    } else if (type == "clock") {
      parse_into(r.clock, tok, w);
    } else if (type == "kernel") {
      parse_into(r.kernels, tok, w);
    } else if (type == "memcpy") {
      parse_into(r.memcpys, tok, w);
    } else if (type == "memset") {
      parse_into(r.memsets, tok, w);
    } else if (type == "api") {
      parse_into(r.runtime_calls, tok, w);
    } else if (type == "marker") {
      parse_into(r.markers, tok, w);
    } else if (type == "markerdata") {
      parse_into(r.marker_data, tok, w);
    } else if (type == "device") {
      parse_into(r.devices, tok, w);
    } else if (type == "env") {
      parse_into(r.environment, tok, w);
    } else {
      throw Error(fmt::format("{}:{}", source, line_no),
                  fmt::format("unknown record type '{}'", type),
                  "use one of: label, stats, clock, device, env, api, kernel, memcpy, memset, "
                  "marker, markerdata");
    }
  }
  if (!header)
    throw Error(source, "empty trace-records file",
                fmt::format("start the file with the line '{} 1'", magic));
  return r;
}

TraceRecords read_records_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(path.string(), "cannot open the trace-records file",
                "check the path and its permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_records_text(ss.str(), path.string());
}

std::string records_to_text(const TraceRecords& r) {
  std::string out = fmt::format("{} 1\n", magic);
  out += "label text=";
  append_quoted(out, r.label);
  out += fmt::format("\nstats dropped={} buffers={}\n", r.dropped_records, r.buffers);
  print_records(out, "clock", r.clock);
  print_records(out, "device", r.devices);
  print_records(out, "env", r.environment);
  print_records(out, "api", r.runtime_calls);
  print_records(out, "kernel", r.kernels);
  print_records(out, "memcpy", r.memcpys);
  print_records(out, "memset", r.memsets);
  print_records(out, "marker", r.markers);
  print_records(out, "markerdata", r.marker_data);
  return out;
}

void write_records_text(const TraceRecords& records, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out)
    throw Error(path.string(), "cannot create the trace-records file",
                "check the directory exists and is writable");
  const std::string text = records_to_text(records);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out)
    throw Error(path.string(), "writing the trace-records file failed", "check free disk space");
}

}  // namespace hisparse::trace
