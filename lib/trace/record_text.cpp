#include "trace/record_text.hpp"

#include <fmt/format.h>

#include <initializer_list>

#include <array>
#include <charconv>
#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "core/error.hpp"

namespace hisparse::trace {

namespace {

/// An enumerator and its name in the text format and in trace labels.
template <class E>
struct Named {
  E value;
  const char* name;
};

// Every enumerator, in declaration order (the order "use one of" lists them in).
constexpr std::array<Named<CopyKind>, 11> copy_kinds{{{CopyKind::unknown, "unknown"},
                                                      {CopyKind::htod, "HtoD"},
                                                      {CopyKind::dtoh, "DtoH"},
                                                      {CopyKind::htoa, "HtoA"},
                                                      {CopyKind::atoh, "AtoH"},
                                                      {CopyKind::atoa, "AtoA"},
                                                      {CopyKind::atod, "AtoD"},
                                                      {CopyKind::dtoa, "DtoA"},
                                                      {CopyKind::dtod, "DtoD"},
                                                      {CopyKind::htoh, "HtoH"},
                                                      {CopyKind::ptop, "PtoP"}}};
constexpr std::array<Named<MemorySpace>, 8> memory_spaces{
    {{MemorySpace::unknown, "unknown"},
     {MemorySpace::pageable, "pageable"},
     {MemorySpace::pinned, "pinned"},
     {MemorySpace::device, "device"},
     {MemorySpace::array, "array"},
     {MemorySpace::managed, "managed"},
     {MemorySpace::device_static, "device_static"},
     {MemorySpace::managed_static, "managed_static"}}};
constexpr std::array<Named<MarkerKind>, 3> marker_kinds{
    {{MarkerKind::start, "start"}, {MarkerKind::end, "end"}, {MarkerKind::instant, "instant"}}};
constexpr std::array<Named<EnvironmentKind>, 4> environment_kinds{
    {{EnvironmentKind::speed, "speed"},
     {EnvironmentKind::temperature, "temperature"},
     {EnvironmentKind::power, "power"},
     {EnvironmentKind::cooling, "cooling"}}};

/// Entry i names the enumerator of value i (name_of() indexes the table).
template <class E, std::size_t N>
constexpr bool in_value_order(const std::array<Named<E>, N>& table) {
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(table[i].value) != i) return false;
  return true;
}
static_assert(in_value_order(copy_kinds));
static_assert(in_value_order(memory_spaces));
static_assert(in_value_order(marker_kinds));
static_assert(in_value_order(environment_kinds));

template <class E, std::size_t N>
const char* name_in(const std::array<Named<E>, N>& table, E value, const char* fallback) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? table[i].name : fallback;
}

}  // namespace

const char* name_of(CopyKind k) noexcept {
  return name_in(copy_kinds, k, "unknown");
}
const char* name_of(MemorySpace m) noexcept {
  return name_in(memory_spaces, m, "unknown");
}
const char* name_of(MarkerKind k) noexcept {
  return name_in(marker_kinds, k, "instant");
}
const char* name_of(EnvironmentKind k) noexcept {
  return name_in(environment_kinds, k, "speed");
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
             const std::array<Named<E>, N>& all) {
  std::string names;
  for (const auto& [e, name] : all) {
    if (v == name) return e;
    names += names.empty() ? "" : ", ";
    names += name;
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
Field bind_enum(const char* key, E& member, const std::array<Named<E>, N>& all) {
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

/// The placement fields kernel, memcpy and memset records share, followed by `own`.
template <class Record>
std::vector<Field> gpu_activity_fields(Record& r, std::initializer_list<Field> own) {
  std::vector<Field> f{bind("start", r.start),   bind("end", r.end),
                       bind("device", r.device), bind("context", r.context),
                       bind("stream", r.stream), bind("corr", r.correlation)};
  f.insert(f.end(), own.begin(), own.end());
  return f;
}

std::vector<Field> fields(KernelRecord& r) {
  return gpu_activity_fields(
      r, {bind("name", r.name), bind("grid", r.grid), bind("block", r.block),
          bind("regs", r.registers_per_thread), bind("smem", r.static_shared_bytes),
          bind("dsmem", r.dynamic_shared_bytes), bind("local", r.local_bytes_per_thread),
          bind("graph", r.graph_id)});
}
std::vector<Field> fields(MemcpyRecord& r) {
  return gpu_activity_fields(
      r, {bind("bytes", r.bytes), bind_enum("kind", r.kind, copy_kinds),
          bind_enum("src", r.src, memory_spaces), bind_enum("dst", r.dst, memory_spaces),
          bind("graph", r.graph_id)});
}
std::vector<Field> fields(MemsetRecord& r) {
  return gpu_activity_fields(
      r, {bind("bytes", r.bytes), bind("value", r.value),
          bind_enum("memory", r.memory, memory_spaces), bind("graph", r.graph_id)});
}
std::vector<Field> fields(RuntimeApiRecord& r) {
  return {bind("start", r.start), bind("end", r.end),          bind("pid", r.process),
          bind("tid", r.thread),  bind("corr", r.correlation), bind("cbid", r.callback_id),
          bind("name", r.name),   bind("ret", r.return_value)};
}
std::vector<Field> fields(NvtxMarkerRecord& r) {
  return {bind_enum("kind", r.kind, marker_kinds),
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
          bind_enum("kind", r.kind, environment_kinds),
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

/// Calls f(type, list) for each record list of `r` (TraceRecords, const or not), in the order
/// the text format writes them.
template <class Records, class F>
void for_each_record_list(Records& r, F&& f) {
  f("clock", r.clock);
  f("device", r.devices);
  f("env", r.environment);
  f("api", r.runtime_calls);
  f("kernel", r.kernels);
  f("memcpy", r.memcpys);
  f("memset", r.memsets);
  f("marker", r.markers);
  f("markerdata", r.marker_data);
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
    } else {
      bool known = false;
      for_each_record_list(r, [&](const char* name, auto& list) {
        if (!known && type == name) {
          parse_into(list, tok, w);
          known = true;
        }
      });
      if (!known) {
        std::string types = "label, stats";
        for_each_record_list(
            r, [&](const char* name, const auto&) { types += ", " + std::string(name); });
        throw Error(fmt::format("{}:{}", source, line_no),
                    fmt::format("unknown record type '{}'", type), "use one of: " + types);
      }
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
  for_each_record_list(r,
                       [&](const char* type, const auto& list) { print_records(out, type, list); });
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
