#include "model/replay_study.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace hisparse {
namespace {
constexpr std::uint64_t kValueSeed = 0x7661'6c75'6573ull;  // synthetic values, per study head

// A study head from float row sources: keys and values [tokens][d] stored as bf16, and the group's
// queries of steps [0, calibration + test), the first `calibration` held out.
template <typename Keys, typename Values, typename Queries>
fathom::SyntheticKeys study_head(fathom::SyntheticKeySpec spec, int kv_head, int kv_heads,
                                 Keys&& keys, Values&& values, Queries&& queries) {
  fathom::SyntheticKeys out;
  out.spec = spec;
  const auto count =
      static_cast<std::size_t>(spec.tokens) * static_cast<std::size_t>(spec.channels);
  std::vector<float> rows(count);
  keys(rows.data());
  out.keys.resize(count);
  std::transform(rows.begin(), rows.end(), out.keys.begin(), float_to_bf16);
  values(rows.data());
  out.values.resize(count);
  std::transform(rows.begin(), rows.end(), out.values.begin(), float_to_bf16);
  // Step s: calibration for s < calibration_queries, else test step s - that.
  const auto group_values =
      static_cast<std::size_t>(spec.heads) * static_cast<std::size_t>(spec.channels);
  std::vector<float> step(static_cast<std::size_t>(kv_heads) * group_values);
  for (int s = 0; s < spec.calibration_queries + spec.steps; ++s) {
    queries(s, step.data());
    const auto first = step.begin() + static_cast<std::ptrdiff_t>(kv_head * group_values);
    auto& to = s < spec.calibration_queries ? out.calibration_queries : out.queries;
    to.insert(to.end(), first, first + static_cast<std::ptrdiff_t>(group_values));
  }
  out.variance = fathom::calibration_variance(out.keys.data(), spec.tokens, spec.channels,
                                              spec.calibration_skip, spec.calibration_tokens);
  return out;
}

fathom::SyntheticKeySpec study_spec(std::int64_t tokens, int channels, int group, int test_steps,
                                    int calibration_steps, std::uint64_t seed) {
  fathom::SyntheticKeySpec spec;
  spec.tokens = tokens;
  spec.channels = channels;
  spec.heads = group;
  spec.steps = test_steps;
  spec.calibration_queries = calibration_steps;
  spec.seed = seed;
  return spec;
}
}  // namespace

ReplayStudySource::ReplayStudySource(const std::filesystem::path& path, const ModelSpec& model,
                                     std::int64_t tokens, int calibration_steps,
                                     std::vector<int> layers)
    : layers_(std::move(layers)) {
  if (model.is_mla())
    throw Error("--model", fmt::format("{} is an MLA model", model.name),
                "the Fathom quality study needs a GQA model (query heads grouped over KV heads); "
                "pass the GQA model the capture came from");
  ReplayGeometry geo;
  geo.model_name = model.name;
  geo.layers = model.layers;
  geo.kv_heads = model.gqa.kv_heads;
  geo.q_heads = model.gqa.q_heads;
  geo.key_dim = geo.value_dim = model.gqa.head_dim;
  geo.describe_layer_reuse = false;  // the study reads the captured layers, not the model's
  capture_ = std::make_unique<const ReplayCapture>(path, geo, "--replay");
  kv_heads_ = geo.kv_heads;
  group_ = geo.q_heads / geo.kv_heads;
  head_dim_ = geo.key_dim;
  const int captured = std::max(capture_->key_layers(), capture_->query_layers());
  if (layers_.empty())
    for (int l = 0; l < captured; ++l) layers_.push_back(l);
  for (int l : layers_)
    if (l < 0 || l >= captured)
      throw Error("--layers", fmt::format("layer {} was not captured", l),
                  fmt::format("use layers 0 to {} ({} captured)", captured - 1, captured));
  tokens_ = tokens == 0 ? capture_->tokens() : tokens;
  if (tokens_ < 1 || tokens_ > capture_->tokens())
    throw Error("--tokens",
                fmt::format("{} tokens, the capture holds {}", tokens, capture_->tokens()),
                fmt::format("use at most {} tokens, or leave --tokens out to use them all",
                            capture_->tokens()));
  const auto steps = capture_->steps();
  calibration_steps_ = calibration_steps < 0 ? static_cast<int>(steps / 2) : calibration_steps;
  if (steps < 2 || calibration_steps_ < 1 || calibration_steps_ >= steps)
    throw Error("--calibration-steps",
                fmt::format("{} of {} captured query steps held out for calibration",
                            calibration_steps_, steps),
                steps < 2 ? "capture at least 2 decode steps: one calibrates the fixed channel "
                            "set, the others are scored"
                          : fmt::format("hold out 1 to {} steps", steps - 1));
  test_steps_ = static_cast<int>(steps) - calibration_steps_;
  notes_ = capture_->notes();
  if (!capture_->has_values())
    notes_.emplace_back("no values (v) captured: values are synthetic N(0, 1)");
}

