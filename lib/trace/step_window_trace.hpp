// StepWindowTrace: traces a window of steps of one sweep point, driven by a count of finished
// steps (the Runner's per-step progress callback), so that no runner code has to know about
// tracing. The session begins when the warm-up is done and ends after `steps` more steps, or
// when the point stops early (failure, fewer steps): the first measured steps are traced.
//
//   StepWindowTrace window(trace_file, label, warmup_steps, trace_steps);
//   window.start();                                   // begins now when there is no warm-up
//   runner.run(..., [&](int done, int total) { window.step_done(done); });
//   window.finish();                                  // ends a session still open
//   if (!window.steps().empty()) gpu_phase_ms = mean_phase_ms(window.steps());
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trace/trace_file.hpp"

namespace hisparse::trace {

class StepWindowTrace {
 public:
  /// `file` must outlive this object. `warmup_steps` >= 0 and `steps` >= 1.
  StepWindowTrace(TraceFile& file, std::string label, int warmup_steps, int steps);
  ~StepWindowTrace();
  StepWindowTrace(const StepWindowTrace&) = delete;
  StepWindowTrace& operator=(const StepWindowTrace&) = delete;

  /// Before the first step: begins the session when there is no warm-up.
  void start();
  /// After each step, with the number of steps done so far (warm-up included).
  void step_done(int done);
  /// Ends the session if it is still open; later calls do nothing.
  void finish();

  [[nodiscard]] bool open() const noexcept { return session_ != nullptr; }
  /// True once a session collected a timeline (CUPTI was usable).
  [[nodiscard]] bool traced() const noexcept { return traced_; }
  /// Why no timeline was collected, or a warning about the one collected; "" when all is well.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  /// Per-step phase breakdown of the traced window (empty without a timeline).
  [[nodiscard]] const std::vector<StepPhaseTimes>& steps() const noexcept { return steps_; }
  /// The step count after which the session began (-1 before it began).
  [[nodiscard]] int began_after() const noexcept { return began_after_; }
  /// The step count after which the session ended (-1 while open or before it began).
  [[nodiscard]] int ended_after() const noexcept { return ended_after_; }

 private:
  void begin(int done);
  void end(int done);

  TraceFile& file_;
  std::string label_;
  int warmup_steps_;
  int steps_wanted_;
  int last_done_ = 0;
  std::unique_ptr<TraceSession> session_;
  bool finished_ = false;
  bool traced_ = false;
  int began_after_ = -1;
  int ended_after_ = -1;
  std::string message_;
  std::vector<StepPhaseTimes> steps_;
};

}  // namespace hisparse::trace
