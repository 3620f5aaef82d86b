#include "trace/chrome_trace_writer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <system_error>

#include "core/error.hpp"

namespace hisparse::trace {

void append_json_escaped(std::string& out, std::string_view s) {
  // Copy runs of plain characters at once: most names need no escaping at all.
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
    }
  }
  out.append(s.data() + run, s.size() - run);
}

namespace {

/// Appends the members of one JSON object, inserting commas.
class ObjectWriter {
 public:
  explicit ObjectWriter(std::string& out) : out_(out) { out_ += '{'; }
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;
  ~ObjectWriter() { out_ += '}'; }

  void key(std::string_view k) {
    if (!first_) out_ += ',';
    first_ = false;
    out_ += '"';
    out_ += k;  // keys are this file's literals and phase names: nothing to escape
    out_ += "\":";
  }
  void str(std::string_view k, std::string_view v) {
    key(k);
    out_ += '"';
    append_json_escaped(out_, v);
    out_ += '"';
  }
  template <class T>
  void num(std::string_view k, T v) {
    key(k);
    char buf[48];
    // fmt writes a floating-point value in the shortest form that reads back exactly.
    const char* end = fmt::format_to(buf, "{}", v);
    out_.append(buf, static_cast<std::size_t>(end - buf));
  }
  void boolean(std::string_view k, bool v) {
    key(k);
    out_ += v ? "true" : "false";
  }
  /// Microseconds with nanosecond precision, written exactly from integer nanoseconds.
  void micros(std::string_view k, std::int64_t ns) {
    key(k);
    if (ns < 0) {
      out_ += '-';
      ns = -ns;
    }
    char buf[32];
    const char* end = fmt::format_to(buf, "{}.{:03}", ns / 1000, ns % 1000);
    out_.append(buf, static_cast<std::size_t>(end - buf));
  }
  std::string& raw() { return out_; }

 private:
  std::string& out_;
  bool first_ = true;
};

std::string dims(const std::array<std::int32_t, 3>& d) {
  return fmt::format("[{},{},{}]", d[0], d[1], d[2]);
}

double gbps(std::uint64_t bytes, std::int64_t ns) {
  return ns > 0 ? static_cast<double>(bytes) / static_cast<double>(ns) : 0.0;
}

/// Tracks of one stream are numbered stream + lane * kLaneStride: CUDA stream ids are small, and
/// Perfetto reads tids as 32-bit numbers, so lane 1 of stream 18 is tid 1000018.
constexpr std::uint64_t kLaneStride = 1'000'000;

/// Assigns each activity the first lane of its (device, stream) that is free at its start, so that
/// no two slices of one track overlap. Lane 0 is the stream itself.
std::vector<std::uint64_t> stream_lanes(const std::vector<GpuActivity>& activities) {
  std::vector<std::size_t> order(activities.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return activities[a].start_ns < activities[b].start_ns;
  });
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::int64_t>> lane_end;
  std::vector<std::uint64_t> track(activities.size());
  for (const std::size_t i : order) {
    const GpuActivity& a = activities[i];
    auto& ends = lane_end[{a.device, a.stream}];
    std::size_t lane = 0;
    while (lane < ends.size() && ends[lane] > a.start_ns) ++lane;
    if (lane == ends.size()) ends.push_back(a.end_ns);
    ends[lane] = std::max(a.end_ns, a.start_ns);
    track[i] = a.stream + lane * kLaneStride;
  }
  return track;
}

}  // namespace

