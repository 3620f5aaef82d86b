// ReplayStudySource: captured keys, values and queries (ReplayCapture) served to the Fathom quality
// study (fathom::QualityConfig::source), so that `hisparse-bench quality --replay` compares every
// method on a real model's data with the same table as the synthetic study.
//
// Study head i is (layers[i / kv_heads], KV head i % kv_heads) over the chosen captured layers
// (every one by default; layer l of a capture of fewer layers than the model is captured layer
// l mod that count, as in a decode replay, so the study counts the captured ones). Each head
// scores the first `tokens` captured keys (post-RoPE, stored as bf16, as a deployment stores them)
// with the queries of its GQA group. The first `calibration_steps` captured query steps are held
// out to calibrate the fixed channel set (as the synthetic study's calibration queries are); the
// others are the test steps. Without captured values, values are N(0, 1), seeded per head.
//
// WorkloadStudySource: the same study on the keys and queries a decode scenario runs on (its
// KvWorkload: synthetic or replayed), for `hisparse-bench quality --scenario`. Study head i is
// (model layer i / kv_heads, KV head i % kv_heads) of the scenario's first request, so a study's
// calibrated_head_budgets list is in the order fathom.head_budgets reads it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fathom/synthetic_keys.hpp"
#include "model/decode_engine.hpp"
#include "model/kv_workload.hpp"
#include "model/model_spec.hpp"
#include "model/replay_capture.hpp"

namespace hisparse {

/// What both study sources tell their users: the shape of a study head, the query steps it is
/// scored on and held out, and the notes a report should carry.
class StudyShape {
 public:
  [[nodiscard]] int kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] int group() const noexcept { return group_; }  ///< query heads per KV head
  [[nodiscard]] int head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::int64_t tokens() const noexcept { return tokens_; }
  [[nodiscard]] int calibration_steps() const noexcept { return calibration_steps_; }
  [[nodiscard]] int test_steps() const noexcept { return test_steps_; }
  /// What a report should say about the data: layer reuse, ignored tensors, synthetic values.
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return notes_; }

 protected:
  int kv_heads_ = 0, group_ = 0, head_dim_ = 0;
  std::int64_t tokens_ = 0;
  int calibration_steps_ = 0, test_steps_ = 0;
  std::vector<std::string> notes_;
};

class ReplayStudySource : public StudyShape {
 public:
  /// Loads the capture for `model` (a GQA model). `tokens` 0: every captured token;
  /// `calibration_steps` -1: half of the captured steps; `layers` empty: every captured layer.
  /// Throws Error naming the flag and the fix when the model is MLA, `tokens` exceeds the capture,
  /// a layer was not captured, or the steps do not split into at least one calibration and one
  /// test step.
  ReplayStudySource(const std::filesystem::path& path, const ModelSpec& model, std::int64_t tokens,
                    int calibration_steps, std::vector<int> layers = {});

  /// Data of study head `index` (0 .. heads() - 1), in the synthetic study's form.
  [[nodiscard]] fathom::SyntheticKeys head(int index) const;

  [[nodiscard]] int heads() const noexcept { return static_cast<int>(layers_.size()) * kv_heads_; }
  [[nodiscard]] const std::vector<int>& layers() const noexcept { return layers_; }
  [[nodiscard]] bool captured_values() const noexcept { return capture_->has_values(); }

 private:
  std::unique_ptr<const ReplayCapture> capture_;
  std::vector<int> layers_;
};

/// The heads of a decode scenario's workload. Test steps are the decode steps the scenario runs
/// (warmup + measured), the queries its steps start from; the `calibration_steps` steps after
/// them are held out. The engine adds a little of the model's own query to the workload's
/// (DecodeEngine's blend), which the study does not: its curves are the workload's.
class WorkloadStudySource : public StudyShape {
 public:
  /// Throws Error naming `setting` for an MLA model, and for a replayed capture with too few
  /// query steps for the test and calibration steps.
  WorkloadStudySource(const ModelSpec& model, const WorkloadSpec& workload,
                      std::int64_t context_length, int test_steps, int calibration_steps,
                      const std::string& setting);
  ~WorkloadStudySource();
  WorkloadStudySource(const WorkloadStudySource&) = delete;
  WorkloadStudySource& operator=(const WorkloadStudySource&) = delete;

  [[nodiscard]] fathom::SyntheticKeys head(int index) const;

  [[nodiscard]] int heads() const noexcept { return layers_ * kv_heads_; }
  [[nodiscard]] int layers() const noexcept { return layers_; }  ///< the model's

 private:
  std::unique_ptr<const KvWorkload> workload_;
  int layers_ = 0;
};

}  // namespace hisparse