fathom::SyntheticKeys ReplayStudySource::head(int index) const {
  if (index < 0 || index >= heads())
    throw Error("replay study", fmt::format("head {} of {}", index, heads()),
                fmt::format("use 0 to {}", heads() - 1));
  const int layer = layers_[static_cast<std::size_t>(index / kv_heads_)];
  const int kv_head = index % kv_heads_;
  // Synthetic values follow the head, not its place in the study: the same for any --layers.
  const auto seed = static_cast<std::uint64_t>(layer) * static_cast<std::uint64_t>(kv_heads_) +
                    static_cast<std::uint64_t>(kv_head);
  const auto spec = study_spec(tokens_, head_dim_, group_, test_steps_, calibration_steps_, seed);
  return study_head(
      spec, kv_head, kv_heads_,
      [&](float* out) { capture_->keys(layer, kv_head, 0, tokens_, out); },
      [&](float* out) {
        if (capture_->has_values()) return capture_->values(layer, kv_head, 0, tokens_, out);
        const auto count = static_cast<std::size_t>(tokens_) * static_cast<std::size_t>(head_dim_);
        for (std::size_t i = 0; i < count; ++i) out[i] = random_normal(kValueSeed + seed, i);
      },
      [&](int step, float* out) { capture_->queries(layer, step, out); });
}

WorkloadStudySource::WorkloadStudySource(const ModelSpec& model, const WorkloadSpec& workload,
                                         std::int64_t context_length, int test_steps,
                                         int calibration_steps, const std::string& setting) {
  if (model.is_mla())
    throw Error(setting, fmt::format("model {} uses MLA", model.name),
                "the Fathom quality study needs a GQA model (query heads grouped over KV heads)");
  workload_ = std::make_unique<const KvWorkload>(model, workload, 1, context_length);
  layers_ = model.layers;
  kv_heads_ = model.gqa.kv_heads;
  group_ = model.gqa.q_heads / model.gqa.kv_heads;
  head_dim_ = model.gqa.head_dim;
  tokens_ = context_length;
  test_steps_ = test_steps;
  calibration_steps_ = calibration_steps;
  if (const ReplayCapture* capture = workload_->capture();
      capture != nullptr && capture->steps() < test_steps + calibration_steps)
    throw Error(setting,
                fmt::format("the capture holds {} query steps; the scenario decodes {} and the "
                            "study holds out {} more for calibration",
                            capture->steps(), test_steps, calibration_steps),
                "capture more decode steps, or lower --calibration-steps");
  notes_ = workload_->notes();
}

WorkloadStudySource::~WorkloadStudySource() = default;

fathom::SyntheticKeys WorkloadStudySource::head(int index) const {
  if (index < 0 || index >= heads())
    throw Error("workload study", fmt::format("head {} of {}", index, heads()),
                fmt::format("use 0 to {}", heads() - 1));
  const int layer = index / kv_heads_;
  const int kv_head = index % kv_heads_;
  // Steps of the study: the decode run's [0, test) are scored, [test, test + calibration) held
  // out; study_head takes the held-out ones first.
  const auto spec = study_spec(tokens_, head_dim_, group_, test_steps_, calibration_steps_,
                               static_cast<std::uint64_t>(index));
  return study_head(
      spec, kv_head, kv_heads_,
      [&](float* out) { workload_->keys(0, layer, kv_head, 0, tokens_, out); },
      [&](float* out) { workload_->values(0, layer, kv_head, 0, tokens_, out); },
      [&](int step, float* out) {
        const int s = step < calibration_steps_ ? test_steps_ + step : step - calibration_steps_;
        workload_->queries(0, layer, s, out);
      });
}

}  // namespace hisparse
