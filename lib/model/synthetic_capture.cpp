#include "model/synthetic_capture.hpp"

#include <algorithm>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "fathom/quality_study.hpp"
#include "model/npy.hpp"

namespace hisparse {
SyntheticCaptureSummary write_synthetic_capture(const std::filesystem::path& dir,
                                                const ModelSpec& model,
                                                fathom::SyntheticKeySpec workload,
                                                const std::string& setting) {
  if (model.is_mla())
    throw Error(setting, fmt::format("model {} uses MLA", model.name),
                "synthetic captures are written for GQA models (query heads grouped over KV "
                "heads)");
  SyntheticCaptureSummary out;
  out.layers = model.layers;
  out.kv_heads = model.gqa.kv_heads;
  out.q_heads = model.gqa.q_heads;
  out.head_dim = model.gqa.head_dim;
  out.tokens = workload.tokens;
  out.steps = workload.steps + workload.calibration_queries;
  workload.channels = out.head_dim;
  workload.heads = out.q_heads / out.kv_heads;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(setting, fmt::format("cannot create '{}': {}", dir.string(), ec.message()),
                "choose a folder you can write to");
  const auto group_values = static_cast<std::size_t>(workload.heads) * out.head_dim;
  const auto head_values = static_cast<std::size_t>(out.tokens) * out.head_dim;
  for (int l = 0; l < out.layers; ++l) {
    std::vector<float> k, v, q(static_cast<std::size_t>(out.steps) * out.kv_heads * group_values);
    k.reserve(head_values * out.kv_heads);
    v.reserve(head_values * out.kv_heads);
    for (int g = 0; g < out.kv_heads; ++g) {
      const fathom::SyntheticKeys head =
          fathom::make_synthetic_keys(fathom::study_head_spec(workload, l * out.kv_heads + g));
      std::transform(head.keys.begin(), head.keys.end(), std::back_inserter(k), bf16_to_float);
      std::transform(head.values.begin(), head.values.end(), std::back_inserter(v), bf16_to_float);
      // Step s, query heads g * group .. : the test steps, then the calibration queries.
      for (int s = 0; s < out.steps; ++s) {
        const float* from = s < workload.steps
                                ? head.query(s)
                                : head.calibration_queries.data() +
                                      static_cast<std::size_t>(s - workload.steps) * group_values;
        std::copy_n(
            from, group_values,
            q.begin() + static_cast<std::ptrdiff_t>(
                            (static_cast<std::size_t>(s) * out.kv_heads + g) * group_values));
      }
    }
    const auto name = [&](const char* t) { return dir / fmt::format("layers.{}.{}.npy", l, t); };
    const std::vector<std::int64_t> kv_shape{out.kv_heads, out.tokens, out.head_dim};
    write_npy(name("k"), NpyType::bf16, kv_shape, k);
    write_npy(name("v"), NpyType::bf16, kv_shape, v);
    write_npy(name("q"), NpyType::f32, {out.steps, out.q_heads, out.head_dim}, q);
    for (const char* t : {"k", "v", "q"}) out.bytes += std::filesystem::file_size(name(t));
  }
  return out;
}

}  // namespace hisparse
