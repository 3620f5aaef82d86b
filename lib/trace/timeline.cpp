#include "trace/timeline.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>

namespace hisparse::trace {

namespace {
constexpr std::string_view library_domain = "hisparse";

/// Phases that contain others and so never take a GPU activity themselves.
bool is_container(Phase p) {
  return p == Phase::api || p == Phase::step || p == Phase::layer;
}
}  // namespace

const char* name_of(ActivityKind k) noexcept {
  switch (k) {
    case ActivityKind::kernel:
      return "kernel";
    case ActivityKind::memcpy:
      return "memcpy";
    case ActivityKind::memset:
      return "memset";
  }
  return "kernel";
}

std::string demangle(const std::string& symbol) {
  if (symbol.rfind("_Z", 0) != 0) return symbol;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : symbol;
}

ClockAlignment::ClockAlignment(const std::vector<ClockSample>& samples) {
  if (samples.empty()) return;
  auto lo = samples.front(), hi = samples.front();
  for (const auto& s : samples) {
    if (s.cupti_ns < lo.cupti_ns) lo = s;
    if (s.cupti_ns > hi.cupti_ns) hi = s;
  }
  cupti0_ = lo.cupti_ns;
  host0_ = lo.host_ns;
  if (hi.cupti_ns > lo.cupti_ns) {
    drift_den_ = static_cast<std::int64_t>(hi.cupti_ns - lo.cupti_ns);
    drift_num_ = (hi.host_ns - lo.host_ns) - drift_den_;
  }
}

std::int64_t ClockAlignment::to_host_ns(std::uint64_t cupti_ns) const noexcept {
  // Integer arithmetic (128-bit products) so that nanoseconds map exactly, rounded to nearest.
  __extension__ using wide = __int128;
  const auto delta = static_cast<std::int64_t>(cupti_ns - cupti0_);
  const wide product = static_cast<wide>(delta) * drift_num_;
  wide drift = product / drift_den_;
  const wide rest = product % drift_den_;
  if (2 * (rest < 0 ? -rest : rest) >= drift_den_) drift += product < 0 ? -1 : 1;
  return host0_ + delta + static_cast<std::int64_t>(drift);
}

Timeline::Timeline(TraceRecords records) : records_(std::move(records)), clock_(records_.clock) {
  stats_.dropped_records = records_.dropped_records;
  begin_ns_ = std::numeric_limits<std::int64_t>::max();
  end_ns_ = std::numeric_limits<std::int64_t>::min();
  auto see = [this](std::uint64_t cupti) {
    if (cupti == 0) return;
    const auto t = host_ns(cupti);
    begin_ns_ = std::min(begin_ns_, t);
    end_ns_ = std::max(end_ns_, t);
  };
  for (const auto& c : records_.clock) {
    begin_ns_ = std::min(begin_ns_, c.host_ns);
    end_ns_ = std::max(end_ns_, c.host_ns);
  }
  for (const auto& r : records_.kernels) see(r.start), see(r.end);
  for (const auto& r : records_.memcpys) see(r.start), see(r.end);
  for (const auto& r : records_.memsets) see(r.start), see(r.end);
  for (const auto& r : records_.runtime_calls) see(r.start), see(r.end);
  for (const auto& r : records_.markers) see(r.timestamp);
  if (begin_ns_ > end_ns_) begin_ns_ = end_ns_ = 0;

  kernel_names_.reserve(records_.kernels.size());
  std::unordered_map<std::string, std::string> demangled;
  for (const auto& k : records_.kernels) {
    auto [it, inserted] = demangled.try_emplace(k.name);
    if (inserted) it->second = demangle(k.name);
    kernel_names_.push_back(it->second);
  }
  for (std::size_t i = 0; i < records_.runtime_calls.size(); ++i)
    launch_by_correlation_.emplace(records_.runtime_calls[i].correlation, static_cast<int>(i));

  pair_markers();
  nest_ranges();
  build_activities();
  collect_tracks();
}

void Timeline::pair_markers() {
  // Marker data carries no timestamp: give each start marker the next data record of its id,
  // both in the order CUPTI delivered them (ids may be reused after a range ends).
  std::unordered_map<std::uint32_t, std::deque<std::size_t>> data_by_id;
  for (std::size_t i = 0; i < records_.marker_data.size(); ++i)
    data_by_id[records_.marker_data[i].id].push_back(i);
  std::vector<const NvtxMarkerDataRecord*> data_of(records_.markers.size(), nullptr);
  for (std::size_t i = 0; i < records_.markers.size(); ++i) {
    const auto& m = records_.markers[i];
    if (m.kind == MarkerKind::end) continue;
    auto it = data_by_id.find(m.id);
    if (it == data_by_id.end() || it->second.empty()) continue;
    data_of[i] = &records_.marker_data[it->second.front()];
    it->second.pop_front();
  }

  std::vector<std::size_t> order(records_.markers.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return records_.markers[a].timestamp < records_.markers[b].timestamp;
  });

