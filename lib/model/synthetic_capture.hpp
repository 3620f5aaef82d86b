// Synthetic captures: the Fathom quality study's key generator (fathom::make_synthetic_keys:
// spread channel variances, outliers, sinks, recency, planted relevant tokens, drifting queries)
// written out in the capture format of model/replay_capture.hpp for a GQA model's shape. A decode
// scenario then replays attention as realistic as the study's (workload.generator: replay), which
// the engine's own synthetic workload is not: it concentrates attention on so few tokens that
// every selection method's attention error is about 1e-4.
//
// KV head g of layer l is study head i = l * kv_heads + g, seeded as `quality --kv-heads` seeds
// its heads (fathom::study_head_spec). The queries are the test steps first, then the held-out
// calibration queries (fresh content at random earlier positions, not aligned with the planted
// tokens): decode step s < steps replays test query s, and `quality --scenario` on a scenario
// that replays the capture with warmup + decode steps = steps holds out exactly the calibration
// queries, so it is the synthetic study of layers x kv_heads heads, row for row.
#pragma once

#include <cstdint>
#include <filesystem>

#include "fathom/synthetic_keys.hpp"
#include "model/model_spec.hpp"

namespace hisparse {

struct SyntheticCaptureSummary {
  int layers = 0, kv_heads = 0, q_heads = 0, head_dim = 0;
  std::int64_t tokens = 0;
  int steps = 0;            ///< query steps written: the test steps, then the calibration queries
  std::uint64_t bytes = 0;  ///< of the files written
};

/// Writes layers.L.k.npy and layers.L.v.npy ([kv_heads, tokens, head_dim], bf16 bits) and
/// layers.L.q.npy ([steps + calibration_queries, q_heads, head_dim], f32) for every layer of
/// `model` into `dir` (created; existing files of these names are replaced). `workload.channels`
/// and `.heads` are taken from the model. Throws Error naming `setting` for an MLA model or a
/// folder that cannot be created.
SyntheticCaptureSummary write_synthetic_capture(const std::filesystem::path& dir,
                                                const ModelSpec& model,
                                                fathom::SyntheticKeySpec workload,
                                                const std::string& setting);

}  // namespace hisparse
