#include "trace/step_window_trace.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse::trace {

StepWindowTrace::StepWindowTrace(TraceFile& file, std::string label, int warmup_steps, int steps)
    : file_(file), label_(std::move(label)), warmup_steps_(warmup_steps), steps_wanted_(steps) {
  if (warmup_steps < 0)
    throw Error("trace window", fmt::format("warm-up steps {} is negative", warmup_steps),
                "give 0 or more warm-up steps");
  if (steps < 1)
    throw Error("trace window", fmt::format("{} traced steps", steps),
                "trace at least one step (--trace-steps N, N >= 1)");
}

StepWindowTrace::~StepWindowTrace() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; the trace of a failed point is best effort
  }
}

void StepWindowTrace::start() {
  if (warmup_steps_ == 0) begin(0);
}

void StepWindowTrace::step_done(int done) {
  last_done_ = done;
  if (finished_) return;
  if (!open() && began_after_ < 0 && done == warmup_steps_)
    begin(done);
  else if (open() && done >= warmup_steps_ + steps_wanted_)
    end(done);
}

void StepWindowTrace::finish() {
  if (open()) end(last_done_);
  finished_ = true;
}

void StepWindowTrace::begin(int done) {
  session_ = file_.begin(label_);
  began_after_ = done;
  message_ = session_->message();
}

void StepWindowTrace::end(int done) {
  const bool active = session_->active();
  // Release the session (and CUPTI's process-wide slot) even when writing the file throws.
  const std::unique_ptr<TraceSession> session = std::move(session_);
  ended_after_ = done;
  finished_ = true;
  if (!active) {
    (void)session->stop();
    return;
  }
  steps_ = file_.end(*session);
  traced_ = true;
  if (steps_.empty() && message_.empty())
    message_ =
        "the timeline has no step ranges: NVTX did not reach CUPTI (prepare_nvtx_injection() must "
        "run before the first NVTX range), so GPU time cannot be split by step and phase";
}

}  // namespace hisparse::trace