  std::unordered_map<std::uint32_t, std::size_t> open;  // marker id -> index into ranges_
  for (std::size_t i : order) {
    const auto& m = records_.markers[i];
    const auto ts = host_ns(m.timestamp);
    if (m.kind == MarkerKind::instant) {
      instants_.push_back({ts, m.process, m.thread, m.name, m.domain});
      continue;
    }
    if (m.kind == MarkerKind::end) {
      auto it = open.find(m.id);
      if (it == open.end()) {
        ++stats_.unmatched_end_markers;
        continue;
      }
      ranges_[it->second].end_ns = ts;
      ranges_[it->second].terminated = true;
      open.erase(it);
      continue;
    }
    NvtxRange r;
    r.id = m.id;
    r.process = m.process;
    r.thread = m.thread;
    r.start_ns = ts;
    r.end_ns = end_ns_;
    r.terminated = false;
    r.name = m.name;
    r.domain = m.domain;
    if (const auto* d = data_of[i]) {
      r.colour = d->colour;
      r.category = d->category;
      r.has_payload = d->has_payload;
      r.payload = d->payload;
    }
    if (r.domain == library_domain) {
      if (data_of[i]) r.phase = phase_from_category(r.category);
      if (!r.phase) r.phase = phase_from_name(r.name);
      if (!r.phase)
        r.phase = Phase::api;  // function ranges (HISPARSE_FUNC_RANGE) have no phase name
      if (r.name.empty())
        r.name = phase_name(*r.phase);  // a registered string CUPTI did not resolve
    }
    open[m.id] = ranges_.size();
    ranges_.push_back(std::move(r));
  }
  stats_.unterminated_ranges = open.size();
}

void Timeline::nest_ranges() {
  std::stable_sort(ranges_.begin(), ranges_.end(), [](const NvtxRange& a, const NvtxRange& b) {
    if (a.process != b.process) return a.process < b.process;
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;  // the outer of two ranges that start together comes first
  });
  std::vector<int> stack;
  for (int i = 0; i < static_cast<int>(ranges_.size()); ++i) {
    auto& r = ranges_[static_cast<std::size_t>(i)];
    const HostThread t{r.process, r.thread};
    if (i > 0) {
      const auto& prev = ranges_[static_cast<std::size_t>(i - 1)];
      if (prev.process != r.process || prev.thread != r.thread) stack.clear();
    }
    while (!stack.empty() && ranges_[static_cast<std::size_t>(stack.back())].end_ns <= r.start_ns)
      stack.pop_back();
    if (!stack.empty()) {
      const auto& top = ranges_[static_cast<std::size_t>(stack.back())];
      r.parent = stack.back();
      r.depth = top.depth + 1;
      if (r.end_ns > top.end_ns) r.nested = false;  // overlaps its neighbour: cannot nest
    }
    if (r.nested) stack.push_back(i);
    ranges_by_thread_[t].push_back(i);
  }
}

int Timeline::enclosing_range(const HostThread& thread, std::int64_t ts_ns) const {
  const auto it = ranges_by_thread_.find(thread);
  if (it == ranges_by_thread_.end()) return -1;
  const auto& idx = it->second;
  // Last range starting at or before ts; then walk out to the first one still open at ts.
  auto pos = std::upper_bound(idx.begin(), idx.end(), ts_ns, [this](std::int64_t t, int i) {
    return t < ranges_[static_cast<std::size_t>(i)].start_ns;
  });
  if (pos == idx.begin()) return -1;
  int r = *std::prev(pos);
  while (r >= 0) {
    const auto& range = ranges_[static_cast<std::size_t>(r)];
    if (range.nested && range.end_ns >= ts_ns) return r;
    r = range.parent;
  }
  return -1;
}

std::int64_t Timeline::step_index(int range) const {
  const auto it = step_of_range_.find(range);
  return it == step_of_range_.end() ? -1 : it->second;
}