void ChromeTraceWriter::add(const Timeline& tl) {
  if (!have_origin_) {
    origin_ns_ = tl.begin_ns();
    have_origin_ = true;
  }
  const int index = static_cast<int>(sessions_.size());
  const int host_pid = (index + 1) * 100;
  auto gpu_pid = [host_pid](std::uint32_t device) {
    return host_pid + 1 + static_cast<int>(device);
  };
  const std::string label = tl.label().empty() ? fmt::format("session {}", index + 1) : tl.label();
  const auto& rec = tl.records();

  // A kernel launched with programmatic dependent launch (the swap-in's copy kernel) starts
  // before the previous kernel of its stream ends, and one Perfetto track cannot show overlapping
  // slices: such activities go to an extra lane of their stream (tid = stream + lane * stride).
  const std::vector<std::uint64_t> track = stream_lanes(tl.activities());
  Session session;
  std::string& out = session.events;
  std::size_t events = 0;
  auto begin_event = [&]() -> std::string& {
    if (events++ > 0) out += ',';
    out += '\n';
    return out;
  };
  auto metadata = [&](const char* what, int pid, std::optional<std::uint64_t> tid,
                      std::string_view arg_key, auto value) {
    ObjectWriter e(begin_event());
    e.str("ph", "M");
    e.str("name", what);
    e.num("pid", pid);
    if (tid) e.num("tid", *tid);
    e.key("args");
    ObjectWriter a(e.raw());
    if constexpr (std::is_convertible_v<decltype(value), std::string_view>)
      a.str(arg_key, value);
    else
      a.num(arg_key, value);
  };

  // Processes and tracks.
  metadata("process_name", host_pid, std::nullopt, "name", fmt::format("{} - host", label));
  metadata("process_sort_index", host_pid, std::nullopt, "sort_index", host_pid);
  std::vector<std::uint32_t> devices;
  for (const auto& s : tl.streams())
    if (devices.empty() || devices.back() != s.device) devices.push_back(s.device);
  for (const auto& env : rec.environment)
    if (std::find(devices.begin(), devices.end(), env.device) == devices.end())
      devices.push_back(env.device);
  for (const auto d : devices) {
    std::string name = fmt::format("{} - GPU {}", label, d);
    for (const auto& dev : rec.devices)
      if (dev.id == d && !dev.name.empty()) name += fmt::format(" ({})", dev.name);
    metadata("process_name", gpu_pid(d), std::nullopt, "name", name);
    metadata("process_sort_index", gpu_pid(d), std::nullopt, "sort_index", gpu_pid(d));
  }
  int sort = 0;
  for (const auto& t : tl.host_threads()) {
    metadata("thread_name", host_pid, t.thread, "name",
             t.thread == t.process ? fmt::format("main thread {}", t.thread)
                                   : fmt::format("thread {}", t.thread));
    metadata("thread_sort_index", host_pid, t.thread, "sort_index", sort++);
  }
  for (const auto& s : tl.streams()) {
    metadata("thread_name", gpu_pid(s.device), s.stream, "name",
             fmt::format("stream {}", s.stream));
    metadata("thread_sort_index", gpu_pid(s.device), s.stream, "sort_index",
             static_cast<std::int64_t>(s.stream));
  }
  std::set<std::pair<std::uint32_t, std::uint64_t>> extra_lanes;
  for (std::size_t i = 0; i < track.size(); ++i)
    if (track[i] != tl.activities()[i].stream)
      extra_lanes.emplace(tl.activities()[i].device, track[i]);
  for (const auto& [device, tid] : extra_lanes) {
    const auto stream = tid % kLaneStride;
    metadata("thread_name", gpu_pid(device), tid, "name",
             fmt::format("stream {} (overlapping launch {})", stream, tid / kLaneStride));
    metadata("thread_sort_index", gpu_pid(device), tid, "sort_index",
             static_cast<std::int64_t>(stream));
  }

  // NVTX ranges and marks.
  for (std::size_t i = 0; i < tl.ranges().size(); ++i) {
    const auto& r = tl.ranges()[i];
    auto args = [&](ObjectWriter& e) {
      e.key("args");
      ObjectWriter a(e.raw());
      if (!r.domain.empty()) a.str("domain", r.domain);
      if (r.phase) a.str("phase", phase_name(*r.phase));
      if (r.has_payload) a.num("payload", r.payload);
      if (r.colour != 0) a.str("colour", fmt::format("#{:06x}", r.colour & 0xffffffu));
      const auto step = tl.step_index(static_cast<int>(i));
      if (step >= 0) a.num("step", step);
      if (!r.terminated) a.boolean("unterminated", true);
    };
    if (r.nested) {
      ObjectWriter e(begin_event());
      e.str("ph", "X");
      e.str("cat", "nvtx");
      e.str("name", r.name);
      e.num("pid", host_pid);
      e.num("tid", r.thread);
      e.micros("ts", r.start_ns - origin_ns_);
      e.micros("dur", r.end_ns - r.start_ns);
      args(e);
    } else {
      // Not nested: an async slice, which Perfetto draws on its own track.
      for (const char* ph : {"b", "e"}) {
        ObjectWriter e(begin_event());
        e.str("ph", ph);
        e.str("cat", "nvtx");
        e.str("name", r.name);
        e.str("id", fmt::format("0x{:x}", (static_cast<std::uint64_t>(index + 1) << 32) | r.id));
        e.num("pid", host_pid);
        e.num("tid", r.thread);
        e.micros("ts", (ph[0] == 'b' ? r.start_ns : r.end_ns) - origin_ns_);
        if (ph[0] == 'b') args(e);
      }
    }
  }
  for (const auto& m : tl.instants()) {
    ObjectWriter e(begin_event());
    e.str("ph", "i");
    e.str("s", "t");
    e.str("cat", "nvtx");
    e.str("name", m.name);
    e.num("pid", host_pid);
    e.num("tid", m.thread);
    e.micros("ts", m.ts_ns - origin_ns_);
  }

  // CUDA runtime calls.
  if (options_.runtime_api) {
    for (const auto& c : rec.runtime_calls) {
      ObjectWriter e(begin_event());
      e.str("ph", "X");
      e.str("cat", "cuda_api");
      e.str("name", c.name.empty() ? fmt::format("runtime api {}", c.callback_id) : c.name);
      e.num("pid", host_pid);
      e.num("tid", c.thread);
      const auto start = tl.host_ns(c.start);
      e.micros("ts", start - origin_ns_);
      e.micros("dur", std::max<std::int64_t>(0, tl.host_ns(c.end) - start));
      e.key("args");
      ObjectWriter a(e.raw());
      a.num("correlation", c.correlation);
      if (c.return_value != 0) a.num("return", c.return_value);
    }
  }

  // GPU activities and flows.
  for (std::size_t slot = 0; slot < tl.activities().size(); ++slot) {
    const GpuActivity& act = tl.activities()[slot];
    const std::int64_t dur = act.end_ns - act.start_ns;
    {
      ObjectWriter e(begin_event());
      e.str("ph", "X");
      e.str("cat", name_of(act.kind));
      switch (act.kind) {
        case ActivityKind::kernel:
          e.str("name", tl.display_name(act));
          break;
        case ActivityKind::memcpy: {
          const auto& m = rec.memcpys[act.record];
          e.str("name", fmt::format("Memcpy {} ({} -> {})", name_of(m.kind), name_of(m.src),
                                    name_of(m.dst)));
          break;
        }
        case ActivityKind::memset:
          e.str("name", fmt::format("Memset ({})", name_of(rec.memsets[act.record].memory)));
          break;
      }
      e.num("pid", gpu_pid(act.device));
      e.num("tid", track[slot]);
      e.micros("ts", act.start_ns - origin_ns_);
      e.micros("dur", dur);
      e.key("args");
      ObjectWriter a(e.raw());
      a.num("correlation", act.correlation);
      a.str("phase", phase_name(act.phase));
      if (act.step >= 0) a.num("step", act.step);
      switch (act.kind) {
        case ActivityKind::kernel: {
          const auto& k = rec.kernels[act.record];
          a.str("grid", dims(k.grid));
          a.str("block", dims(k.block));
          a.num("registers per thread", k.registers_per_thread);
          a.num("static shared memory", k.static_shared_bytes);
          a.num("dynamic shared memory", k.dynamic_shared_bytes);
          a.num("local memory per thread", k.local_bytes_per_thread);
          if (k.graph_id != 0) a.num("graph", k.graph_id);
          if (k.name != tl.display_name(act)) a.str("mangled", k.name);
          break;
        }
        case ActivityKind::memcpy: {
          const auto& m = rec.memcpys[act.record];
          a.num("bytes", m.bytes);
          a.num("GB/s", gbps(m.bytes, dur));
          if (m.graph_id != 0) a.num("graph", m.graph_id);
          break;
        }
        case ActivityKind::memset: {
          const auto& m = rec.memsets[act.record];
          a.num("bytes", m.bytes);
          a.num("value", m.value);
          a.num("GB/s", gbps(m.bytes, dur));
          break;
        }
      }
    }
    if (options_.flows && act.launch >= 0) {
      const auto& call = rec.runtime_calls[static_cast<std::size_t>(act.launch)];
      const auto call_start = tl.host_ns(call.start);
      const auto call_mid =
          call_start + std::max<std::int64_t>(0, tl.host_ns(call.end) - call_start) / 2;
      const auto id = next_flow_id_++;
      {
        ObjectWriter e(begin_event());
        e.str("ph", "s");
        e.str("cat", "launch");
        e.str("name", "launch");
        e.num("id", id);
        e.num("pid", host_pid);
        e.num("tid", call.thread);
        e.micros("ts", call_mid - origin_ns_);
      }
      {
        ObjectWriter e(begin_event());
        e.str("ph", "f");
        e.str("bp", "e");
        e.str("cat", "launch");
        e.str("name", "launch");
        e.num("id", id);
        e.num("pid", gpu_pid(act.device));
        e.num("tid", track[slot]);
        e.micros("ts", act.start_ns + dur / 2 - origin_ns_);
      }
    }
  }

  // Device environment as counters.
  for (const auto& env : rec.environment) {
    auto counter = [&](const char* name, const char* unit, std::uint32_t value) {
      ObjectWriter e(begin_event());
      e.str("ph", "C");
      e.str("name", name);
      e.num("pid", gpu_pid(env.device));
      e.micros("ts", tl.host_ns(env.timestamp) - origin_ns_);
      e.key("args");
      ObjectWriter a(e.raw());
      a.num(unit, value);
    };
    switch (env.kind) {
      case EnvironmentKind::speed:
        counter("SM clock", "MHz", env.sm_clock_mhz);
        counter("memory clock", "MHz", env.memory_clock_mhz);
        break;
      case EnvironmentKind::temperature:
        counter("temperature", "C", env.temperature_c);
        break;
      case EnvironmentKind::power:
        counter("power", "mW", env.power_mw);
        break;
      case EnvironmentKind::cooling:
        counter("fan", "%", env.fan_percent);
        break;
    }
  }

  // Session statistics and the per-phase breakdown.
  {
    ObjectWriter o(session.other);
    const auto& st = tl.stats();
    o.str("label", label);
    o.num("host_pid", host_pid);
    o.num("kernels", rec.kernels.size());
    o.num("memcpys", rec.memcpys.size());
    o.num("memsets", rec.memsets.size());
    o.num("runtime_calls", rec.runtime_calls.size());
    o.num("nvtx_ranges", tl.ranges().size());
    o.num("dropped_records", st.dropped_records);
    o.num("unmatched_end_markers", st.unmatched_end_markers);
    o.num("unterminated_ranges", st.unterminated_ranges);
    o.num("invalid_activities", st.invalid_activities);
    o.num("unlaunched_activities", st.unlaunched_activities);
    o.num("clock_drift_ppm", tl.clock().drift_ppm());
    if (options_.breakdown) {
      o.key("phase_breakdown");
      o.raw() += '[';
      bool first = true;
      for (const auto& s : phase_breakdown(tl)) {
        if (!first) o.raw() += ',';
        first = false;
        ObjectWriter b(o.raw());
        b.num("step", s.step);
        b.num("wall_ms", s.wall_ms);
        b.num("gpu_ms", s.gpu_ms);
        b.num("kernels", s.kernels);
        b.num("copies", s.copies);
        b.key("phase_ms");
        ObjectWriter p(b.raw());
        for (const auto& [phase, ms] : s.phase_ms) p.num(phase, ms);
      }
      o.raw() += ']';
    }
  }
  event_count_ += events;
  sessions_.push_back(std::move(session));
}

std::string ChromeTraceWriter::str() const {
  std::size_t size = 256;
  for (const auto& s : sessions_) size += s.events.size() + s.other.size() + 4;
  std::string out;
  out.reserve(size);
  out += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  for (const auto& s : sessions_) {
    if (s.events.empty()) continue;
    if (!first) out += ',';
    first = false;
    out += s.events;
  }
  out += "\n],\"otherData\":{\"generator\":\"hisparse-bench " HISPARSE_VERSION "\",\"sessions\":[";
  for (std::size_t i = 0; i < sessions_.size(); ++i) {
    if (i > 0) out += ',';
    out += sessions_[i].other;
  }
  out += "]}}\n";
  return out;
}

void ChromeTraceWriter::write(const std::filesystem::path& path) const {
  const std::string text = str();
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out)
      throw Error(path.string(), "cannot create the trace file",
                  "check that the directory exists and is writable");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) throw Error(path.string(), "writing the trace file failed", "check free disk space");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw Error(path.string(),
                fmt::format("cannot move the trace file into place: {}", ec.message()), "");
}

}  // namespace hisparse::trace
