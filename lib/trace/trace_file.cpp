#include "trace/trace_file.hpp"

namespace hisparse::trace {

std::unique_ptr<TraceSession> TraceFile::begin(std::string label, TraceOptions options) {
  options.label = std::move(label);
  return std::make_unique<TraceSession>(std::move(options));
}

std::vector<StepPhaseTimes> TraceFile::end(TraceSession& session) {
  const bool active = session.active();
  auto records = session.stop();
  if (!active) return {};
  const Timeline timeline(std::move(records));
  writer_.add(timeline);
  writer_.write(path_);
  return phase_breakdown(timeline);
}

std::map<std::string, double> mean_phase_ms(const std::vector<StepPhaseTimes>& steps) {
  std::map<std::string, double> mean;
  if (steps.empty()) return mean;
  for (const auto& s : steps) {
    for (const auto& [phase, ms] : s.phase_ms) mean[phase] += ms;
    mean["total"] += s.gpu_ms;
  }
  for (auto& [phase, ms] : mean) ms /= static_cast<double>(steps.size());
  return mean;
}

}  // namespace hisparse::trace