void Timeline::build_activities() {
  // Step indices: payload, or position in time among step ranges.
  std::vector<int> steps;
  for (int i = 0; i < static_cast<int>(ranges_.size()); ++i)
    if (ranges_[static_cast<std::size_t>(i)].phase == Phase::step) steps.push_back(i);
  std::stable_sort(steps.begin(), steps.end(), [this](int a, int b) {
    return ranges_[static_cast<std::size_t>(a)].start_ns <
           ranges_[static_cast<std::size_t>(b)].start_ns;
  });
  for (std::size_t n = 0; n < steps.size(); ++n) {
    const auto& r = ranges_[static_cast<std::size_t>(steps[n])];
    step_of_range_[steps[n]] = r.has_payload ? r.payload : static_cast<std::int64_t>(n);
  }

  auto add = [this](ActivityKind kind, std::size_t index, std::uint64_t start, std::uint64_t end,
                    std::uint32_t device, std::uint32_t stream, std::uint32_t correlation) {
    if (start == 0 || end < start) {
      ++stats_.invalid_activities;
      return;
    }
    GpuActivity a;
    a.kind = kind;
    a.record = index;
    a.device = device;
    a.stream = stream;
    a.correlation = correlation;
    a.start_ns = host_ns(start);
    a.end_ns = host_ns(end);
    a.launch = launch_of(correlation);
    if (a.launch < 0) {
      ++stats_.unlaunched_activities;
    } else {
      const auto& call = records_.runtime_calls[static_cast<std::size_t>(a.launch)];
      a.range = enclosing_range({call.process, call.thread}, host_ns(call.start));
      bool phase_found = false;
      for (int r = a.range; r >= 0; r = ranges_[static_cast<std::size_t>(r)].parent) {
        const auto& range = ranges_[static_cast<std::size_t>(r)];
        if (!range.phase) continue;
        if (!phase_found && !is_container(*range.phase)) {
          a.phase = *range.phase;
          phase_found = true;
        }
        if (*range.phase == Phase::step) {
          a.step = step_index(r);
          break;
        }
      }
    }
    activities_.push_back(a);
  };
  for (std::size_t i = 0; i < records_.kernels.size(); ++i) {
    const auto& k = records_.kernels[i];
    add(ActivityKind::kernel, i, k.start, k.end, k.device, k.stream, k.correlation);
  }
  for (std::size_t i = 0; i < records_.memcpys.size(); ++i) {
    const auto& m = records_.memcpys[i];
    add(ActivityKind::memcpy, i, m.start, m.end, m.device, m.stream, m.correlation);
  }
  for (std::size_t i = 0; i < records_.memsets.size(); ++i) {
    const auto& m = records_.memsets[i];
    add(ActivityKind::memset, i, m.start, m.end, m.device, m.stream, m.correlation);
  }
  std::stable_sort(
      activities_.begin(), activities_.end(),
      [](const GpuActivity& a, const GpuActivity& b) { return a.start_ns < b.start_ns; });
}

void Timeline::collect_tracks() {
  for (const auto& r : ranges_) host_threads_.push_back({r.process, r.thread});
  for (const auto& i : instants_) host_threads_.push_back({i.process, i.thread});
  for (const auto& c : records_.runtime_calls) host_threads_.push_back({c.process, c.thread});
  std::sort(host_threads_.begin(), host_threads_.end());
  host_threads_.erase(std::unique(host_threads_.begin(), host_threads_.end()), host_threads_.end());
  for (const auto& a : activities_) streams_.push_back({a.device, a.stream});
  std::sort(streams_.begin(), streams_.end());
  streams_.erase(std::unique(streams_.begin(), streams_.end()), streams_.end());
}

int Timeline::launch_of(std::uint32_t correlation) const {
  const auto it = launch_by_correlation_.find(correlation);
  return it == launch_by_correlation_.end() ? -1 : it->second;
}

const std::string& Timeline::display_name(const GpuActivity& a) const {
  static const std::string empty;
  return a.kind == ActivityKind::kernel ? kernel_names_[a.record] : empty;
}

std::vector<StepPhaseTimes> phase_breakdown(const Timeline& timeline) {
  std::map<std::int64_t, StepPhaseTimes> steps;
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>>
      extent;  // step -> (first start, last end)
  const auto& ranges = timeline.ranges();
  for (int i = 0; i < static_cast<int>(ranges.size()); ++i) {
    const auto step = timeline.step_index(i);
    if (step < 0 && ranges[static_cast<std::size_t>(i)].phase != Phase::step) continue;
    const auto& r = ranges[static_cast<std::size_t>(i)];
    auto [it, inserted] = extent.try_emplace(step, r.start_ns, r.end_ns);
    if (!inserted) {
      it->second.first = std::min(it->second.first, r.start_ns);
      it->second.second = std::max(it->second.second, r.end_ns);
    }
    steps[step].step = step;
  }
  for (const auto& [step, e] : extent)
    steps[step].wall_ms = static_cast<double>(e.second - e.first) / 1e6;
  for (const auto& a : timeline.activities()) {
    if (a.step < 0) continue;
    auto& s = steps[a.step];
    s.step = a.step;
    const double ms = static_cast<double>(a.end_ns - a.start_ns) / 1e6;
    s.gpu_ms += ms;
    s.phase_ms[phase_name(a.phase)] += ms;
    if (a.kind == ActivityKind::kernel)
      ++s.kernels;
    else
      ++s.copies;
  }
  std::vector<StepPhaseTimes> out;
  out.reserve(steps.size());
  for (auto& [step, s] : steps) out.push_back(std::move(s));
  return out;
}

}  // namespace hisparse::trace
